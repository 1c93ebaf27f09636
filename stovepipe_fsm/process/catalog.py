"""The registries the shipped machines are checked against, and their compiled form.

``REGISTRIES`` maps a machine name to the built-in Python callables its YAML may name.
It is read-only: a policy is loaded by :func:`load_policy`, which copies it (and the
invariant catalogue) and adds what the policy's plugins register (:mod:`.plugins`), so no
policy sees another's names.
:func:`load_process_machines` compiles a policy and refuses anything that does not pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..located.errors import SpecError, SpecIssue
from ..located.yaml_source import parse_yaml
from ..machine.compiler import CompiledFlow, CompiledLifecycle
from ..machine.invariants import INVARIANTS, InvariantCatalog
from ..machine.lint import lint_machine
from ..machine.loader import LoadedPolicy, parse_machine
from ..machine.loader import check_policy as check_spec_policy
from ..machine.loader import load_policy as load_spec_policy
from ..machine.model import MachineSpec, ParameterSpec
from ..machine.parameters import declared_parameters, defaults_of
from ..machine.plugin_calls import StepWatch
from ..machine.plugins import policy_registries
from ..machine.registry import Registry
from .culprit import CULPRIT
from .gate import GATE
from .plugins import PluginRegistry
from .roles import PREEMPT, REQUEST_ROLES, RequestRoles

REQUEST = Registry("request", kind="lifecycle", roles=REQUEST_ROLES, outcomes=True)

REGISTRIES: Mapping[str, Registry] = MappingProxyType(
    {"request": REQUEST, "queue_gate": GATE, "culprit": CULPRIT}
)

DEFAULT_MACHINES_DIR = Path("machines")

#: Gate actions that fire an optional role of the request machine: a gate naming one is
#: refused at load when the request machine does not declare the role.
ACTIONS_NEEDING_ROLES: Mapping[str, str] = MappingProxyType({"preempt_older_builds": PREEMPT})


@dataclass(frozen=True)
class ProcessMachines:
    """The compiled machines the process stage runs on (the culprit search only when the
    policy declares ``culprit.yaml``), the request's roles, the invariants the policy may
    declare (the shipped ones and its plugins'), and the source of each plugin module as
    it was imported (:class:`~..machine.plugins.PolicyVocabulary`)."""

    request: CompiledLifecycle
    queue_gate: CompiledFlow
    roles: RequestRoles
    parameters: Mapping[str, ParameterSpec]
    invariants: InvariantCatalog = INVARIANTS
    plugin_sources: Mapping[str, bytes] = field(default_factory=dict)
    plugin_files: tuple[Path, ...] = ()
    culprit: CompiledFlow | None = None

    @classmethod
    def from_specs(
        cls,
        specs: Mapping[str, MachineSpec],
        registries: Mapping[str, Registry] = REGISTRIES,
        invariants: InvariantCatalog = INVARIANTS,
        *,
        plugin_sources: Mapping[str, bytes] | None = None,
        plugin_files: tuple[Path, ...] = (),
    ) -> ProcessMachines:
        watch = StepWatch()  # one budget and one set of counters for every plugin step
        return cls(
            request=CompiledLifecycle(specs["request"], registries["request"], watch=watch),
            queue_gate=CompiledFlow(specs["queue_gate"], registries["queue_gate"], watch=watch),
            roles=RequestRoles.from_spec(specs["request"]),
            parameters=declared_parameters(specs.values()),
            invariants=invariants,
            plugin_sources=dict(plugin_sources or {}),
            plugin_files=plugin_files,
            culprit=(
                CompiledFlow(specs["culprit"], registries["culprit"], watch=watch)
                if "culprit" in specs
                else None
            ),
        )

    @cached_property
    def parameter_defaults(self) -> Mapping[str, Any]:
        """Each declared parameter's default: what a queue gets that config leaves unset."""
        return MappingProxyType(defaults_of(self.parameters))

    @cached_property
    def coalesces(self) -> bool:
        """The gate supersedes heads (some transition runs ``supersede``): only the
        newest head is validated, so a retry of an older one would move validation
        backwards. A gate that never supersedes validates every head."""
        return any(
            ref.name == "supersede"
            for t in self.queue_gate.spec.transitions
            for ref in (*t.before, *t.after)
        )

    @property
    def registries(self) -> dict[str, Registry]:
        """The registries the machines were compiled against (built-ins and plugins)."""
        found = {"request": self.request.registry, "queue_gate": self.queue_gate.registry}
        if self.culprit is not None:
            found["culprit"] = self.culprit.registry
        return found


def load_policy(directory: str | Path = DEFAULT_MACHINES_DIR, *, lint: bool = True) -> LoadedPolicy:
    """Read, check and lint the machines of ``directory`` with the plugins they list."""
    policy = load_spec_policy(directory, REGISTRIES, PluginRegistry, lint=lint)
    if lint and (issues := role_use_issues(policy.specs.values())):
        raise SpecError(issues)
    return policy


def role_use_issues(specs: Iterable[MachineSpec]) -> list[SpecIssue]:
    """Each gate action (:data:`ACTIONS_NEEDING_ROLES`) that fires a role the request
    machine of the same policy does not declare, at the action's name."""
    by_name = {spec.name: spec for spec in specs}
    gate, request = by_name.get("queue_gate"), by_name.get("request")
    if gate is None or request is None:
        return []
    declared = {role.role for role in request.roles}
    return [
        SpecIssue(
            ref.location,
            f"action {ref.name!r} fires the request machine's role {role!r}, which "
            f"{request.file} does not declare: declare it under 'roles:' (docs/machines.md, "
            "Roles and outcomes) or remove the action",
            "missing-role",
        )
        for t in gate.transitions
        for ref in (*t.before, *t.after)
        if (role := ACTIONS_NEEDING_ROLES.get(ref.name)) is not None and role not in declared
    ]


def check_policy(
    paths: Sequence[str | Path], *, policy_dir: Path | None
) -> tuple[list[MachineSpec], list[SpecIssue]]:
    """Every issue of machine files that form one policy (for ``validate``)."""
    specs, _, issues = check_spec_policy(paths, REGISTRIES, PluginRegistry, policy_dir=policy_dir)
    return specs, issues + role_use_issues(specs)


def load_process_machines(
    directory: str | Path = DEFAULT_MACHINES_DIR, *, lint: bool = True
) -> ProcessMachines:
    """Load, lint and compile ``request.yaml`` and ``queue_gate.yaml`` from ``directory``,
    with the plugins they list.

    ``lint=False`` exists for the model checker's mutation tests, which must be able to
    run a machine lint would reject to show the checker catches it independently.
    """
    policy = load_policy(directory, lint=lint)
    return ProcessMachines.from_specs(
        policy.specs,
        policy.registries,
        policy.invariants,
        plugin_sources=policy.plugin_sources,
        plugin_files=policy.plugin_files,
    )


def compile_request_machine(source: str, file: str = "request.yaml") -> CompiledLifecycle:
    """The request machine whose YAML text is ``source``: parsed, linted and compiled as
    :func:`load_process_machines` does, with the plugins it lists.

    For a process that runs the machine another process recorded (the operator verbs
    take the one the service records). ``SpecError`` when the text does not load.
    """
    spec = parse_machine(parse_yaml(source, file))
    vocabulary = policy_registries(REGISTRIES, spec.plugins, PluginRegistry, policy_dir=None)
    issues = [
        *vocabulary.issues,
        *lint_machine(spec, vocabulary.registries, invariants=vocabulary.invariants),
    ]
    if issues:
        raise SpecError(issues)
    return CompiledLifecycle(spec, vocabulary.registries["request"])

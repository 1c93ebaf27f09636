"""Machine files: YAML → JSON Schema → :class:`MachineSpec` → lint.

Loading never stops at the first problem: syntax problems end parsing, but every schema
issue is reported together, and every lint issue is reported together. A caller that
gets a :class:`MachineSpec` back can compile it; anything else raises
:class:`SpecError` carrying all the issues with their ``file:line:column``.

A *policy* is the machine files of one directory: :func:`load_policy` and
:func:`check_policy` read them all, load the plugins they list (:mod:`.plugins`) into
registries and an invariant catalogue of the policy's own, and lint every file against
those. When a plugin fails to load, the names it would have registered are not reported
again as unknown: the plugin's own issue says what to fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..located.errors import SpecError, SpecIssue
from ..located.schema import schema_issues
from ..located.yaml_source import JsonPath, SourceDocument, read_yaml
from .invariants import INVARIANTS, InvariantCatalog, repeated_invariants
from .lint import DUPLICATE_INVARIANT, UNKNOWN_INVARIANT, UNREGISTERED, lint_machine
from .model import (
    INVARIANT_QUEUES,
    LIFECYCLE,
    InvariantParameter,
    InvariantRef,
    MachineSpec,
    NameRef,
    OutcomeSpec,
    ParameterSpec,
    RoleSpec,
    StateSpec,
    TransitionSpec,
)
from .parameters import clash_issues
from .plugins import ApiFactory, PolicyVocabulary, policy_registries
from .registry import Registry

MACHINE_FILES = ("request.yaml", "queue_gate.yaml", "culprit.yaml")
#: Machine files a policy may leave out: without ``culprit.yaml`` no search is ever made.
OPTIONAL_MACHINE_FILES = frozenset({"culprit.yaml"})


def present_machine_files(directory: str | Path, files: Iterable[str] = MACHINE_FILES) -> list[str]:
    """``files`` less the optional ones ``directory`` does not hold."""
    return [
        name
        for name in files
        if name not in OPTIONAL_MACHINE_FILES or (Path(directory) / name).exists()
    ]


def parse_machine(doc: SourceDocument) -> MachineSpec:
    """Build a spec from a parsed document, raising on schema violations."""
    issues = schema_issues(doc, "machine")
    if issues:
        raise SpecError(issues)
    data: dict[str, Any] = doc.data
    states = tuple(_state(doc, item, ("states", i)) for i, item in enumerate(data["states"]))
    all_states = tuple(s.name for s in states)
    transitions = tuple(
        _transition(doc, item, i, all_states) for i, item in enumerate(data["transitions"])
    )
    return MachineSpec(
        name=data["name"],
        kind=data.get("kind", LIFECYCLE),
        initial=NameRef(data["initial"], doc.locate(("initial",))),
        states=states,
        transitions=transitions,
        file=doc.file,
        description=data.get("description", ""),
        location=doc.locate(()),
        kind_location=doc.locate(("kind",)) if "kind" in data else None,
        roles=tuple(
            RoleSpec(
                role,
                NameRef(trigger, doc.locate(("roles", role))),
                doc.locate(("roles", role), key=True),
            )
            for role, trigger in data.get("roles", {}).items()
        ),
        roles_location=doc.locate(("roles",), key=True) if "roles" in data else None,
        outcomes=tuple(
            _outcome(doc, name, body) for name, body in data.get("outcomes", {}).items()
        ),
        outcomes_location=doc.locate(("outcomes",), key=True) if "outcomes" in data else None,
        parameters=tuple(
            _parameter(doc, name, body) for name, body in data.get("parameters", {}).items()
        ),
        invariants=tuple(
            _invariant(doc, item, ("invariants", i))
            for i, item in enumerate(data.get("invariants", ()))
        ),
        invariants_location=(
            doc.locate(("invariants",), key=True) if "invariants" in data else None
        ),
        plugins=_names(doc, data.get("plugins"), ("plugins",)),
        source=doc.text,
    )


def _invariant(doc: SourceDocument, item: str | dict[str, Any], path: JsonPath) -> InvariantRef:
    """A bare name, or ``{name: ..., queues: [...], <parameter>: <value>, ...}``."""
    if isinstance(item, str):
        return InvariantRef(item, doc.locate(path))
    return InvariantRef(
        item["name"],
        doc.locate((*path, "name")),
        tuple(
            InvariantParameter(
                key, value, doc.locate((*path, key), key=True), doc.locate((*path, key))
            )
            for key, value in item.items()
            if key not in ("name", INVARIANT_QUEUES)
        ),
        tuple(
            NameRef(pattern, doc.locate((*path, INVARIANT_QUEUES, i)))
            for i, pattern in enumerate(item.get(INVARIANT_QUEUES, ()))
        ),
    )


def _parameter(doc: SourceDocument, name: str, body: dict[str, Any]) -> ParameterSpec:
    schema = tuple(
        (key, _freeze(value))
        for key, value in body.items()
        if key not in ("default", "description")
    )
    return ParameterSpec(
        name=name,
        schema=schema,
        default=_freeze_value(body["default"]),
        description=body["description"],
        location=doc.locate(("parameters", name), key=True),
        default_location=doc.locate(("parameters", name, "default")),
    )


def _freeze(value: Any) -> Any:
    """A declaration value, hashable: mappings become sorted (key, value) tuples."""
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def _freeze_value(value: Any) -> Any:
    """A parameter value, hashable: lists become tuples."""
    if isinstance(value, list):
        return tuple(_freeze_value(v) for v in value)
    return value


def _outcome(doc: SourceDocument, name: str, body: dict[str, Any]) -> OutcomeSpec:
    return OutcomeSpec(
        name=name,
        trigger=NameRef(body["trigger"], doc.locate(("outcomes", name, "trigger"))),
        location=doc.locate(("outcomes", name), key=True),
        green=bool(body.get("green", False)),
        description=body.get("description", ""),
        red=bool(body.get("red", False)),
    )


def _state(doc: SourceDocument, item: str | dict[str, Any], path: JsonPath) -> StateSpec:
    if isinstance(item, str):
        return StateSpec(name=item, location=doc.locate(path))
    return StateSpec(
        name=item["name"],
        location=doc.locate((*path, "name")),
        terminal=bool(item.get("terminal", False)),
        holds_slot=bool(item.get("holds_slot", False)),
        description=item.get("description", ""),
    )


def _names(doc: SourceDocument, value: Any, path: JsonPath) -> tuple[NameRef, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (NameRef(value, doc.locate(path)),)
    return tuple(NameRef(v, doc.locate((*path, i))) for i, v in enumerate(value))


def _transition(
    doc: SourceDocument, item: dict[str, Any], index: int, all_states: tuple[str, ...]
) -> TransitionSpec:
    path: JsonPath = ("transitions", index)
    source = item["source"]
    wildcard = source == "*"
    if wildcard:
        where = doc.locate((*path, "source"))
        sources = tuple(NameRef(s, where) for s in all_states)
    else:
        sources = _names(doc, source, (*path, "source"))
    return TransitionSpec(
        index=index,
        trigger=item["trigger"],
        sources=sources,
        dest=NameRef(item["dest"], doc.locate((*path, "dest"))),
        location=doc.locate(path),
        conditions=_names(doc, item.get("conditions"), (*path, "conditions")),
        unless=_names(doc, item.get("unless"), (*path, "unless")),
        before=_names(doc, item.get("before"), (*path, "before")),
        after=_names(doc, item.get("after"), (*path, "after")),
        description=item.get("description", ""),
        wildcard_source=wildcard,
    )


def load_machine(
    path: str | Path,
    registries: Mapping[str, Registry] | None = None,
    *,
    lint: bool = True,
    display_name: str | None = None,
) -> MachineSpec:
    """Read, schema-check and (by default) lint one machine file."""
    spec = parse_machine(read_yaml(path, display_name=display_name))
    if lint:
        issues = lint_machine(spec, registries)
        if issues:
            raise SpecError(issues)
    return spec


def load_machine_dir(
    directory: str | Path,
    registries: Mapping[str, Registry] | None = None,
    *,
    lint: bool = True,
    files: Iterable[str] = MACHINE_FILES,
) -> dict[str, MachineSpec]:
    """Load the machines the process stage needs, keyed by machine name.

    All files are read before raising so one run reports the problems of all of them.
    """
    specs: list[MachineSpec] = []
    issues: list[SpecIssue] = []
    for filename in present_machine_files(directory, files):
        try:
            specs.append(load_machine(Path(directory) / filename, registries, lint=lint))
        except SpecError as exc:
            issues.extend(exc.issues)
    return _by_name(specs, issues, lint=lint)


def _by_name(
    specs: Iterable[MachineSpec], issues: list[SpecIssue], *, lint: bool
) -> dict[str, MachineSpec]:
    """The machines by name, raising with ``issues`` and what only a policy's machines
    together get wrong (a name used twice, :func:`across_machines`)."""
    by_name: dict[str, MachineSpec] = {}
    for spec in specs:
        if spec.name in by_name:
            first = by_name[spec.name].file
            issues.append(
                SpecIssue(
                    spec.location,
                    f"machine name {spec.name!r} is already used by {first}; names must be unique",
                    "duplicate-machine",
                )
            )
            continue
        by_name[spec.name] = spec
    issues += across_machines(by_name.values(), lint=lint)
    if issues:
        raise SpecError(issues)
    return by_name


@dataclass(frozen=True)
class LoadedPolicy:
    """The machines of one policy, keyed by name, and the registries and invariant
    catalogue they were checked against: the built-in ones plus what this policy's
    plugins registered."""

    specs: dict[str, MachineSpec]
    registries: dict[str, Registry]
    invariants: InvariantCatalog = INVARIANTS
    plugin_sources: Mapping[str, bytes] = field(default_factory=dict)
    plugin_files: tuple[Path, ...] = ()


def check_policy(
    paths: Sequence[str | Path],
    builtins: Mapping[str, Registry],
    api: ApiFactory,
    *,
    policy_dir: Path | None,
    lint: bool = True,
) -> tuple[list[MachineSpec], PolicyVocabulary, list[SpecIssue]]:
    """Every issue of the machine files of one policy, without raising.

    Each file is parsed and schema-checked, the plugins listed by all of them (and the
    installed ones) are loaded into the policy's vocabulary, and each file is linted
    against it. A file that does not parse contributes its issues and no plugins.
    """
    specs: list[MachineSpec] = []
    issues: list[SpecIssue] = []
    for path in paths:
        try:
            specs.append(parse_machine(read_yaml(path)))
        except SpecError as exc:
            issues.extend(exc.issues)
    refs = [ref for spec in specs for ref in spec.plugins]
    vocabulary = policy_registries(builtins, refs, api, policy_dir=policy_dir)
    issues += vocabulary.issues
    if lint:
        follow_on = {UNREGISTERED, UNKNOWN_INVARIANT} if vocabulary.failed_plugins else set()
        for spec in specs:
            found = lint_machine(spec, vocabulary.registries, invariants=vocabulary.invariants)
            issues += [issue for issue in found if issue.rule not in follow_on]
    order = {str(path): index for index, path in enumerate(paths)}  # issues file by file
    issues.sort(key=lambda issue: order.get(issue.location.file, len(order)))
    return specs, vocabulary, issues


def load_policy(
    directory: str | Path,
    builtins: Mapping[str, Registry],
    api: ApiFactory,
    *,
    lint: bool = True,
    files: Iterable[str] = MACHINE_FILES,
) -> LoadedPolicy:
    """Load the machines of ``directory`` with the plugins they list; raise on any issue.

    Plugin problems raise even with ``lint=False``: nothing can run a name that is not
    registered.
    """
    paths = [Path(directory) / filename for filename in present_machine_files(directory, files)]
    # Plugin modules are imported from the directory that holds the machines directory.
    policy_dir = Path(directory).resolve().parent
    specs, vocabulary, issues = check_policy(paths, builtins, api, policy_dir=policy_dir, lint=lint)
    return LoadedPolicy(
        _by_name(specs, issues, lint=lint),
        vocabulary.registries,
        vocabulary.invariants,
        vocabulary.plugin_sources,
        vocabulary.plugin_files,
    )


def across_machines(specs: Iterable[MachineSpec], *, lint: bool = True) -> list[SpecIssue]:
    """What only the machines of a policy together can get wrong: a parameter declared
    differently by two of them, an invariant declared by both."""
    specs = list(specs)
    issues = list(clash_issues(specs))
    if lint:
        issues += repeated_invariants(specs, DUPLICATE_INVARIANT)
    return issues

"""The registries the shipped machines are checked against, and their compiled form.

``REGISTRIES`` maps a machine name to the Python callables its YAML may name; the
``validate`` command lints machine files against it, and :func:`load_process_machines`
refuses to compile anything that does not pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..spec.compiler import CompiledFlow, CompiledLifecycle
from ..spec.loader import load_machine_dir
from ..spec.model import MachineSpec, ParameterSpec
from ..spec.parameters import declared_parameters, defaults_of
from ..spec.registry import Registry
from .gate import GATE
from .roles import REQUEST_ROLES, RequestRoles

REQUEST = Registry("request", kind="lifecycle", roles=REQUEST_ROLES, outcomes=True)

REGISTRIES: dict[str, Registry] = {"request": REQUEST, "queue_gate": GATE}

DEFAULT_MACHINES_DIR = Path("machines")


@dataclass(frozen=True)
class ProcessMachines:
    """The two compiled machines the process stage runs on, and the request's roles."""

    request: CompiledLifecycle
    queue_gate: CompiledFlow
    roles: RequestRoles
    parameters: Mapping[str, ParameterSpec]

    @classmethod
    def from_specs(cls, specs: dict[str, MachineSpec]) -> ProcessMachines:
        return cls(
            request=CompiledLifecycle(specs["request"], REQUEST),
            queue_gate=CompiledFlow(specs["queue_gate"], GATE),
            roles=RequestRoles.from_spec(specs["request"]),
            parameters=declared_parameters(specs.values()),
        )

    @property
    def parameter_defaults(self) -> dict[str, Any]:
        """Each declared parameter's default: what a queue gets that config leaves unset."""
        return defaults_of(self.parameters)


def load_process_machines(
    directory: str | Path = DEFAULT_MACHINES_DIR, *, lint: bool = True
) -> ProcessMachines:
    """Load, lint and compile ``request.yaml`` and ``queue_gate.yaml`` from ``directory``.

    ``lint=False`` exists for the model checker's mutation tests, which must be able to
    run a machine lint would reject to show the checker catches it independently.
    """
    return ProcessMachines.from_specs(load_machine_dir(directory, REGISTRIES, lint=lint))

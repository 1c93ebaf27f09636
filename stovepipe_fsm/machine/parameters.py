"""Parameters: the typed per-queue knobs a policy's machines declare.

A machine file's ``parameters:`` block names each knob, its JSON type and bounds, its
default and what it does. ``config/queues.yaml`` may set exactly these (plus the
runtime's own keys) per queue and per glob; a registered condition or action says which
parameters it reads. Lint holds the three together:

- ``parameter-default``     a declared default that its own declaration refuses
- ``undeclared-parameter``  a condition or action the machine uses reads a parameter the
                            machine does not declare
- ``parameter-clash``       (across the machines of one policy) two machines declare one
                            name differently, or a name is one of the runtime's own keys
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from jsonschema import Draft202012Validator

from ..domain.entities import RUNTIME_KEYS
from ..located.errors import SpecIssue
from .model import MachineSpec, NameRef, ParameterSpec
from .registry import ActionInfo, ConditionInfo, Registry


def as_json(value: Any) -> Any:
    """A stored (hashable) value as JSON sees it: tuples are arrays."""
    if isinstance(value, tuple):
        return [as_json(v) for v in value]
    return value


def value_problems(parameter: ParameterSpec, value: Any) -> list[str]:
    """Why ``value`` is not a valid value of ``parameter`` (empty when it is)."""
    validator = Draft202012Validator(parameter.value_schema())
    return [error.message for error in validator.iter_errors(as_json(value))]


def parameter_issues(spec: MachineSpec, registry: Registry | None) -> Iterator[SpecIssue]:
    """Invalid defaults, and parameters read by used callables but not declared."""
    for parameter in spec.parameters:
        for problem in value_problems(parameter, parameter.default):
            yield SpecIssue(
                parameter.default_location,
                f"default of parameter {parameter.name!r} does not fit its declaration: {problem}",
                "parameter-default",
            )
    if registry is None:
        return
    declared = {p.name for p in spec.parameters}
    reported: set[tuple[str, str]] = set()
    for t in spec.transitions:
        uses: list[tuple[NameRef, Mapping[str, ConditionInfo | ActionInfo]]] = [
            *((ref, registry.conditions) for ref in t.conditions + t.unless),
            *((ref, registry.actions) for ref in t.actions),
        ]
        for ref, registered in uses:
            info = registered.get(ref.name)
            needed = info.parameters if info else frozenset()
            for name in sorted(needed - declared):
                if (ref.name, name) in reported:
                    continue
                reported.add((ref.name, name))
                yield SpecIssue(
                    ref.location,
                    f"{ref.name!r} reads parameter {name!r}, which machine {spec.name!r} "
                    f"does not declare; declared parameters: "
                    f"{', '.join(sorted(declared)) or 'none'}",
                    "undeclared-parameter",
                )


def clash_issues(specs: Iterable[MachineSpec]) -> Iterator[SpecIssue]:
    """Parameters declared differently by two machines, or named like a runtime key."""
    seen: dict[str, tuple[ParameterSpec, str]] = {}
    for spec in specs:
        for parameter in spec.parameters:
            if parameter.name in RUNTIME_KEYS:
                yield SpecIssue(
                    parameter.location,
                    f"parameter {parameter.name!r} is one of the runtime's own keys "
                    f"({', '.join(RUNTIME_KEYS)}); choose another name",
                    "parameter-clash",
                )
                continue
            first = seen.get(parameter.name)
            if first is None:
                seen[parameter.name] = (parameter, spec.file)
            elif (first[0].schema, first[0].default) != (parameter.schema, parameter.default):
                yield SpecIssue(
                    parameter.location,
                    f"parameter {parameter.name!r} is declared differently in {first[1]}; "
                    "one policy has one declaration per parameter",
                    "parameter-clash",
                )


def declared_parameters(specs: Iterable[MachineSpec]) -> dict[str, ParameterSpec]:
    """Every parameter of a policy's machines, by name (first declaration wins)."""
    found: dict[str, ParameterSpec] = {}
    for spec in specs:
        for parameter in spec.parameters:
            found.setdefault(parameter.name, parameter)
    return found


def defaults_of(parameters: Mapping[str, ParameterSpec]) -> dict[str, Any]:
    return {name: p.default for name, p in parameters.items()}

"""The in-memory form of a machine file: plain frozen values with source locations.

A :class:`MachineSpec` is what the loader produces after the schema accepted the file,
what lint inspects, what the compiler turns into a ``transitions`` machine, and what the
diagram writer draws. Every name carries the location it was written at, so every later
complaint can point at the YAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..located.errors import Location

LIFECYCLE = "lifecycle"
FLOW = "flow"
#: A flow run once per ended build for a queue's culprit search (machines/culprit.yaml).
SEARCH = "search"
#: The kinds the driver advances state by state to a terminal state.
FLOW_KINDS = (FLOW, SEARCH)
#: The key of an ``invariants:`` entry that scopes it to queue names and patterns.
INVARIANT_QUEUES = "queues"


@dataclass(frozen=True)
class NameRef:
    """A state, condition, action or plugin name as written, with where it was written."""

    name: str
    location: Location


@dataclass(frozen=True)
class StateSpec:
    name: str
    location: Location
    terminal: bool = False
    holds_slot: bool = False
    description: str = ""


@dataclass(frozen=True)
class TransitionSpec:
    """One transition entry; ``sources`` is already expanded from '*' or a list."""

    index: int
    trigger: str
    sources: tuple[NameRef, ...]
    dest: NameRef
    location: Location
    conditions: tuple[NameRef, ...] = ()
    unless: tuple[NameRef, ...] = ()
    before: tuple[NameRef, ...] = ()
    after: tuple[NameRef, ...] = ()
    description: str = ""
    wildcard_source: bool = False

    @property
    def actions(self) -> tuple[NameRef, ...]:
        """Actions in execution order: ``before`` ones, then ``after`` ones."""
        return self.before + self.after

    @property
    def source_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sources)


@dataclass(frozen=True)
class RoleSpec:
    """``roles: {role: trigger}``: the trigger that plays a role the runtime relies on."""

    role: str
    trigger: NameRef
    location: Location


@dataclass(frozen=True)
class OutcomeSpec:
    """``outcomes: {name: {trigger, green}}``: a build outcome and the trigger it fires."""

    name: str
    trigger: NameRef
    location: Location
    green: bool = False
    description: str = ""
    red: bool = False


@dataclass(frozen=True)
class ParameterSpec:
    """``parameters: {name: {type, default, description, ...}}``: one typed policy knob.

    ``schema`` is the declaration as JSON Schema for the value (``type`` and bounds);
    config/queues.yaml values are validated against it.
    """

    name: str
    schema: tuple[tuple[str, object], ...]
    default: object
    description: str
    location: Location
    default_location: Location

    def value_schema(self) -> dict[str, object]:
        return {key: _thaw(value) for key, value in self.schema}


def _thaw(value: object) -> object:
    if isinstance(value, tuple):
        return {k: _thaw(v) for k, v in value}
    return value


@dataclass(frozen=True)
class InvariantParameter:
    """One parameter of an invariant declaration: its value, where its key and value are."""

    name: str
    value: Any
    location: Location
    value_location: Location


@dataclass(frozen=True)
class InvariantRef:
    """An entry of ``invariants:``: a catalogue name, where it is written, its parameters,
    and the queues it is held to.

    ``queues`` are queue names or ``*`` patterns (as in ``config/queues.yaml``); empty:
    every queue. ``check`` proves the invariant only for a queue one of them matches, so
    one policy can promise coalescing on some queues and not on others.
    """

    name: str
    location: Location
    parameters: tuple[InvariantParameter, ...] = ()
    queues: tuple[NameRef, ...] = ()

    @property
    def values(self) -> dict[str, Any]:
        return {p.name: p.value for p in self.parameters}

    @property
    def queue_patterns(self) -> tuple[str, ...]:
        return tuple(q.name for q in self.queues)


@dataclass(frozen=True)
class MachineSpec:
    name: str
    kind: str
    initial: NameRef
    states: tuple[StateSpec, ...]
    transitions: tuple[TransitionSpec, ...]
    file: str
    description: str = ""
    location: Location = field(default_factory=lambda: Location("<memory>", 1, 1))
    kind_location: Location | None = None
    roles: tuple[RoleSpec, ...] = ()
    roles_location: Location | None = None
    outcomes: tuple[OutcomeSpec, ...] = ()
    outcomes_location: Location | None = None
    parameters: tuple[ParameterSpec, ...] = ()
    invariants: tuple[InvariantRef, ...] = ()
    invariants_location: Location | None = None
    # ``plugins:``: modules adding conditions and actions (see :mod:`.plugins`), each
    # located at its list item so a plugin that fails is reported where it is named.
    plugins: tuple[NameRef, ...] = ()
    #: The YAML text the spec was read from ("" for one built in code): what the service
    #: records so that operator commands run the very machine it runs.
    source: str = field(default="", compare=False, repr=False)

    @cached_property
    def state_map(self) -> dict[str, StateSpec]:
        return {s.name: s for s in self.states}

    @cached_property
    def state_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.states)

    @property
    def terminal_states(self) -> frozenset[str]:
        return frozenset(s.name for s in self.states if s.terminal)

    @property
    def slot_states(self) -> frozenset[str]:
        return frozenset(s.name for s in self.states if s.holds_slot)

    @property
    def triggers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.trigger for t in self.transitions))

    def role_trigger(self, role: str) -> str | None:
        """The trigger declared for ``role``, or ``None``."""
        return next((r.trigger.name for r in self.roles if r.role == role), None)

    def outgoing(self, state: str) -> tuple[TransitionSpec, ...]:
        return tuple(t for t in self.transitions if state in t.source_names)

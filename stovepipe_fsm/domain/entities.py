"""Entities: immutable snapshots written whole under compare-and-set.

Callers never mutate an entity; they build the next snapshot with :func:`evolve` (or
``dataclasses.replace``) and hand it to a store's ``update(entity, old, new)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

_E = TypeVar("_E")

#: ``newer(a, b)``: whether request id ``a`` is newer than ``b`` in ingest order.
GreenOrder = Callable[[str, str], bool]

NO_STRATEGY = ""
FULL = "full"
INCREMENTAL_SINCE_GREEN = "incremental_since_green"
BUILD_STRATEGIES = (NO_STRATEGY, FULL, INCREMENTAL_SINCE_GREEN)


@dataclass(frozen=True)
class Request:
    """One ingested trunk head of one queue.

    ``state`` is a state of ``machines/request.yaml``. ``build_strategy`` and
    ``base_uri`` are set by the admit transition and never change afterwards.
    ``superseded_by`` names the newer request that made this one stale (superseded, or
    its running build preempted by a policy with the ``preempt`` role); ``retry_of``
    names the request an operator's ``retry`` (or ``dlq replay``) made this one again
    for (same commit), so a repeated retry finds it instead of making another.
    ``probe_of`` marks a *probe*: a build of a blamelist commit that a culprit search
    started for the red head it names; a probe is never a trunk head (it takes no build
    slot, never moves latest or last green by itself, and is never coalesced). The times
    (milliseconds of the clock port; 0 = not yet, or written by a release that did not
    record it) say when the head was ingested, admitted and ended.
    """

    id: str
    queue: str
    uri: str
    state: str
    build_strategy: str = NO_STRATEGY
    base_uri: str = ""
    superseded_by: str = ""
    version: int = 1
    ingested_at_ms: int = 0
    admitted_at_ms: int = 0
    ended_at_ms: int = 0
    retry_of: str = ""
    probe_of: str = ""

    def without_times(self) -> Request:
        """This snapshot with its times cleared: what a state comparison should see."""
        return evolve(self, ingested_at_ms=0, admitted_at_ms=0, ended_at_ms=0)

    def with_version(self, version: int) -> Request:
        """This snapshot as written under ``version``."""
        return evolve(self, version=version)


#: The most recent greens a queue row may keep (the ``recent_greens`` parameter's maximum).
MAX_RECENT_GREENS = 64


@dataclass(frozen=True)
class Green:
    """One recorded green of a queue: the commit, the request that validated it, and when
    that request ended (milliseconds of the clock port; 0 = not recorded)."""

    uri: str
    request_id: str
    at_ms: int = 0


@dataclass(frozen=True)
class Queue:
    """Runtime coordination row of one queue.

    ``slot_holders`` are the ids of the requests holding a build slot; the seed's
    ``in_flight_count`` is their number. Holding ids rather than a bare counter makes
    claim and release idempotent per request, so no crash point can leak or
    double-count a slot.

    ``leases`` (sorted by holder) give the holders claimed under a
    ``max_validation_ms`` the time their slot expires, as ``(holder, expires_at_ms)``
    pairs; a holder without one never expires. ``serial_holder`` names the holder
    admitted as a rewrite (its head does not descend from last green), which runs
    alone: both are written with the claim, in the same compare-and-set, and dropped
    with the slot.

    ``partition`` names which of the broker's process streams carries the queue's work:
    0 unless the service moved the queue to another one, which it does only when the
    queue's stream refused the queue a consumer (the broker caps the consumers of each
    stream). Set once, by compare-and-set, before the queue has a consumer; every other
    writer carries it over unchanged.
    """

    name: str
    last_green_uri: str = ""
    last_green_request_id: str = ""
    latest_request_id: str = ""
    slot_holders: tuple[str, ...] = ()
    leases: tuple[tuple[str, int], ...] = ()
    serial_holder: str = ""
    partition: int = 0
    recent_greens: tuple[Green, ...] = ()
    version: int = 1

    @property
    def greens(self) -> tuple[Green, ...]:
        """The recorded greens, newest first, last green always first (empty: none yet).

        A list that does not start with last green (a row written without the list, or
        one whose last green was set alone) reads as last green alone.
        """
        recent, uri = self.recent_greens, self.last_green_uri
        if recent and (recent[0].uri, recent[0].request_id) == (uri, self.last_green_request_id):
            return recent
        return (Green(uri, self.last_green_request_id),) if uri else ()

    def with_green(self, green: Green, keep: int | None, *, newer: GreenOrder) -> Queue:
        """This row with ``green`` recorded among the newest ``keep`` greens.

        ``newer(a, b)`` says whether request id ``a`` is newer than ``b`` (ingest order).
        Last green moves only to a green newer than it; an older green takes its place in
        the list (or none, beyond ``keep``). A commit is listed once, under its newest
        green. ``keep`` None keeps as many as the row holds (at least one). Recording a
        green already listed leaves the row as it is. Keeping one, no list is written.
        """
        greens = self.greens
        if any(g.request_id == green.request_id for g in greens):
            return self
        if any(g.uri == green.uri and newer(g.request_id, green.request_id) for g in greens):
            return self
        bound = min(MAX_RECENT_GREENS, max(1, len(greens) if keep is None else keep))
        others = [g for g in greens if g.uri != green.uri]
        at = next((i for i, g in enumerate(others) if newer(green.request_id, g.request_id)), None)
        listed = tuple([*others[:at], green, *others[at:]] if at is not None else [*others, green])
        listed = listed[:bound]
        if listed == greens:
            return self
        # Keeping one green, the row is written as before the list existed: last green
        # alone (a release that does not know the list reads it).
        stored = listed if bound > 1 else ()
        head = listed[0]
        if head.request_id != green.request_id:
            return evolve(self, recent_greens=stored)
        return evolve(
            self,
            last_green_uri=head.uri,
            last_green_request_id=head.request_id,
            recent_greens=stored,
        )

    def without_times(self) -> Queue:
        """This row with its greens' times cleared: what a state comparison should see."""
        if not any(g.at_ms for g in self.recent_greens):
            return self
        return evolve(
            self, recent_greens=tuple(Green(g.uri, g.request_id) for g in self.recent_greens)
        )

    @property
    def in_flight_count(self) -> int:
        return len(self.slot_holders)

    def holds(self, request_id: str) -> bool:
        return request_id in self.slot_holders

    def expires_at(self, request_id: str) -> int | None:
        """When ``request_id``'s slot expires (ms), or None when it never does."""
        for holder, expires in self.leases:
            if holder == request_id:
                return expires
        return None

    def is_expired(self, request_id: str, now_ms: int) -> bool:
        """``request_id`` holds a slot whose lease has run out at ``now_ms``."""
        expires = self.expires_at(request_id)
        return expires is not None and expires <= now_ms and self.holds(request_id)

    def expired_holders(self, now_ms: int) -> tuple[str, ...]:
        """The holders whose lease ran out at ``now_ms``: reclaimable."""
        return tuple(h for h in self.slot_holders if self.is_expired(h, now_ms))

    def with_holder(
        self, request_id: str, *, expires_at_ms: int | None = None, serial: bool = False
    ) -> Queue:
        """This row with ``request_id`` holding a slot, its lease and serial mark set.

        A holder claiming again (a redelivery after a crash that followed its claim) is
        marked serial if it now is a rewrite, and a lease it holds is renewed; otherwise
        the row is unchanged.
        """
        if request_id in self.slot_holders:
            row = self
            if serial and self.serial_holder != request_id:
                row = evolve(row, serial_holder=request_id)
            expires = self.expires_at(request_id)
            if expires is not None and expires_at_ms is not None and expires < expires_at_ms:
                row = evolve(row, leases=_with_lease(self.leases, request_id, expires_at_ms))
            return row
        leases = self.leases
        if expires_at_ms is not None:
            leases = _with_lease(leases, request_id, expires_at_ms)
        return evolve(
            self,
            slot_holders=(*self.slot_holders, request_id),
            leases=leases,
            serial_holder=request_id if serial else self.serial_holder,
        )

    def without_holder(self, request_id: str) -> Queue:
        if request_id not in self.slot_holders:
            return self
        return evolve(
            self,
            slot_holders=tuple(h for h in self.slot_holders if h != request_id),
            leases=tuple(lease for lease in self.leases if lease[0] != request_id),
            serial_holder="" if self.serial_holder == request_id else self.serial_holder,
        )

    def with_version(self, version: int) -> Queue:
        return evolve(self, version=version)


def _with_lease(
    leases: tuple[tuple[str, int], ...], request_id: str, expires_at_ms: int
) -> tuple[tuple[str, int], ...]:
    """The leases with ``request_id``'s set, sorted by holder so equal rows compare equal."""
    return tuple(
        sorted(
            (*(lease for lease in leases if lease[0] != request_id), (request_id, expires_at_ms))
        )
    )


@dataclass(frozen=True)
class QueueConfig:
    """One queue's settings, resolved from ``config/queues.yaml`` at gate-check time.

    Two kinds of key: the runtime's own (``max_attempts``, ``repository``, ``ref``:
    what the service needs whatever the policy) and the policy's ``parameters``, whose
    names, types and defaults the machines declare (``max_concurrent``, ...). Parameters
    are kept as sorted ``(name, value)`` pairs with list values as tuples, so a config is
    a hashable value like every other entity.
    """

    max_attempts: int = 5
    repository: str | None = None
    ref: str | None = None
    parameters: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, **values: Any) -> QueueConfig:
        """A config from keyword values: runtime keys by name, the rest as parameters."""
        runtime = {k: values.pop(k) for k in RUNTIME_KEYS if k in values}
        return cls(**runtime, parameters=_pairs(values))

    def runtime_items(self) -> tuple[tuple[str, Any], ...]:
        """The runtime's own keys and their values."""
        return tuple((k, getattr(self, k)) for k in RUNTIME_KEYS)

    def param(self, name: str) -> Any:
        """The value of parameter ``name``; ``KeyError`` naming the known ones if unset."""
        for key, value in self.parameters:
            if key == name:
                return value
        known = ", ".join(k for k, _ in self.parameters) or "none"
        raise KeyError(f"parameter {name!r} is not set for this queue; set: {known}")

    def with_parameters(self, values: Mapping[str, Any]) -> QueueConfig:
        """This config with ``values`` set (replacing parameters of the same name)."""
        if not values:
            return self
        merged = dict(self.parameters)
        merged.update(values)
        return evolve(self, parameters=_pairs(merged))

    def with_values(self, values: Mapping[str, Any]) -> QueueConfig:
        """This config with runtime keys and parameters of ``values`` set."""
        runtime = {k: v for k, v in values.items() if k in RUNTIME_KEYS}
        rest = {k: v for k, v in values.items() if k not in RUNTIME_KEYS}
        return evolve(self, **runtime).with_parameters(rest)


#: The keys config/queues.yaml may set whatever the policy declares.
RUNTIME_KEYS = ("max_attempts", "repository", "ref")


def _pairs(values: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, _hashable(v)) for k, v in values.items()))


def _hashable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    return value


_FIELDS: dict[type, frozenset[str]] = {}


def evolve(entity: _E, /, **changes: Any) -> _E:
    """``entity`` with ``changes``: what ``dataclasses.replace`` returns, made by copying
    the instance dictionary.

    Every decision writes a few new snapshots, and a replay of a long timeline makes
    millions; ``replace`` re-runs ``__init__`` and sets each field through
    ``object.__setattr__``, work a frozen value without checks of its own does not need.
    The entities here have no ``__post_init__`` and no slots, so a copy of the instance
    dictionary with the changed fields makes the same value; any other dataclass goes
    through ``replace``.
    """
    cls = type(entity)
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = _copyable_fields(cls)
    if not names or not names.issuperset(changes):
        return dataclasses.replace(entity, **changes)  # type: ignore[type-var]
    new = object.__new__(cls)
    state = new.__dict__
    state.update(entity.__dict__)
    state.update(changes)
    return new


def _copyable_fields(cls: type) -> frozenset[str]:
    """``cls``'s field names when a dictionary copy is a faithful replace, else empty."""
    if (
        not dataclasses.is_dataclass(cls)
        or hasattr(cls, "__slots__")
        or hasattr(cls, "__post_init__")
    ):
        return frozenset()
    fields = dataclasses.fields(cls)
    if any(not f.init for f in fields):
        return frozenset()
    return frozenset(f.name for f in fields)

"""Entities: immutable snapshots written whole under compare-and-set.

Callers never mutate an entity; they build the next snapshot with
``dataclasses.replace`` and hand it to a store's ``update(entity, old, new)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

NO_STRATEGY = ""
FULL = "full"
INCREMENTAL_SINCE_GREEN = "incremental_since_green"
BUILD_STRATEGIES = (NO_STRATEGY, FULL, INCREMENTAL_SINCE_GREEN)


@dataclass(frozen=True)
class Request:
    """One ingested trunk head of one queue.

    ``state`` is a state of ``machines/request.yaml``. ``build_strategy`` and
    ``base_uri`` are set by the admit transition and never change afterwards.
    ``superseded_by`` names the newer request that made this one stale. The times
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

    def without_times(self) -> Request:
        """This snapshot with its times cleared: what a state comparison should see."""
        return replace(self, ingested_at_ms=0, admitted_at_ms=0, ended_at_ms=0)

    def with_version(self, version: int) -> Request:
        return replace(self, version=version)


@dataclass(frozen=True)
class Queue:
    """Runtime coordination row of one queue.

    ``slot_holders`` are the ids of the requests holding a build slot; the seed's
    ``in_flight_count`` is their number. Holding ids rather than a bare counter makes
    claim and release idempotent per request, so no crash point can leak or
    double-count a slot.
    """

    name: str
    last_green_uri: str = ""
    last_green_request_id: str = ""
    latest_request_id: str = ""
    slot_holders: tuple[str, ...] = ()
    version: int = 1

    @property
    def in_flight_count(self) -> int:
        return len(self.slot_holders)

    def holds(self, request_id: str) -> bool:
        return request_id in self.slot_holders

    def with_holder(self, request_id: str) -> Queue:
        if request_id in self.slot_holders:
            return self
        return replace(self, slot_holders=(*self.slot_holders, request_id))

    def without_holder(self, request_id: str) -> Queue:
        if request_id not in self.slot_holders:
            return self
        return replace(self, slot_holders=tuple(h for h in self.slot_holders if h != request_id))

    def with_version(self, version: int) -> Queue:
        return replace(self, version=version)


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
        return replace(self, parameters=_pairs(merged))

    def with_values(self, values: Mapping[str, Any]) -> QueueConfig:
        """This config with runtime keys and parameters of ``values`` set."""
        runtime = {k: v for k, v in values.items() if k in RUNTIME_KEYS}
        rest = {k: v for k, v in values.items() if k not in RUNTIME_KEYS}
        return replace(self, **runtime).with_parameters(rest)


#: The keys config/queues.yaml may set whatever the policy declares.
RUNTIME_KEYS = ("max_attempts", "repository", "ref")


def _pairs(values: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, _hashable(v)) for k, v in values.items()))


def _hashable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    return value

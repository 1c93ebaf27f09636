"""Entities: immutable snapshots written whole under compare-and-set.

Callers never mutate an entity; they build the next snapshot with
``dataclasses.replace`` and hand it to a store's ``update(entity, old, new)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

NO_STRATEGY = ""
FULL = "full"
INCREMENTAL_SINCE_GREEN = "incremental_since_green"
BUILD_STRATEGIES = (NO_STRATEGY, FULL, INCREMENTAL_SINCE_GREEN)


@dataclass(frozen=True)
class Request:
    """One ingested trunk head of one queue.

    ``state`` is a state of ``machines/request.yaml``. ``build_strategy`` and
    ``base_uri`` are set by the admit transition and never change afterwards.
    ``superseded_by`` names the newer request that made this one stale.
    """

    id: str
    queue: str
    uri: str
    state: str
    build_strategy: str = NO_STRATEGY
    base_uri: str = ""
    superseded_by: str = ""
    version: int = 1

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
    """Per-queue knobs, resolved from ``config/queues.yaml`` at gate-check time."""

    max_concurrent: int = 1
    gate_wait_delay_ms: int = 5000
    max_attempts: int = 5
    repository: str | None = None
    ref: str | None = None

"""The mutable scratchpad of one delivery while the ``queue_gate`` flow runs.

Conditions read it; actions fill it in. It lives for one delivery only and is never
persisted: durable state is only ever what the stores hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..domain.entities import NO_STRATEGY, Queue, QueueConfig, Request
from ..ports.delivery import Delivery

if TYPE_CHECKING:
    from .controller import ProcessController


@dataclass(slots=True)
class DeliveryContext:
    stage: ProcessController
    delivery: Delivery
    request_id: str
    request: Request | None = None
    queue: Queue | None = None
    config: QueueConfig = field(default_factory=QueueConfig)
    build_strategy: str = NO_STRATEGY
    base_uri: str = ""
    slot_conflict: bool = False
    outcome: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def req(self) -> Request:
        assert self.request is not None, "request not loaded yet"
        return self.request

    @property
    def q(self) -> Queue:
        assert self.queue is not None, "queue not loaded yet"
        return self.queue

"""The mutable scratchpad of one delivery while the ``queue_gate`` flow runs.

Conditions read it; actions fill it in. It lives for one delivery only and is never
persisted: durable state is only ever what the stores hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..domain.entities import NO_STRATEGY, Queue, QueueConfig, Request
from ..ports.delivery import Delivery
from ..spec.compiler import Step

if TYPE_CHECKING:
    from .controller import ProcessController


DEFAULT_CONFIG = QueueConfig()  # frozen: shared until load_queue resolves the real one


@dataclass(slots=True)
class DeliveryContext:
    stage: ProcessController
    delivery: Delivery
    request_id: str
    request: Request | None = None
    queue: Queue | None = None
    config: QueueConfig = DEFAULT_CONFIG
    build_strategy: str = NO_STRATEGY
    base_uri: str = ""
    slot_conflict: bool = False
    admit_step: Step | None = None
    outcome: str = ""

    @property
    def req(self) -> Request:
        assert self.request is not None, "request not loaded yet"
        return self.request

    @property
    def q(self) -> Queue:
        assert self.queue is not None, "queue not loaded yet"
        return self.queue

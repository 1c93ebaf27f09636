"""The mutable scratchpad of one delivery while the ``queue_gate`` flow runs.

Conditions read it; actions fill it in. It lives for one delivery only and is never
persisted: durable state is only ever what the stores hold. ``services`` is the one way
out to the world (see :mod:`.services`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..domain.entities import NO_STRATEGY, Queue, QueueConfig, Request
from ..machine.compiler import Step
from ..ports.delivery import Delivery
from .greens import BaseChoice
from .services import StageServices

DEFAULT_CONFIG = QueueConfig()  # frozen: shared until load_queue resolves the real one


@dataclass(slots=True)
class DeliveryContext:
    services: StageServices
    delivery: Delivery
    request_id: str
    #: The rows as loaded (``None`` until ``load_request``/``load_queue``); conditions
    #: and actions read them as :attr:`request` and :attr:`queue`.
    loaded_request: Request | None = None
    loaded_queue: Queue | None = None
    #: The queue row read beside R by ``load_request``, for ``load_queue`` to take.
    queue_read_with_request: Queue | None = None
    config: QueueConfig = DEFAULT_CONFIG
    #: ``config``'s max_concurrent once a step has read it (0: not read yet).
    slots: int = 0
    build_strategy: str = NO_STRATEGY
    base_uri: str = ""
    slot_conflict: bool = False
    newer_live_heads: int = 0
    rewrite: bool = False
    #: Why ``derive_strategy`` chose the strategy it did (noted in the trail).
    strategy_reason: str = ""
    #: Which recorded green ``derive_strategy`` chose as the base, and what it passed
    #: over (None: not derived); why the build is full ("" when it is not).
    base_choice: BaseChoice | None = None
    full_cause: str = ""
    #: Paths changed from a last green to R, once asked: (last green uri, paths).
    changed_since_green: tuple[str, frozenset[str]] | None = None
    #: Each path changed since last green with the skip_paths glob it matches, when all
    #: do (empty: R is built).
    skip_matches: tuple[tuple[str, str], ...] = ()
    admit_step: Step | None = None
    admit_lost: bool = False
    #: What the flow's finishing action decided: ``acked``, or ``held`` for ``hold_ms``.
    outcome: str = ""
    hold_ms: int = 0
    #: The flow transition being run (set by the flow driver): why a hold holds.
    via: Step | None = None
    #: Plugins' per-delivery scratch (``PluginContext.scratch``): gone with the delivery.
    scratch: dict[str, Any] = field(default_factory=dict)

    @property
    def request(self) -> Request:
        """The request being decided (loaded by the flow's first step)."""
        assert self.loaded_request is not None, "request not loaded yet"
        return self.loaded_request

    @property
    def queue(self) -> Queue:
        """Its queue's row, as loaded or last written by this delivery."""
        assert self.loaded_queue is not None, "queue not loaded yet"
        return self.loaded_queue

    def others_holding(self) -> int:
        """Slots of the loaded queue held by requests other than R: what the gate counts.

        Holders whose lease ran out are gone by then: ``reclaim_expired_leases`` frees
        them when the queue row is loaded, before anything is decided on it.
        """
        request_id = self.request.id
        return sum(1 for holder in self.queue.slot_holders if holder != request_id)

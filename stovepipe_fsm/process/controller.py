"""The process stage: one delivery in, one decision out, driven by ``queue_gate``.

Theory of operation
-------------------
``handle(delivery)`` builds a :class:`DeliveryContext` and lets the compiled
``queue_gate`` flow run it to ``acked`` or ``held``. The flow's YAML fixes the order of
the steps; the registered callables in :mod:`.gate` do the small amount of I/O each step
needs through the ports. Nothing here branches around the machine.

Errors leave ``handle`` raw: ``NonRetryable`` (missing request, wrong queue, missing
queue row) or anything else, which the runtime treats as retryable. The runtime owns
retry accounting and dead-lettering; this class never counts attempts.

Every step is safe to repeat: the flow re-reads durable state at every redelivery, the
slot claim is idempotent per request, Request writes are compare-and-set, and the start
event's id is derived from the admission, so a crash at any point and a redelivery
converge on the same durable outcome.

``begin``/``resume`` run the same flow in two halves, stopping after a named action: a
delivery held half-done while other deliveries of its queue run is what a stale ack
allows on JetStream (``docs/jetstream.md``, fact H), and ``check`` explores it that way.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from ..ports.clock import Clock
from ..ports.config import ConfigStore
from ..ports.delivery import Delivery
from ..ports.publisher import Publisher
from ..ports.source_control import SourceControlProvider
from ..ports.stores import QueueStore, RequestStore
from ..spec.compiler import FlowCursor, Probe
from .catalog import ProcessMachines
from .context import DeliveryContext
from .lifecycle import RequestLifecycle
from .metrics import Metrics

log = logging.getLogger("stovepipe_fsm.process")


@dataclass(frozen=True)
class PausedDelivery:
    """A delivery stopped after an action: its context and where its flow stands.

    Plain values (the context is a dataclass), so a simulated world can copy one onto a
    forked world with ``dataclasses.replace`` on the context.
    """

    ctx: DeliveryContext
    cursor: FlowCursor


class ProcessController:
    def __init__(
        self,
        machines: ProcessMachines,
        *,
        requests: RequestStore,
        queues: QueueStore,
        config: ConfigStore,
        source_control: SourceControlProvider,
        publisher: Publisher,
        clock: Clock,
        metrics: Metrics | None = None,
    ) -> None:
        self.machines = machines
        self.requests = requests
        self.queues = queues
        self.config = config
        self.source_control = source_control
        self.publisher = publisher
        self.clock = clock
        self.metrics = metrics or Metrics()
        self.lifecycle = RequestLifecycle(machines.request, requests, queues)
        self.admitted_states = machines.request.dest_of("admit")
        self._warned: set[str] = set()

    async def handle(self, delivery: Delivery, *, probe: Probe | None = None) -> str:
        """Run one delivery to ``acked`` or ``held``; return which."""
        ctx = DeliveryContext(stage=self, delivery=delivery, request_id=delivery.request_id)
        started = time.perf_counter()
        outcome = await self.machines.queue_gate.run(ctx, probe=probe)
        self.metrics.observe_latency((time.perf_counter() - started) * 1000.0)
        self.metrics.count(f"deliveries_{outcome}", delivery.queue)
        return outcome

    async def begin(
        self, delivery: Delivery, *, pause_after: str, probe: Probe | None = None
    ) -> PausedDelivery | str:
        """Run ``delivery`` until the action ``pause_after`` has run; the outcome if it
        finished without reaching that action."""
        ctx = DeliveryContext(stage=self, delivery=delivery, request_id=delivery.request_id)
        return await self._advance(ctx, self.machines.queue_gate.start(), pause_after, probe)

    async def resume(
        self, paused: PausedDelivery, *, probe: Probe | None = None
    ) -> PausedDelivery | str:
        """Run the rest of a paused delivery to ``acked`` or ``held``."""
        return await self._advance(paused.ctx, paused.cursor, "", probe)

    async def _advance(
        self, ctx: DeliveryContext, cursor: FlowCursor, pause_after: str, probe: Probe | None
    ) -> PausedDelivery | str:
        flow = self.machines.queue_gate
        cursor = await flow.advance(ctx, cursor, pause_after=pause_after, probe=probe)
        if not cursor.finished:
            return PausedDelivery(ctx, cursor)
        self.metrics.count(f"deliveries_{cursor.state}", ctx.delivery.queue)
        return cursor.state

    def warn_once(self, key: str, message: str, *args: Any) -> None:
        """Log a configuration warning once per process, not once per delivery."""
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

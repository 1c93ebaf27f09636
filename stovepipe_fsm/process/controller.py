"""The process stage: one delivery in, one decision out, driven by ``queue_gate``.

Theory of operation
-------------------
``handle(delivery)`` builds a :class:`DeliveryContext` and lets the compiled
``queue_gate`` flow run it to a terminal state; what the delivery's finishing action
decided (acked, or held for a delay) is the answer, an
:class:`~..domain.settle.Attempt`. The controller never settles the delivery: the runtime
feeds the attempt to the settle policy (:func:`~..domain.settle.settle`) and performs
the settlement. The flow's YAML fixes the order of the steps; the
registered callables in :mod:`.gate` do the small amount of I/O each step needs through
the :class:`StageServices` the controller was built with. Nothing here branches around
the machine.

Errors leave ``handle`` raw: ``NonRetryable`` (missing request, wrong queue, missing
queue row) or anything else, which the runtime treats as retryable. The runtime owns
retry accounting and dead-lettering; this class never counts attempts.

Every step is safe to repeat: the flow re-reads durable state at every redelivery, the
slot claim is idempotent per request, Request writes are compare-and-set, and the start
event's id is derived from the admission, so a crash at any point and a redelivery
converge on the same durable outcome.

``decide`` is ``handle`` with the flow transition that settled the delivery: the
simulated world records from it why a delivery was held (the conditions of the
transition into the held state), for the timelines that expect a hold reason.

Every delivery notes its decision in the decision trail as its flow finishes (the
``ack`` and ``hold`` actions, :func:`.trail.note_decision`), before the runtime settles it.

``begin``/``resume`` run the same flow in two halves, stopping after a named action: a
delivery held half-done while other deliveries of its queue run is what a stale ack
allows on JetStream (``docs/jetstream.md``, fact H), and ``check`` explores it that way.
"""

from __future__ import annotations

import time
from dataclasses import KW_ONLY, dataclass

from ..domain.settle import Attempt
from ..machine.compiler import FlowCursor, Probe, Step
from ..ports.delivery import Delivery
from .catalog import ProcessMachines
from .context import DeliveryContext
from .services import StageServices


@dataclass(frozen=True)
class PausedDelivery:
    """A delivery stopped after an action: its context and where its flow stands.

    Plain values (the context is a dataclass), so a simulated world can copy one onto a
    forked world with ``dataclasses.replace`` on the context.
    """

    ctx: DeliveryContext
    cursor: FlowCursor


@dataclass(frozen=True)
class Decision:
    """How a delivery's flow ended: what it decided (acked|held, for ``hold_ms``) and the
    transition that decided it."""

    outcome: str
    via: Step | None
    hold_ms: int = 0

    @property
    def attempt(self) -> Attempt:
        """The decision as the settle policy takes it."""
        return Attempt.finished(self.outcome, self.hold_ms)


@dataclass(eq=False)
class ProcessController:
    """Runs deliveries through the compiled ``queue_gate`` flow on fixed services."""

    machines: ProcessMachines
    services: StageServices
    _: KW_ONLY
    #: A service's controller runs plugin steps off its event loop, within a budget
    #: (machine/plugin_calls.py); a simulated world's runs them inline.
    offload_plugins: bool = False

    async def handle(self, delivery: Delivery, *, probe: Probe | None = None) -> Attempt:
        """Run one delivery to the end of its flow; return what it decided, to settle."""
        return (await self.decide(delivery, probe=probe)).attempt

    async def decide(self, delivery: Delivery, *, probe: Probe | None = None) -> Decision:
        """:meth:`handle`, answering the flow transition that settled the delivery too."""
        ctx = DeliveryContext(self.services, delivery, delivery.request_id)
        started = time.perf_counter()
        flow = self.machines.queue_gate
        via = await flow.settle(ctx, probe=probe, offload=self.offload_plugins)
        self._observe(ctx, started)
        return Decision(ctx.outcome, via, ctx.hold_ms)

    def _observe(self, ctx: DeliveryContext, started: float) -> None:
        metrics = self.services.metrics
        metrics.observe_latency((time.perf_counter() - started) * 1000.0)
        metrics.count(f"deliveries_{ctx.outcome}", ctx.delivery.queue)

    async def begin(
        self, delivery: Delivery, *, pause_after: str, probe: Probe | None = None
    ) -> PausedDelivery | Decision:
        """Run ``delivery`` until the action ``pause_after`` has run; the decision if it
        finished without reaching that action."""
        ctx = DeliveryContext(self.services, delivery, delivery.request_id)
        return await self._advance(ctx, self.machines.queue_gate.start(), pause_after, probe)

    async def resume(
        self, paused: PausedDelivery, *, probe: Probe | None = None
    ) -> PausedDelivery | Decision:
        """Run the rest of a paused delivery to the end of its flow."""
        return await self._advance(paused.ctx, paused.cursor, "", probe)

    async def _advance(
        self, ctx: DeliveryContext, cursor: FlowCursor, pause_after: str, probe: Probe | None
    ) -> PausedDelivery | Decision:
        flow = self.machines.queue_gate
        cursor = await flow.advance(
            ctx, cursor, pause_after=pause_after, probe=probe, offload=self.offload_plugins
        )
        if not cursor.finished:
            return PausedDelivery(ctx, cursor)
        self.services.metrics.count(f"deliveries_{ctx.outcome}", ctx.delivery.queue)
        return Decision(ctx.outcome, cursor.via, ctx.hold_ms)

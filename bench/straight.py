"""The least any driver of the ``queue_gate`` steps could cost: the flow written out.

``straight_handle`` runs the shipped flow's registered actions and conditions in one
hand-written function, with nothing a driver needs around them: no step loop, no machine
fire, no step budget or probe checks, each condition asked once, the transition that
runs told to the context as the driver tells it. It keeps everything else of the machine
path: the ``DeliveryContext``, each named step as its own call or coroutine, the request
lifecycle planning every write, the controller's metrics. (Without a step budget it
relies on the in-memory stores of the bench never losing a claim twice.)

It is written against ``machines/queue_gate.yaml`` as shipped; the bench checks, before
timing, that it leaves the same stores as the controller on both paths, so a flow edited
out from under it stops the bench instead of timing something else.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any

from stovepipe_fsm.adapters.memory import MemoryDelivery
from stovepipe_fsm.domain.settle import Attempt
from stovepipe_fsm.machine.compiler import Step
from stovepipe_fsm.process import gate
from stovepipe_fsm.process.context import DeliveryContext
from stovepipe_fsm.process.controller import ProcessController

Handle = Callable[[MemoryDelivery], Coroutine[Any, Any, Attempt]]
Action = Callable[[DeliveryContext], Coroutine[Any, Any, None]]


def _steps(controller: ProcessController) -> dict[tuple[str, str], Step]:
    """Each transition of the flow, by its trigger and its first condition ("": none)."""
    flow = controller.machines.queue_gate
    steps: dict[tuple[str, str], Step] = {}
    for step, _calls in flow.steps:
        spec = step.transition
        assert spec is not None, "a compiled step knows its declaration"
        first = spec.conditions[0].name if spec.conditions else ""
        steps[(step.trigger, first)] = step
    return steps


#: The flow's transitions by trigger and first condition, in the order unpacked below.
_TRANSITIONS = (
    ("dispatch", "request_is_terminal"),
    ("dispatch", "request_is_processing"),
    ("republish", ""),
    ("dispatch", ""),
    ("coalesce", "paused"),
    ("coalesce", "outside_newest_n"),
    ("coalesce", "latest_not_stamped"),
    ("coalesce", ""),
    ("gate", "gate_closed"),
    ("gate", "baseline_lag_exceeded"),
    ("gate", ""),
    ("claim", "rewrite_waits_for_drain"),
    ("claim", ""),
    ("admit", "slot_conflict"),
    ("admit", ""),
)


def straight_handle(machine_handle: Handle) -> Handle:
    """The shipped controller's services, driven by the flow written out by hand."""
    controller = machine_handle.__self__  # type: ignore[attr-defined]
    assert isinstance(controller, ProcessController)
    steps = _steps(controller)
    services, metrics = controller.services, controller.services.metrics
    (
        terminal,
        reannounced,
        republished,
        accepted,
        paused,
        superseded,
        unstamped,
        latest,
        gate_closed,
        lagging,
        derived,
        drain,
        claimed,
        lost,
        admitted,
    ) = (steps[key] for key in _TRANSITIONS)

    async def held(ctx: DeliveryContext, via: Step) -> str:
        ctx.via = via
        await gate.hold(ctx)
        return "held"

    async def acked(ctx: DeliveryContext, via: Step, action: Action) -> str:
        ctx.via = via
        await action(ctx)
        await gate.ack(ctx)
        return "acked"

    async def run(ctx: DeliveryContext) -> str:
        await gate.load_request(ctx)
        while True:
            if gate.request_is_terminal(ctx):
                return await acked(ctx, terminal, gate.release_slot)
            if gate.request_is_processing(ctx):
                ctx.via = reannounced
                await gate.announce(ctx)
                ctx.via = republished
                await gate.publish_build(ctx)
                await gate.ack(ctx)
                return "acked"
            ctx.via = accepted
            await gate.load_queue(ctx)
            await gate.reclaim_expired_leases(ctx)
            await gate.reclaim_ended_holders(ctx)
            await gate.count_newer_heads(ctx)
            if gate.paused(ctx):
                return await held(ctx, paused)
            if gate.outside_newest_n(ctx):
                return await acked(ctx, superseded, gate.supersede)
            if gate.latest_not_stamped(ctx):
                return await held(ctx, unstamped)
            ctx.via = latest
            if gate.gate_closed(ctx):
                return await held(ctx, gate_closed)
            if gate.baseline_lag_exceeded(ctx):
                return await held(ctx, lagging)
            ctx.via = derived
            await gate.derive_strategy(ctx)
            if gate.rewrite_waits_for_drain(ctx):
                return await held(ctx, drain)
            ctx.via = claimed
            await gate.claim_slot(ctx)
            if gate.slot_conflict(ctx):
                ctx.via = lost
                await gate.load_request(ctx)
                continue
            ctx.via = admitted
            await gate.mark_processing(ctx)
            await gate.release_lost_claim(ctx)
            await gate.announce(ctx)
            await gate.publish_build(ctx)
            await gate.ack(ctx)
            return "acked"

    async def handle(delivery: MemoryDelivery) -> Attempt:
        ctx = DeliveryContext(services, delivery, delivery.request_id)
        started = time.perf_counter()
        await run(ctx)
        metrics.observe_latency((time.perf_counter() - started) * 1000.0)
        metrics.count(f"deliveries_{ctx.outcome}", delivery.queue)
        return Attempt.finished(ctx.outcome, ctx.hold_ms)

    return handle

"""The conditions and actions ``machines/queue_gate.yaml`` refers to by name.

Each is a few lines over the delivery context; the order they run in, and which branch
is taken, is the YAML's business. The ``provides``/``requires`` facts let lint prove the
persist-before-publish ordering of the admit path from the YAML alone:

- ``request_processing``: the Request is durably ``processing`` (strategy and base
  written) - either this delivery wrote it or it loaded it that way;
- ``slot_held``: the queue row durably lists the Request as a slot holder;
- ``strategy_derived``: the build strategy for this admission has been chosen;
- ``start_announced``: the start event of this admission has been published, so a build
  publish never precedes it (a failed announce leaves nothing downstream to undo).
"""

from __future__ import annotations

import logging

from ..domain.entities import FULL, INCREMENTAL_SINCE_GREEN
from ..domain.errors import NonRetryable, NotFound, Retryable, VersionMismatch
from ..domain.hooks import started_event
from ..domain.ids import compare_request_id
from ..spec.registry import Registry
from .context import DeliveryContext

log = logging.getLogger("stovepipe_fsm.process")

REQUEST_PROCESSING = "request_processing"
SLOT_HELD = "slot_held"
STRATEGY_DERIVED = "strategy_derived"
START_ANNOUNCED = "start_announced"

GATE = Registry("queue_gate", kind="flow")


# --- conditions ---------------------------------------------------------------------


@GATE.condition()
def request_is_terminal(ctx: DeliveryContext) -> bool:
    """R is in a terminal state of the request machine."""
    return ctx.stage.lifecycle.is_terminal(ctx.req)


@GATE.condition(provides=[REQUEST_PROCESSING])
def request_is_processing(ctx: DeliveryContext) -> bool:
    """R is in a state the request machine's ``admit`` leads to: already admitted."""
    return ctx.req.state in ctx.stage.admitted_states


@GATE.condition()
def newer_head_exists(ctx: DeliveryContext) -> bool:
    """The queue's latest_request_id is newer than R (ingest order)."""
    latest = ctx.q.latest_request_id
    return bool(latest) and compare_request_id(ctx.req.queue, ctx.req.id, latest) < 0


@GATE.condition()
def latest_not_stamped(ctx: DeliveryContext) -> bool:
    """Ingest has not stamped R (or anything newer) as latest yet."""
    latest = ctx.q.latest_request_id
    return not latest or compare_request_id(ctx.req.queue, ctx.req.id, latest) > 0


@GATE.condition()
def gate_closed(ctx: DeliveryContext) -> bool:
    """Slots held by requests other than R reach the queue's max_concurrent."""
    others = sum(1 for holder in ctx.q.slot_holders if holder != ctx.req.id)
    return others >= ctx.config.max_concurrent


@GATE.condition(provides_unless=[SLOT_HELD])
def slot_conflict(ctx: DeliveryContext) -> bool:
    """The slot claim lost a compare-and-set race on the queue row."""
    return ctx.slot_conflict


# --- actions ------------------------------------------------------------------------


@GATE.action()
async def load_request(ctx: DeliveryContext) -> None:
    """Load R; a missing row or a queue mismatch is non-retryable."""
    try:
        request = await ctx.stage.requests.get(ctx.request_id)
    except NotFound:
        raise NonRetryable(f"request {ctx.request_id!r} not found") from None
    if request.queue != ctx.delivery.queue:
        raise NonRetryable(
            f"request {request.id!r} belongs to queue {request.queue!r} but arrived on "
            f"queue {ctx.delivery.queue!r}"
        )
    ctx.request = request


@GATE.action()
async def load_queue(ctx: DeliveryContext) -> None:
    """Load the queue row (missing is non-retryable) and resolve the queue's config."""
    stage = ctx.stage
    try:
        queue = await stage.queues.get(ctx.req.queue)
    except NotFound:
        raise NonRetryable(f"queue row {ctx.req.queue!r} not found") from None
    ctx.config = stage.config.get(queue.name)
    if sum(1 for h in queue.slot_holders if h != ctx.req.id) >= ctx.config.max_concurrent:
        queue = await stage.lifecycle.release_stale_holders(queue, keep=ctx.req.id)
    ctx.queue = queue
    ctx.slot_conflict = False


@GATE.action()
async def supersede(ctx: DeliveryContext) -> None:
    """Mark R superseded by the newer head; frees a slot R may hold from a crash."""
    try:
        ctx.request = await ctx.stage.lifecycle.apply(
            ctx.req, "supersede", superseded_by=ctx.q.latest_request_id
        )
    except VersionMismatch:
        raise Retryable(f"request {ctx.req.id!r} changed while superseding") from None
    ctx.stage.metrics.count("supersedes", ctx.req.queue)


@GATE.action(provides=[STRATEGY_DERIVED])
async def derive_strategy(ctx: DeliveryContext) -> None:
    """Full or incremental-since-green, from ancestry of the queue's last green."""
    request, last_green = ctx.req, ctx.q.last_green_uri
    ctx.build_strategy, ctx.base_uri = FULL, ""
    if not last_green:
        return
    source_control = ctx.stage.source_control.for_queue(request.queue)
    if source_control is None:
        ctx.stage.warn_once(
            f"no-repository:{request.queue}",
            "queue %s has no repository configured; every admit is a full build",
            request.queue,
        )
        return
    await ctx.delivery.in_progress()
    try:
        is_ancestor = await source_control.is_ancestor(last_green, request.uri)
    except NotFound as exc:
        log.warning(
            "queue %s request %s: ancestry of %s unknown (%s); full build",
            request.queue,
            request.id,
            last_green,
            exc,
        )
        return
    if is_ancestor:
        ctx.build_strategy, ctx.base_uri = INCREMENTAL_SINCE_GREEN, last_green


@GATE.action(requires=[STRATEGY_DERIVED])
async def claim_slot(ctx: DeliveryContext) -> None:
    """CAS the queue row to list R as a slot holder (idempotent for R)."""
    lifecycle = ctx.stage.lifecycle
    ctx.admit_step = lifecycle.plan(ctx.req, "admit")
    try:
        ctx.queue = await lifecycle.claim_slot(ctx.q, ctx.req, ctx.admit_step)
    except VersionMismatch:
        ctx.slot_conflict = True


@GATE.action(requires=[SLOT_HELD, STRATEGY_DERIVED], provides=[REQUEST_PROCESSING])
async def mark_processing(ctx: DeliveryContext) -> None:
    """CAS R accepted -> processing, persisting strategy and base (immutable after).

    A lost race means R changed since it was loaded: another delivery of R admitted it
    (it keeps the slot), or R ended meanwhile (dead-lettered, or settled by an earlier
    delivery whose ack was stale) and the slot just claimed for it belongs to nobody.
    That claim is released before the retry, so no crash-free path leaves a finished
    request holding a slot; a crash right here is healed by the terminal branch.
    """
    lifecycle = ctx.stage.lifecycle
    try:
        ctx.request = await lifecycle.apply(
            ctx.req,
            "admit",
            planned=ctx.admit_step,
            build_strategy=ctx.build_strategy,
            base_uri=ctx.base_uri,
        )
    except VersionMismatch:
        current = await ctx.stage.requests.get(ctx.req.id)
        if not lifecycle.machine.holds_slot(current.state):
            await lifecycle.release_claim(current)
        raise Retryable(f"request {ctx.req.id!r} changed while admitting") from None
    ctx.stage.metrics.count(f"admits_{ctx.build_strategy}", ctx.req.queue)


@GATE.action(requires=[REQUEST_PROCESSING], provides=[START_ANNOUNCED])
async def announce(ctx: DeliveryContext) -> None:
    """Publish validation.repository.started; its id is stable for this admission."""
    request = ctx.req
    event = started_event(request.queue, request.id, request.version, ctx.stage.clock.now_ms())
    await ctx.stage.publisher.publish_hook(event)


@GATE.action()
async def release_slot(ctx: DeliveryContext) -> None:
    """Free a slot terminal R still holds (a claim that raced R's end); no write if none."""
    await ctx.stage.lifecycle.settle_queue(ctx.req)


@GATE.action(requires=[REQUEST_PROCESSING, START_ANNOUNCED])
async def publish_build(ctx: DeliveryContext) -> None:
    """Hand R to build (deduped downstream on the request id)."""
    await ctx.stage.publisher.publish_build(ctx.req.queue, ctx.req.id)


@GATE.action(finishes=True)
async def ack(ctx: DeliveryContext) -> None:
    """Settle the delivery as done."""
    await ctx.delivery.ack()
    ctx.outcome = "acked"


@GATE.action(finishes=True)
async def hold(ctx: DeliveryContext) -> None:
    """Postpone the same message by gate_wait_delay_ms; not a failure."""
    await ctx.delivery.hold(ctx.config.gate_wait_delay_ms)
    ctx.outcome = "held"
    ctx.stage.metrics.count("holds", ctx.req.queue)

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
from collections.abc import Mapping
from typing import Any

from ..domain.entities import FULL, INCREMENTAL_SINCE_GREEN, Queue, Request
from ..domain.errors import NonRetryable, NotFound, Retryable, VersionMismatch
from ..domain.hooks import ended_event, lease_expired_event, started_event
from ..domain.ids import compare_request_id, format_request_id, parse_request_id
from ..domain.path_globs import all_match, first_match
from ..domain.settle import ACKED, HELD
from ..domain.trail_record import ADMITTED, PREEMPTED
from ..machine.registry import Registry
from ..ports.source_control import SourceControl
from .context import DeliveryContext
from .greens import (
    ANCESTRY_UNKNOWN,
    COLD_START,
    NO_REPOSITORY,
    PATH_RULE,
    RECENT_GREENS,
    BaseChoice,
    greens_considered,
    newest_green_ancestor,
)
from .services import StageServices
from .together import together
from .trail_notes import note, note_decision, note_reclaimed

log = logging.getLogger("stovepipe_fsm.process")

REQUEST_PROCESSING = "request_processing"
SLOT_HELD = "slot_held"
STRATEGY_DERIVED = "strategy_derived"
START_ANNOUNCED = "start_announced"

# Parameters the gate's conditions and actions read; queue_gate.yaml declares them.
MAX_CONCURRENT = "max_concurrent"
GATE_WAIT_DELAY_MS = "gate_wait_delay_ms"
PAUSED = "paused"
FULL_BUILD_PATHS = "full_build_paths"
MAX_BASELINE_LAG = "max_baseline_lag"
MAX_VALIDATION_MS = "max_validation_ms"
EVERY_HEAD = "every_head"
KEEP_NEWEST = "keep_newest"
SKIP_PATHS = "skip_paths"

GATE = Registry("queue_gate", kind="flow")

#: Request ids ``count_newer_heads`` reads at once (one round trip of the stores).
NEWER_HEADS_PER_READ = 1024


# --- conditions ---------------------------------------------------------------------


@GATE.condition()
def request_is_terminal(ctx: DeliveryContext) -> bool:
    """R is in a terminal state of the request machine."""
    return ctx.services.lifecycle.is_terminal(ctx.request)


@GATE.condition(provides=[REQUEST_PROCESSING])
def request_is_processing(ctx: DeliveryContext) -> bool:
    """R is in a state the request machine's admit role leads to: already admitted."""
    return ctx.services.lifecycle.is_admitted(ctx.request)


@GATE.condition(parameters=[PAUSED])
def paused(ctx: DeliveryContext) -> bool:
    """The queue's ``paused`` parameter is set: every head waits, none is superseded.

    Holding before coalescing keeps a paused queue exactly as it was: a head ingested
    meanwhile is coalesced like any other once the queue resumes.
    """
    return bool(ctx.config.param(PAUSED))


@GATE.condition()
def newer_head_exists(ctx: DeliveryContext) -> bool:
    """The queue's latest_request_id is newer than R (ingest order)."""
    latest = ctx.queue.latest_request_id
    return bool(latest) and compare_request_id(ctx.request.queue, ctx.request.id, latest) < 0


def _never_with_every_head(parameters: Mapping[str, Any]) -> str:
    return "every_head is true: every head is kept" if parameters.get(EVERY_HEAD) else ""


def _never_with_one_slot(parameters: Mapping[str, Any]) -> str:
    """With one slot, gate_closed holds a head whenever another request holds the slot,
    so a condition that needs another holder at the later steps never sees one."""
    one_slot = int(parameters.get(MAX_CONCURRENT, 1) or 1) <= 1
    return "max_concurrent is 1: gate_closed holds the head first" if one_slot else ""


def _never_without_lag_bound(parameters: Mapping[str, Any]) -> str:
    if not parameters.get(MAX_BASELINE_LAG):
        return "max_baseline_lag is 0 (no bound)"
    return _never_with_one_slot(parameters)


def _never_without_skip_paths(parameters: Mapping[str, Any]) -> str:
    return "" if parameters.get(SKIP_PATHS) else "skip_paths is empty"


@GATE.condition(parameters=[MAX_CONCURRENT], never_when=_never_with_every_head)
def outside_newest_n(ctx: DeliveryContext) -> bool:
    """R is no longer among the newest N heads its queue keeps; never with ``every_head``.

    N is ``keep_newest``, or max_concurrent when that is 0 (or undeclared). The newest
    N are the N highest in ingest order among the heads not yet terminal, the queue's
    latest head always counted (``count_newer_heads`` counts those newer than R). With
    N = 1 this is exactly "a newer head exists". With ``every_head`` every head is kept:
    it waits for a slot, and the queue's message order admits the oldest first.
    """
    return not every_head(ctx) and ctx.newer_live_heads >= kept_heads(ctx)


def every_head(ctx: DeliveryContext) -> bool:
    """The queue keeps every head (``every_head``; false when the policy does not declare
    it)."""
    return bool(_declared(ctx, EVERY_HEAD, False))


def kept_heads(ctx: DeliveryContext) -> int:
    """How many of the newest heads not yet terminal the queue keeps when it coalesces:
    ``keep_newest``, or max_concurrent when that is 0 or undeclared."""
    return int(_declared(ctx, KEEP_NEWEST, 0)) or _max_concurrent(ctx)


@GATE.condition()
def latest_not_stamped(ctx: DeliveryContext) -> bool:
    """Ingest has not stamped R (or anything newer) as latest yet."""
    latest = ctx.queue.latest_request_id
    return not latest or compare_request_id(ctx.request.queue, ctx.request.id, latest) > 0


@GATE.condition(parameters=[MAX_CONCURRENT])
def gate_closed(ctx: DeliveryContext) -> bool:
    """Slots held by requests other than R reach the queue's max_concurrent, or another
    request admitted as a rewrite holds one: a rewrite runs alone, so it counts as
    holding every slot. (Holders whose lease ran out were reclaimed when the row was
    loaded: the gate counts only unexpired ones.)"""
    return ctx.others_holding() >= _max_concurrent(ctx) or _rewrite_running(ctx)


def _rewrite_running(ctx: DeliveryContext) -> bool:
    holder, queue = ctx.queue.serial_holder, ctx.queue
    if not holder or holder == ctx.request.id or not queue.holds(holder):
        return False
    return not queue.is_expired(holder, ctx.services.clock.now_ms())


@GATE.condition(parameters=[MAX_BASELINE_LAG], never_when=_never_without_lag_bound)
def baseline_lag_exceeded(ctx: DeliveryContext) -> bool:
    """R is more than max_baseline_lag heads (ingest order) past the last green it would
    pin, and work in flight may still green a newer base: drain first.

    0 sets no bound. With nothing in flight no newer green can come, so R goes ahead.
    """
    bound = int(ctx.config.param(MAX_BASELINE_LAG))
    green = ctx.queue.last_green_request_id
    if bound <= 0 or not green or ctx.others_holding() == 0:
        return False
    return baseline_lag(ctx.request.id, green) > bound


def baseline_lag(request_id: str, green_request_id: str) -> int:
    """How many heads (ingest order) ``request_id`` is past ``green_request_id``."""
    return parse_request_id(request_id).counter - parse_request_id(green_request_id).counter


@GATE.condition(never_when=_never_without_skip_paths)
def only_skip_paths_changed(ctx: DeliveryContext) -> bool:
    """Every path changed from the queue's last green to R matches a skip_paths glob
    (``match_skip_paths`` found them): R needs no build."""
    return bool(ctx.skip_matches)


@GATE.condition(never_when=_never_with_one_slot)
def rewrite_waits_for_drain(ctx: DeliveryContext) -> bool:
    """R does not descend from last green (or its ancestry is unknown) and other
    requests of its queue still hold slots: a rewrite is admitted only alone."""
    return ctx.rewrite and ctx.others_holding() > 0


@GATE.condition(provides_unless=[SLOT_HELD])
def slot_conflict(ctx: DeliveryContext) -> bool:
    """The slot claim lost a compare-and-set race on the queue row."""
    return ctx.slot_conflict


# --- actions ------------------------------------------------------------------------


@GATE.action()
async def load_request(ctx: DeliveryContext) -> None:
    """Load R; a missing row or a queue mismatch is non-retryable.

    The queue row is read in the same round trip (the delivery names the queue), for
    ``load_queue`` to take: a decision then waits for one read instead of two. Reading it
    beside R rather than after changes nothing a decision relies on: every write made on
    what the row said is a compare-and-set on the row's version.
    """
    services = ctx.services
    try:
        request, ctx.queue_read_with_request = await together(
            services.requests.get(ctx.request_id), _queue_row(services, ctx.delivery.queue)
        )
    except NotFound:
        raise NonRetryable(f"request {ctx.request_id!r} not found") from None
    if request.queue != ctx.delivery.queue:
        raise NonRetryable(
            f"request {request.id!r} belongs to queue {request.queue!r} but arrived on "
            f"queue {ctx.delivery.queue!r}"
        )
    ctx.loaded_request = request


async def _queue_row(services: StageServices, name: str) -> Queue | None:
    try:
        return await services.queues.get(name)
    except (NotFound, ValueError):
        return None  # load_queue reads again and says what is wrong


@GATE.action()
async def load_queue(ctx: DeliveryContext) -> None:
    """Load the queue row (missing is non-retryable) and resolve the queue's config."""
    services = ctx.services
    read, ctx.queue_read_with_request = ctx.queue_read_with_request, None
    try:
        if read is None:
            read = await services.queues.get(ctx.request.queue)
        ctx.loaded_queue = read
    except NotFound:
        raise NonRetryable(f"queue row {ctx.request.queue!r} not found") from None
    ctx.config = services.config.get(ctx.queue.name)
    ctx.slots = 0
    ctx.slot_conflict = False


@GATE.action(parameters=[MAX_CONCURRENT])
async def reclaim_ended_holders(ctx: DeliveryContext) -> None:
    """Free slots still listed for requests that already ended, when they close the gate.

    Between a request's terminal write and its slot release (record's second write, in
    progress or left by a crash) it is still listed as a holder (a rewrite's: also as the
    serial holder). Only when the other holders would close the gate are they looked up
    (the open gate needs no reads); only terminal ones are finished, in one queue-row CAS
    that also advances last green for a green end, and noted in the trail.
    """
    if gate_closed(ctx):
        before = ctx.queue.slot_holders
        lifecycle = ctx.services.lifecycle
        ctx.loaded_queue = await lifecycle.release_stale_holders(ctx.queue, keep=ctx.request.id)
        await note_reclaimed(ctx, [h for h in before if h not in ctx.queue.slot_holders])


@GATE.action(parameters=[MAX_CONCURRENT])
async def count_newer_heads(ctx: DeliveryContext) -> None:
    """Count the heads newer than R that are not yet terminal (the latest always
    counts), up to the number kept: what ``outside_newest_n`` decides on.

    Keeping one head, the latest alone decides, from the queue row: no read. Keeping N
    the heads between R and the latest are read newest first, ``NEWER_HEADS_PER_READ``
    ids in one read, until N such heads are counted: a backlog of hundreds costs one
    read, not one per head. A counter value with no request (spent on a lost ingest
    race, or pruned) is skipped, and so is a probe (a culprit search's build, never a
    head). A queue keeping every head counts nothing.
    """
    ctx.newer_live_heads = 0
    latest = ctx.queue.latest_request_id
    if not latest or compare_request_id(ctx.request.queue, ctx.request.id, latest) >= 0:
        return
    if every_head(ctx):
        return
    limit = kept_heads(ctx)
    ctx.newer_live_heads = 1
    if limit == 1:
        return
    queue, lifecycle = ctx.request.queue, ctx.services.lifecycle
    mine, top = parse_request_id(ctx.request.id).counter, parse_request_id(latest).counter
    for high in range(top - 1, mine, -NEWER_HEADS_PER_READ):
        ids = [
            format_request_id(queue, n)
            for n in range(high, max(mine, high - NEWER_HEADS_PER_READ), -1)
        ]
        heads = await ctx.services.requests.get_many(ids)
        for request_id in ids:
            head = heads.get(request_id)
            if head is not None and not head.probe_of and not lifecycle.is_terminal(head):
                ctx.newer_live_heads += 1
                if ctx.newer_live_heads >= limit:
                    return


def _max_concurrent(ctx: DeliveryContext) -> int:
    """The queue's max_concurrent, read from its config once per loaded config."""
    slots = ctx.slots
    if not slots:
        slots = ctx.slots = int(ctx.config.param(MAX_CONCURRENT))
    return slots


def _declared(ctx: DeliveryContext, name: str, absent: object) -> Any:
    """Parameter ``name`` of the queue, or ``absent`` when the policy does not declare it."""
    return dict(ctx.config.parameters).get(name, absent)


@GATE.action()
async def reclaim_expired_leases(ctx: DeliveryContext) -> None:
    """Free the slots of other holders whose lease ran out, in one queue-row CAS.

    Each reclaimed holder is announced first (``validation.repository.lease_expired``,
    its id derived from the lease, so a reclaim repeated after a crash dedupes), then
    dropped. The request itself is not failed: its late outcome is still recorded, and
    its own release finds nothing to free.
    """
    queue = ctx.queue
    if not queue.leases:
        return  # only a holder claimed under a lease can expire
    now = ctx.services.clock.now_ms()
    expired = tuple(h for h in queue.expired_holders(now) if h != ctx.request.id)
    if not expired:
        return
    for holder in expired:
        expires = queue.expires_at(holder)
        assert expires is not None, "an expired holder has a lease"
        event = lease_expired_event(queue.name, holder, expires, now)
        await ctx.services.publisher.publish_hook(event)
    log.warning("queue %s: leases of %s expired; slots reclaimed", queue.name, list(expired))
    ctx.loaded_queue = await ctx.services.lifecycle.reclaim_expired(queue.name, expired, now)
    ctx.services.metrics.count("leases_expired", queue.name, len(expired))
    await note_reclaimed(ctx, list(expired), why="lease expired")


@GATE.action()
async def supersede(ctx: DeliveryContext) -> None:
    """Mark R superseded by the newer head; frees a slot R may hold from a crash."""
    try:
        ctx.loaded_request = await ctx.services.lifecycle.supersede(
            ctx.request, ctx.queue.latest_request_id, loaded=ctx.queue
        )
    except VersionMismatch:
        raise Retryable(f"request {ctx.request.id!r} changed while superseding") from None
    ctx.services.metrics.count("supersedes", ctx.request.queue)


@GATE.action()
async def preempt_older_builds(ctx: DeliveryContext) -> None:
    """End the running build of every slot holder older than R (ingest order), for R:
    the request machine's ``preempt`` role (cancel in progress; never in the shipped
    policy).

    Each is ended through the lifecycle (terminal, ``superseded_by`` R, slot freed),
    then its end is announced on the hook topic (``validation.repository.<its state>``,
    id of the terminal write, as record announces an end) and noted in its trail. A
    holder not admitted (mid-admission, or already ended and not yet released) is left
    to the gate's other rules. Load refuses a gate naming this action when the request
    machine declares no ``preempt`` role.
    """
    services, request, queue = ctx.services, ctx.request, ctx.queue
    older = [
        h
        for h in queue.slot_holders
        if h != request.id and compare_request_id(request.queue, h, request.id) < 0
    ]
    for holder in older:
        try:
            running = await services.requests.get(holder)
        except NotFound:
            continue  # reclaim_ended_holders reports a holder with no row
        if not services.lifecycle.is_admitted(running):
            continue
        await announce_start_before_end(services, running)
        try:
            ended = await services.lifecycle.preempt(running, by=request.id)
        except VersionMismatch:
            raise Retryable(f"request {holder!r} changed while preempting it") from None
        except ValueError as exc:
            raise NonRetryable(str(exc)) from None
        now = services.clock.now_ms()
        event = ended_event(ended.queue, ended.id, ended.state, ended.version, now)
        await services.publisher.publish_hook(event)
        log.info("queue %s: %s preempted by %s", queue.name, holder, request.id)
        await note(services, PREEMPTED, ended, stream_seq=ctx.delivery.stream_seq, by=request.id)
        services.metrics.count("preempts", queue.name)
    if older:
        ctx.loaded_queue = await services.queues.get(queue.name)


@GATE.action(parameters=[SKIP_PATHS])
async def match_skip_paths(ctx: DeliveryContext) -> None:
    """Note, for ``only_skip_paths_changed``, each path changed since the queue's last
    green with the skip_paths glob it matches, when every one matches.

    The diff is from last green, never from the previous head, as for
    ``full_build_paths``: a head superseded after changing code leaves that change in
    the next head's diff. R is built (nothing noted) when the queue sets no skip_paths,
    has no last green or no repository, when R does not descend from last green or its
    ancestry is unknown, and when nothing changed.
    """
    ctx.skip_matches = ()
    globs = tuple(ctx.config.param(SKIP_PATHS))
    last_green = ctx.queue.last_green_uri
    source_control = ctx.services.source_control.for_queue(ctx.request.queue)
    if not globs or not last_green or source_control is None:
        return
    await ctx.delivery.in_progress()
    try:
        if not await source_control.is_ancestor(last_green, ctx.request.uri):
            return
        changed = await _changed_since_green(ctx, source_control, last_green)
    except NotFound:
        return  # unknown ancestry: build
    ctx.skip_matches = all_match(changed, globs) or ()


@GATE.action()
async def skip(ctx: DeliveryContext) -> None:
    """End R unbuilt through the request machine's ``skip`` role: no slot, no build, last
    green unchanged; frees a slot R may hold from a crash."""
    try:
        ctx.loaded_request = await ctx.services.lifecycle.skip(ctx.request, loaded=ctx.queue)
    except VersionMismatch:
        raise Retryable(f"request {ctx.request.id!r} changed while skipping") from None
    except ValueError as exc:
        raise NonRetryable(str(exc)) from None
    ctx.services.metrics.count("skips", ctx.request.queue)


async def _changed_since_green(
    ctx: DeliveryContext, source_control: SourceControl, last_green: str
) -> frozenset[str]:
    """The paths changed from ``last_green`` to R, asked once per delivery and last green."""
    known = ctx.changed_since_green
    if known is not None and known[0] == last_green:
        return known[1]
    changed = await source_control.changed_paths(last_green, ctx.request.uri)
    ctx.changed_since_green = (last_green, changed)
    return changed


@GATE.action(provides=[STRATEGY_DERIVED])
async def derive_strategy(ctx: DeliveryContext) -> None:
    """Incremental on the newest recorded green that is an ancestor of R, else full;
    full also when the diff from that green to R touches a full_build_paths glob.

    The queue's recent greens (newest first, at most ``recent_greens``) are asked about
    one at a time, stopping at the first ancestor (:mod:`.greens`). Full with no base on
    a cold start (no green recorded), when no recorded green is an ancestor, when
    ancestry is unknown, or when a path rule forces it; the trail names the green chosen
    and why. R is a rewrite (it runs alone) when it does not descend from last green
    itself, or that ancestry is unknown, whatever older green it builds on.

    The diff is taken against the chosen green, the base an incremental build would
    reuse, never against the previous head: a build file changed by a head that was
    superseded (or failed) is still in the diff of the next one. ``full_build_paths`` and
    ``recent_greens`` are read only if the policy declares them: without the first the
    diff is never asked, without the second last green alone is a candidate.
    """
    request, greens = ctx.request, ctx.queue.greens
    ctx.build_strategy, ctx.base_uri, ctx.rewrite, ctx.full_cause = FULL, "", False, ""
    ctx.base_choice = BaseChoice(None)
    source_control = ctx.services.source_control.for_queue(request.queue)
    if source_control is None and (slots := int(_declared(ctx, MAX_CONCURRENT, 1))) > 1:
        ctx.services.warnings.warning(
            f"speculative-no-repository:{request.queue}",
            "queue %s has max_concurrent %d but no repository configured; every admit is "
            "a full build",
            request.queue,
            slots,
        )
    if not greens:
        ctx.strategy_reason, ctx.full_cause = "no last green", COLD_START
        return
    if source_control is None:
        ctx.strategy_reason, ctx.full_cause = "no repository configured", NO_REPOSITORY
        ctx.services.warnings.warning(
            f"no-repository:{request.queue}",
            "queue %s has no repository configured; every admit is a full build",
            request.queue,
        )
        return
    await ctx.delivery.in_progress()
    considered = greens_considered(greens, int(_declared(ctx, RECENT_GREENS, 1)))
    choice = ctx.base_choice = await newest_green_ancestor(source_control, considered, request.uri)
    ctx.rewrite = not choice.descends_from_last_green
    last_green = greens[0].uri
    if choice.green is None:
        ctx.full_cause = choice.full_cause
        if choice.unknown:
            log.warning(
                "queue %s request %s: ancestry of %s unknown; full build",
                request.queue,
                request.id,
                ", ".join(g.uri for g in choice.unknown),
            )
            ctx.strategy_reason = f"unknown commit: ancestry of last green {last_green} unknown"
        else:
            ctx.strategy_reason = f"last green {last_green} is not an ancestor (rewrite)"
        return
    base = choice.green.uri
    globs = tuple(_declared(ctx, FULL_BUILD_PATHS, ()))  # the diff is asked only for them
    try:
        changed = await _changed_since_green(ctx, source_control, base) if globs else frozenset()
    except NotFound as exc:
        log.warning(
            "queue %s request %s: the diff from %s is unknown (%s); full build",
            request.queue,
            request.id,
            base,
            exc,
        )
        ctx.strategy_reason = f"unknown commit: the diff from green {base} is unknown"
        ctx.full_cause, ctx.rewrite = ANCESTRY_UNKNOWN, True
        return
    hit = first_match(changed, globs)
    if hit:
        log.info(
            "queue %s request %s: %s changed since green %s (matches %s); full build",
            request.queue,
            request.id,
            hit[0],
            base,
            hit[1],
        )
        ctx.strategy_reason = f"{hit[0]} changed since last green (full_build_paths {hit[1]})"
        ctx.full_cause = PATH_RULE
        return
    ctx.build_strategy, ctx.base_uri = INCREMENTAL_SINCE_GREEN, base
    if choice.passed or choice.unknown:
        ctx.strategy_reason = f"descends from green {base}, not from last green {last_green}"
    else:
        ctx.strategy_reason = f"descends from last green {last_green}"


@GATE.action(requires=[STRATEGY_DERIVED])
async def claim_slot(ctx: DeliveryContext) -> None:
    """CAS the queue row to list R as a slot holder (idempotent for R).

    With max_validation_ms the slot is a lease expiring that long from now; a rewrite
    is marked as the queue's serial holder, so nothing else is admitted beside it.
    ``max_validation_ms`` is read only if the policy declares it, so a policy written
    without leases keeps validating and its slots never expire.
    """
    lifecycle = ctx.services.lifecycle
    ctx.admit_step = await lifecycle.plan_admit(ctx.request)
    lease_ms = int(_declared(ctx, MAX_VALIDATION_MS, 0))
    expires = ctx.services.clock.now_ms() + lease_ms if lease_ms > 0 else None
    try:
        ctx.loaded_queue = await lifecycle.claim_slot(
            ctx.queue, ctx.request, ctx.admit_step, expires_at_ms=expires, serial=ctx.rewrite
        )
    except VersionMismatch:
        ctx.slot_conflict = True


@GATE.action(requires=[SLOT_HELD, STRATEGY_DERIVED])
async def mark_processing(ctx: DeliveryContext) -> None:
    """CAS R accepted -> processing, persisting strategy and base (immutable after).

    A lost race is not an error here: it is noted for ``release_lost_claim``, the next
    step, which gives the claim back before the delivery is retried.
    """
    assert ctx.admit_step is not None, "claim_slot plans the admission"
    try:
        ctx.loaded_request = await ctx.services.lifecycle.admit(
            ctx.request, ctx.admit_step, ctx.build_strategy, ctx.base_uri
        )
    except VersionMismatch:
        ctx.admit_lost = True
        return
    ctx.services.metrics.count(f"admits_{ctx.build_strategy}", ctx.request.queue)


@GATE.action(provides=[REQUEST_PROCESSING])
async def release_lost_claim(ctx: DeliveryContext) -> None:
    """Go on only if the admit write won; else free the slot just claimed and retry.

    A lost write means R changed since it was loaded: another delivery of R admitted it
    (that one keeps the slot), or R ended meanwhile (dead-lettered, or settled by an
    earlier delivery whose ack was stale) and the slot just claimed belongs to nobody. It
    is released before the retry, so no crash-free path leaves a finished request holding
    a slot; a crash right before this step is healed by the terminal branch.
    """
    if not ctx.admit_lost:
        return
    lifecycle = ctx.services.lifecycle
    current = await ctx.services.requests.get(ctx.request.id)
    if not lifecycle.machine.holds_slot(current.state):
        await lifecycle.release_claim(current)
    raise Retryable(f"request {ctx.request.id!r} changed while admitting")


@GATE.action(requires=[REQUEST_PROCESSING], provides=[START_ANNOUNCED])
async def announce(ctx: DeliveryContext) -> None:
    """Publish validation.repository.started; its id is stable for this admission."""
    await announce_start(ctx.services, ctx.request)


async def announce_start(services: StageServices, admitted: Request) -> None:
    """Announce the start of ``admitted``'s validation (the request as its admission
    wrote it: its version is the event's id, so every announce of it is one event).

    The gate announces it before publishing the build.
    """
    now = services.clock.now_ms()
    await services.publisher.publish_hook(
        started_event(admitted.queue, admitted.id, admitted.version, now)
    )


async def announce_start_before_end(services: StageServices, request: Request) -> None:
    """Announce ``request``'s start if it is admitted and the trail does not note its
    admission: whoever ends a request that is not yet terminal (record, the dead-letter
    reconciler, a preemption) calls this first. A crash between the admission's write and
    its announcement leaves the start to the redelivery, and the end can come before it;
    the gate notes the admission only after announcing it, so without that note the start
    is announced here, and it always precedes the end (the same event id: downstream, one
    start). A request not admitted started nothing and announces nothing."""
    if (
        not request.build_strategy
        or request.probe_of
        or not services.lifecycle.is_admitted(request)
    ):
        return  # a probe is not a validation of trunk: it announces no start
    if not await services.trail.has(request.id, ADMITTED):
        await announce_start(services, request)


@GATE.action()
async def release_slot(ctx: DeliveryContext) -> None:
    """Finish terminal R's end on the queue row: free a slot it still holds (a claim that
    raced R's end) and, for a green end, advance last green as record would; no write when
    nothing is left to do."""
    await ctx.services.lifecycle.settle_queue(ctx.request)


@GATE.action(requires=[REQUEST_PROCESSING, START_ANNOUNCED])
async def publish_build(ctx: DeliveryContext) -> None:
    """Hand R to build (deduped downstream on the request id)."""
    await ctx.services.publisher.publish_build(ctx.request.queue, ctx.request.id)


@GATE.action(finishes=True)
async def ack(ctx: DeliveryContext) -> None:
    """Finish with the delivery done (noting what it decided in the trail); the runtime
    settles it."""
    await note_decision(ctx, held=False)
    ctx.outcome = ACKED


@GATE.action(finishes=True, parameters=[GATE_WAIT_DELAY_MS])
async def hold(ctx: DeliveryContext) -> None:
    """Finish asking that the same message wait gate_wait_delay_ms; not a failure (noted,
    with the reason, in the trail). The runtime postpones it."""
    await note_decision(ctx, held=True)
    ctx.outcome = HELD
    ctx.hold_ms = ctx.config.param(GATE_WAIT_DELAY_MS)

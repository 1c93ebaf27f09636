"""The conditions and actions ``machines/culprit.yaml`` refers to by name, and its driver.

The driver (:class:`CulpritFinder`) runs the search machine once for each build of a
queue that record ends, a head's or a probe's. What a search knows is its row (one per
queue, :class:`~..domain.culprit_search.CulpritSearch`), written by compare-and-set; the
evidence math is :mod:`..domain.culprit_search`. Facts lint proves from the YAML:

- ``search_saved``: this event's change to the search row is durable, so probes and
  announcements (which a redelivery repeats) never run ahead of the row that explains
  them.

A redelivered end finds the row as the first delivery left it: a probe already weighed
is no longer listed, a red head already searched is the row's own, so the event is
ignored, and ``ensure_probes`` makes sure each listed probe has its request and its
build published (a crash between the row's write and them is healed there).
"""

from __future__ import annotations

import logging
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from ..domain.culprit_search import (
    CulpritSearch,
    Probe,
    Tally,
    frontier,
    likelihood_probes,
    named,
    posterior,
    section_probes,
)
from ..domain.entities import QueueConfig, Request, evolve
from ..domain.errors import AlreadyExists, NotFound, Retryable, VersionMismatch
from ..domain.hooks import culprit_event
from ..domain.ids import compare_request_id, format_request_id
from ..domain.trail_record import ADMITTED, PROBE_STARTED
from ..domain.trail_record import CULPRIT as CULPRIT_NOTE
from ..machine.compiler import CompiledFlow, Step
from ..machine.compiler import Probe as StepProbe
from ..machine.model import SEARCH
from ..machine.registry import Registry
from ..ports.stores import Counter, SearchStore
from .greens import RECENT_GREENS, greens_considered, newest_green_ancestor
from .roles import Outcome
from .services import StageServices
from .trail_notes import note

log = logging.getLogger("stovepipe_fsm.culprit")

SEARCH_SAVED = "search_saved"

# Parameters culprit.yaml declares.
PROBE_SLOTS = "probe_slots"
CONFIRM_REDS = "confirm_reds"
MAX_PROBES = "max_probes"
MAX_BLAMELIST = "max_blamelist"
FLAKE_AWARE = "flake_aware"
FLAKE_RATE_PERCENT = "flake_rate_percent"
CONFIDENCE_PERCENT = "confidence_percent"
#: The gate's lease on a build, read (when declared) as the lease on a probe.
MAX_VALIDATION_MS = "max_validation_ms"

#: Where a search stands: the machine's terminal states the driver treats as "open".
SEARCHING = "searching"

# Why a red head has no blamelist (the row's ``reason``).
NO_REPOSITORY = "no repository configured"
NO_GREEN_BASE = "no recorded green is an ancestor of the head"
TOO_LONG = "blamelist longer than max_blamelist"
ANCESTRY_UNKNOWN = "source control does not know the head or its base"

CULPRIT_MACHINE = "culprit"


@dataclass(slots=True)
class SearchContext:
    """The scratchpad of one ended build while ``culprit.yaml`` runs (never persisted)."""

    services: StageServices
    searches: SearchStore
    counter: Counter
    #: The request whose build ended, as recorded, and the outcome it was recorded with.
    ended: Request
    outcome: Outcome
    config: QueueConfig = field(default_factory=QueueConfig)
    #: The row as loaded (None: the queue never had one) and the row being made.
    stored: CulpritSearch | None = None
    search: CulpritSearch | None = None
    #: The listed probe whose build ended (None: the end is a head's, or already weighed).
    probe: Probe | None = None
    #: The open search a new red head replaced (its end is announced after the save).
    replaced: CulpritSearch | None = None
    via: Step | None = None
    scratch: dict[str, Any] = field(default_factory=dict)

    @property
    def row(self) -> CulpritSearch:
        assert self.search is not None, "search row not loaded yet"
        return self.search

    def param(self, name: str) -> Any:
        return self.config.param(name)


CULPRIT = Registry(CULPRIT_MACHINE, kind=SEARCH)


# --- conditions ---------------------------------------------------------------------


def _is_open(search: CulpritSearch | None) -> bool:
    return search is not None and search.state == SEARCHING


@CULPRIT.condition()
def probe_ended(ctx: SearchContext) -> bool:
    """The build that ended is a probe the search row lists in flight."""
    return ctx.probe is not None


@CULPRIT.condition(parameters=[PROBE_SLOTS])
def finding_off(ctx: SearchContext) -> bool:
    """probe_slots is 0: the queue does not search."""
    return int(ctx.param(PROBE_SLOTS)) == 0


def _newer_head(ctx: SearchContext) -> bool:
    """The ended request is a head newer (ingest order) than the one searched for."""
    if ctx.ended.probe_of:
        return False
    red = ctx.row.red_request_id
    return not red or compare_request_id(ctx.ended.queue, ctx.ended.id, red) > 0


@CULPRIT.condition()
def new_red_head(ctx: SearchContext) -> bool:
    """A head newer than the one the row searched for ended red."""
    return ctx.outcome.red and _newer_head(ctx)


@CULPRIT.condition()
def trunk_green_again(ctx: SearchContext) -> bool:
    """A head newer than the red one ended green while its search was open."""
    return ctx.outcome.green and _is_open(ctx.search) and _newer_head(ctx)


@CULPRIT.condition()
def search_closed(ctx: SearchContext) -> bool:
    """The probe's search had ended before its result came (or was never opened)."""
    return ctx.row.state not in ("", SEARCHING)


@CULPRIT.condition()
def no_blamelist(ctx: SearchContext) -> bool:
    """The red head has no blamelist to search (its reason says why)."""
    return not ctx.row.blamelist


def _confidence(ctx: SearchContext) -> tuple[float, float]:
    """(flake rate, confidence) the policy asks for (0, 0 without flake_aware)."""
    if not ctx.param(FLAKE_AWARE):
        return 0.0, 0.0
    return int(ctx.param(FLAKE_RATE_PERCENT)) / 100, int(ctx.param(CONFIDENCE_PERCENT)) / 100


@CULPRIT.condition(parameters=[CONFIRM_REDS, FLAKE_AWARE, FLAKE_RATE_PERCENT, CONFIDENCE_PERCENT])
def culprit_confirmed(ctx: SearchContext) -> bool:
    """The first red commit has a green parent (or is the first after the base), the
    reds confirm_reds asks for and, with flake_aware, the confidence asked for."""
    rate, confidence = _confidence(ctx)
    return bool(
        named(ctx.row.tallies, int(ctx.param(CONFIRM_REDS)), flake_rate=rate, confidence=confidence)
    )


@CULPRIT.condition(parameters=[FLAKE_AWARE, FLAKE_RATE_PERCENT, CONFIDENCE_PERCENT])
def red_not_reproduced(ctx: SearchContext) -> bool:
    """Every red result is disproved by a green at or above it (with flake_aware: "no
    culprit" has reached the confidence asked for)."""
    tallies = ctx.row.tallies
    if not frontier(tallies)[1]:
        return True
    rate, confidence = _confidence(ctx)
    return bool(confidence) and posterior(tallies, rate)[0] >= confidence


@CULPRIT.condition(parameters=[MAX_PROBES])
def budget_spent(ctx: SearchContext) -> bool:
    """max_probes started, and none of them still in flight for a listed commit."""
    row = ctx.row
    return row.probes_started >= int(ctx.param(MAX_PROBES)) and not any(row.in_flight())


@CULPRIT.condition(parameters=[FLAKE_AWARE])
def flake_aware(ctx: SearchContext) -> bool:
    """The queue chooses probes by likelihood under a flake rate."""
    return bool(ctx.param(FLAKE_AWARE))


# --- actions ------------------------------------------------------------------------


@CULPRIT.action()
async def load_search(ctx: SearchContext) -> None:
    """Load the queue's config and search row, and which listed probe ended."""
    ctx.config = ctx.services.config.get(ctx.ended.queue)
    try:
        ctx.stored = await ctx.searches.get(ctx.ended.queue)
    except NotFound:
        ctx.stored = None
    ctx.search = ctx.stored or CulpritSearch(ctx.ended.queue)
    if ctx.ended.probe_of:
        ctx.probe = ctx.search.probe_for(ctx.ended.id)


@CULPRIT.action()
async def add_result(ctx: SearchContext) -> None:
    """Give the probe's slot back and keep its result (green or red; a cancelled build
    says nothing) for a listed commit of the open search."""
    probe, row = ctx.probe, ctx.row
    assert probe is not None
    row = evolve(row, probes=tuple(p for p in row.probes if p.request_id != probe.request_id))
    if row.state == SEARCHING and (ctx.outcome.green or ctx.outcome.red):
        row = row.with_result(probe.commit, ctx.outcome.green)
    ctx.search = row


@CULPRIT.action(parameters=[MAX_BLAMELIST])
async def list_blamelist(ctx: SearchContext) -> None:
    """Open a search for the red head: its blamelist is the commits of its first-parent
    line that the green it was built on does not reach (its newest recorded green
    ancestor when it was built in full), oldest first, the head last. Results the
    replaced search had for the same commits are kept; its probes in flight keep their
    slots."""
    head, old = ctx.ended, _without_lost_probes(ctx, ctx.row)
    ctx.replaced = old if _is_open(old) else None
    blamelist, base, reason = await _blamelist(ctx, head)
    kept = {c: t for c, t in zip(old.blamelist, old.tallies, strict=True)}
    tallies = tuple(kept.get(c, Tally()) for c in blamelist)
    if tallies:
        tallies = (*tallies[:-1], tallies[-1].with_result(False))  # the head's own red
    now = ctx.services.clock.now_ms()
    ctx.search = CulpritSearch(
        queue=head.queue,
        red_request_id=head.id,
        base_uri=base,
        blamelist=blamelist,
        tallies=tallies,
        probes=old.probes,
        reason=reason,
        started_at_ms=now,
        version=old.version,
    )


async def _blamelist(ctx: SearchContext, head: Request) -> tuple[tuple[str, ...], str, str]:
    """(blamelist, base, why there is none)."""
    source = ctx.services.source_control.for_queue(head.queue)
    if source is None:
        return (), "", NO_REPOSITORY
    base = head.base_uri
    if not base:
        queue = await ctx.services.queues.get(head.queue)
        kept = int(dict(ctx.config.parameters).get(RECENT_GREENS, 1))  # the gate's
        greens = greens_considered(queue.greens, kept)
        choice = await newest_green_ancestor(source, greens, head.uri)
        if choice.green is None:
            return (), "", NO_GREEN_BASE
        base = choice.green.uri
    bound = int(ctx.param(MAX_BLAMELIST))
    try:
        commits = await source.first_parents_after(base, head.uri, bound + 1)
    except NotFound:
        return (), base, ANCESTRY_UNKNOWN
    if len(commits) > bound:
        return (), base, TOO_LONG
    if not commits or commits[-1] != head.uri:
        return (), base, ANCESTRY_UNKNOWN
    return commits, base, ""


def _without_lost_probes(ctx: SearchContext, row: CulpritSearch) -> CulpritSearch:
    """``row`` without the probes listed longer than the queue's max_validation_ms (the
    gate's lease on a build; 0: never): a build nobody reported frees its slot when the
    search next chooses or a new search starts."""
    lease = int(dict(ctx.config.parameters).get(MAX_VALIDATION_MS, 0))
    return row.without_lost_probes(ctx.services.clock.now_ms(), lease)


async def _start(ctx: SearchContext, chosen: tuple[int, ...]) -> None:
    """List a probe of each chosen position within what is left of max_probes, in the
    row (ids minted now, in one step)."""
    row = ctx.row
    positions = chosen[: max(0, int(ctx.param(MAX_PROBES)) - row.probes_started)]
    if not positions:
        ctx.search = evolve(row, state=SEARCHING)
        return
    last = await ctx.counter.reserve(row.queue, len(positions))
    first = last - len(positions) + 1
    now = ctx.services.clock.now_ms()
    probes = tuple(
        Probe(format_request_id(row.queue, first + i), row.blamelist[at - 1], now)
        for i, at in enumerate(positions)
    )
    ctx.search = evolve(
        row,
        state=SEARCHING,
        probes=(*row.probes, *probes),
        probes_started=row.probes_started + len(probes),
    )


@CULPRIT.action(parameters=[PROBE_SLOTS, CONFIRM_REDS, MAX_PROBES])
async def choose_sections(ctx: SearchContext) -> None:
    """Probe the points that split what is left into equal sections, one per free probe
    slot (one slot: bisection), or rerun the candidate short of confirm_reds."""
    row = ctx.search = _without_lost_probes(ctx, ctx.row)
    chosen = section_probes(
        row.tallies, row.in_flight(), int(ctx.param(PROBE_SLOTS)), int(ctx.param(CONFIRM_REDS))
    )
    await _start(ctx, chosen)


@CULPRIT.action(
    parameters=[PROBE_SLOTS, CONFIRM_REDS, MAX_PROBES, FLAKE_RATE_PERCENT, CONFIDENCE_PERCENT]
)
async def choose_by_likelihood(ctx: SearchContext) -> None:
    """Probe where the likelihood of the culprit hypotheses splits evenly under
    flake_rate_percent, one per free probe slot."""
    row = ctx.search = _without_lost_probes(ctx, ctx.row)
    rate, confidence = _confidence(ctx)
    chosen = likelihood_probes(
        row.tallies,
        row.in_flight(),
        int(ctx.param(PROBE_SLOTS)),
        int(ctx.param(CONFIRM_REDS)),
        rate,
        confidence,
    )
    await _start(ctx, chosen)


@CULPRIT.action()
async def end_search(ctx: SearchContext) -> None:
    """End the search without a culprit; why is the condition that ended it (or the
    reason the blamelist could not be listed)."""
    row = ctx.row
    reason = row.reason or _condition(ctx)
    ctx.search = evolve(row, reason=reason, ended_at_ms=ctx.services.clock.now_ms())


def _condition(ctx: SearchContext) -> str:
    step = ctx.via
    if step is None or step.transition is None or not step.transition.conditions:
        return ""
    return step.transition.conditions[0].name


@CULPRIT.action()
async def name_culprit(ctx: SearchContext) -> None:
    """Name the first red commit whose parent is green."""
    row = ctx.row
    _, hi = frontier(row.tallies)
    ctx.search = evolve(row, culprit=row.blamelist[hi - 1], ended_at_ms=ctx.services.clock.now_ms())


@CULPRIT.action(provides=[SEARCH_SAVED])
async def save_search(ctx: SearchContext) -> None:
    """Write the row by compare-and-set, in the state this event reached while the search
    is open (a search that ended stays as it ended). A lost race retries the whole event:
    the outcome is redelivered and decided on the new row."""
    row = ctx.row
    if row.state in ("", SEARCHING) and ctx.via is not None:
        row = evolve(row, state=ctx.via.dest)
    try:
        if ctx.stored is None:
            row = row.with_version(1)
            await ctx.searches.create(row)
        else:
            old = ctx.stored.version
            await ctx.searches.update(row, old, old + 1)
            row = row.with_version(old + 1)
    except (VersionMismatch, AlreadyExists):
        raise Retryable(f"queue {row.queue!r}: search row changed meanwhile") from None
    ctx.search = row
    if ctx.replaced is not None:
        # Tagged with this write's version: the replaced search's own notes have its own.
        await _note_search(ctx, ctx.replaced, "unresolved", "newer red head", tag=row.version)
    await _note_search(ctx, row, row.state, row.reason, tag=row.version)


async def _note_search(
    ctx: SearchContext, row: CulpritSearch, state: str, reason: str, *, tag: int
) -> None:
    """Note where the search of ``row.red_request_id`` stands, on the red head's trail
    (``tag``: the version of the search row's write this note is about)."""
    head = ctx.ended  # the red head itself, when its end opened the search
    if head.id != row.red_request_id:
        try:
            head = await ctx.services.requests.get(row.red_request_id)
        except NotFound:
            return
    lo, hi = frontier(row.tallies)
    await note(
        ctx.services,
        CULPRIT_NOTE,
        head,
        tag=f"{tag}",
        state=state,
        culprit=row.culprit,
        reason=reason,
        blamelist=len(row.blamelist),
        green_through=lo,
        red_from=hi,
        probes_started=row.probes_started,
        in_flight=len(row.probes),
    )


@CULPRIT.action(requires=[SEARCH_SAVED])
async def record_green_parent(ctx: SearchContext) -> None:
    """A green probe of the highest green commit of the blamelist is recorded as its
    queue's newest green (the base rule builds on it), unless trunk went green again."""
    probe, row = ctx.probe, ctx.row
    if probe is None or not ctx.outcome.green:
        return
    lo, _ = frontier(row.tallies)
    if not lo or row.blamelist[lo - 1] != probe.commit:
        return
    below = (row.base_uri, *row.blamelist[: lo - 1])
    # ctx.ended is the probe, as record ended it (its id is the listed probe's).
    await ctx.services.lifecycle.record_probe_green(ctx.ended, below)


@CULPRIT.action()
async def ensure_probes(ctx: SearchContext) -> None:
    """Make sure each probe the row lists has its request and its build: a probe whose
    start is not noted is stored (if missing), published to build and noted."""
    row = ctx.search
    if row is None:
        return
    services = ctx.services
    for probe in row.probes:
        if await services.trail.has(probe.request_id, ADMITTED):
            continue
        try:
            request = await services.lifecycle.start_probe(
                probe.request_id,
                row.queue,
                probe.commit,
                probe_of=row.red_request_id,
                base=row.base_uri,
            )
        except AlreadyExists:
            request = await services.requests.get(probe.request_id)
        await services.publisher.publish_build(row.queue, probe.request_id)
        services.metrics.count("probes_started", row.queue)
        await note(
            services,
            PROBE_STARTED,
            request,
            commit=probe.commit,
            position=row.position(probe.commit),
            blamelist=len(row.blamelist),
            for_head=request.probe_of,
        )
        await note(services, ADMITTED, request, probe_of=request.probe_of)


@CULPRIT.action(requires=[SEARCH_SAVED])
async def announce_culprit(ctx: SearchContext) -> None:
    """Announce validation.repository.culprit_found: the culprit, its green parent and
    the evidence."""
    await _announce_replaced(ctx)
    row = ctx.row
    at = row.position(row.culprit)
    tally = row.tallies[at - 1]
    parent = row.blamelist[at - 2] if at > 1 else row.base_uri
    await _announce(
        ctx,
        row,
        True,
        culprit=row.culprit,
        green_parent=parent,
        reds=str(tally.reds),
        blamelist=str(len(row.blamelist)),
        probes=str(row.probes_started),
    )


@CULPRIT.action(requires=[SEARCH_SAVED])
async def announce_unresolved(ctx: SearchContext) -> None:
    """Announce validation.repository.culprit_unresolved, with why."""
    await _announce_replaced(ctx)
    row = ctx.row
    blamelist, probes = str(len(row.blamelist)), str(row.probes_started)
    await _announce(ctx, row, False, reason=row.reason, blamelist=blamelist, probes=probes)


async def _announce_replaced(ctx: SearchContext) -> None:
    old = ctx.replaced
    if old is not None:
        await _announce(ctx, old, False, reason="newer red head", probes=str(old.probes_started))


async def _announce(ctx: SearchContext, row: CulpritSearch, found: bool, **evidence: str) -> None:
    services = ctx.services
    event = culprit_event(
        found, row.queue, row.red_request_id, row.version, services.clock.now_ms(), evidence
    )
    await services.publisher.publish_hook(event)
    services.metrics.count("culprits_found" if found else "culprits_unresolved", row.queue)


@dataclass(eq=False)
class CulpritFinder:
    """Runs ``culprit.yaml`` for each build record ends (a head's or a probe's)."""

    machine: CompiledFlow
    services: StageServices
    searches: SearchStore
    counter: Counter
    _: KW_ONLY
    offload: bool = False
    #: Told the name of each action once it ran (the model checker crashes there).
    probe: StepProbe | None = None

    async def ended(self, request: Request, outcome: Outcome) -> str:
        """Run the search machine for ``request``'s end with ``outcome``; the terminal
        state reached. Raises ``Retryable`` on a lost race (the caller retries)."""
        ctx = SearchContext(self.services, self.searches, self.counter, request, outcome)
        return await self.machine.run(ctx, probe=self.probe, offload=self.offload)

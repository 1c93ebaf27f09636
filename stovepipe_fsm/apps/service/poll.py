"""``poll``: report every commit pushed to real git refs to ingest.

Each round resolves every ref and ingests, per ref, the first-parent commits it gained
since the commit reported last for it (its cursor), oldest first, all refs' heads in one
batch (:meth:`Ingest.ingest_many`, so the broker operations are pipelined). Two commits
pushed between two rounds are two heads: a queue that validates every head validates
both, a coalescing one supersedes the older on sight.

The cursor is stored in the broker (:mod:`...adapters.jetstream.ref_cursors`), shared with
``webhook``, and moved
by compare-and-set only after its commits were ingested, so a poller restarted at any
moment neither skips a range nor ingests one twice; a repeat after a crash between the
two finds every head in ingest's dedup index and creates nothing. Rules at the edges:

- no cursor yet (the first round ever for the ref): the tip only, never the history;
- the cursor is no longer an ancestor of the tip (a force-push rewrote the branch): the
  new tip only, reported as ``rewritten``; a ref moved back to a head the queue had moved
  on from is ingested as a new head and validated again (``at_head``);
- a cursor a push moved (``webhook``) that the tip does not descend from: the clone is
  not fetched that far yet, reported as ``behind``, nothing ingested; and a tip that
  does descend from it is no return (a clone not fetched since a rollback the push
  reported would undo it): forced pushes are the webhook's to report;
- more than ``max_commits`` new commits: the oldest ``max_commits``, the cursor moved to
  the last of them, and ``pending`` says how many wait; ``poll_forever`` goes on at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...adapters.git import GitSourceControl, rev_parse
from ...adapters.jetstream import Topology, open_cell
from ...adapters.jetstream.ref_cursors import POLL, WEBHOOK, KvRefCursors, RefCursor
from ...domain.errors import NotFound, Retryable
from ...pipeline.ingest import Head, Ingest
from .connect import NatsOptions, connected
from .operators import ingest_on

log = logging.getLogger("stovepipe_fsm.poll")

#: New commits of one ref a round ingests at most (a huge push takes several rounds).
MAX_COMMITS = 1_000


@dataclass(frozen=True)
class PollTarget:
    repository: Path
    ref: str
    queue: str


@dataclass(frozen=True)
class Poller:
    """Ingest, and the cursors of the refs it follows."""

    ingest: Ingest
    cursors: KvRefCursors


@dataclass(frozen=True)
class _Plan:
    """What a round ingests for one ref: ``commits`` oldest first."""

    target: PollTarget
    cursor: RefCursor
    tip: str
    commits: tuple[str, ...]
    pending: int
    rewritten: bool
    #: The cursor is a push's commit this clone's tip does not reach: nothing to ingest.
    behind: bool = False

    @property
    def observed(self) -> bool:
        """The tip is the ref's head on this clone's word: a return to it is validated
        again. Not when a push reported the ref last: the forge's word is newer than a
        clone that may not have fetched a rollback yet."""
        return self.cursor.reporter != WEBHOOK


@contextlib.asynccontextmanager
async def operator_poller(
    options: NatsOptions, topology: Topology, machines_dir: str
) -> AsyncIterator[Poller]:
    """A poller on the broker's stores (the topology is created if missing)."""
    async with connected(options) as nc:
        js = nc.jetstream()
        ingest = await ingest_on(js, topology, machines_dir)
        yield Poller(ingest, KvRefCursors(await open_cell(js, topology.service_bucket)))


async def _plan(poller: Poller, target: PollTarget, max_commits: int) -> _Plan:
    tip, cursor = await asyncio.gather(
        rev_parse(target.repository, target.ref), poller.cursors.read(target.queue, target.ref)
    )
    if not cursor.commit or cursor.commit == tip:
        return _Plan(target, cursor, tip, (tip,), 0, rewritten=False)
    found = await GitSourceControl(target.repository, cache_size=0).first_parents_since(
        cursor.commit, tip, limit=max_commits
    )
    if found is None and cursor.reporter != POLL:
        log.info(
            "poll %s %s: the ref was reported at %s by a push; this clone is at %s, "
            "not fetched that far yet",
            target.repository,
            target.ref,
            cursor.commit,
            tip,
        )
        return _Plan(target, cursor, tip, (), 0, rewritten=False, behind=True)
    if found is None:
        log.warning(
            "poll %s %s: %s is no longer an ancestor of %s (the branch was rewritten); "
            "ingesting the new tip only",
            target.repository,
            target.ref,
            cursor.commit,
            tip,
        )
        return _Plan(target, cursor, tip, (tip,), 0, rewritten=True)
    return _Plan(target, cursor, tip, found.commits or (tip,), found.pending, rewritten=False)


async def poll_round(
    poller: Poller,
    targets: Sequence[PollTarget],
    *,
    strict: bool = True,
    max_commits: int = MAX_COMMITS,
) -> list[dict[str, object]]:
    """Read every ref's new commits, ingest them all as one batch, then move the cursors.

    ``strict``: a ref that names no commit (or a transient failure) raises; otherwise it
    is logged and left out of this round. One report per ref, about its newest commit
    ingested, the ones before it in ``earlier``.
    """
    if max_commits < 1:
        raise ValueError(f"max_commits must be >= 1, got {max_commits}")
    planned = await asyncio.gather(
        *(_plan(poller, t, max_commits) for t in targets), return_exceptions=True
    )
    plans: list[_Plan] = []
    for target, plan in zip(targets, planned, strict=True):
        if isinstance(plan, BaseException):
            if strict or not isinstance(plan, NotFound | Retryable):
                raise plan
            log.warning("poll %s %s: %s", target.repository, target.ref, plan)
            continue
        plans.append(plan)
    heads = [
        Head(plan.target.queue, commit, at_head=commit == plan.tip and plan.observed)
        for plan in plans
        for commit in plan.commits
    ]
    results = iter(await poller.ingest.ingest_many(heads))
    reports: list[dict[str, object]] = []
    for plan in plans:
        if plan.behind:
            reports.append(_behind_report(plan))
            continue
        ingested = [(commit, next(results)) for commit in plan.commits]
        moved = plan.commits[-1] != plan.cursor.commit
        if moved and not await poller.cursors.advance(
            plan.cursor,
            plan.commits[-1],
            reporter=POLL,
            older=plan.commits[-2::-1],
            continues=not plan.rewritten,
        ):
            log.info(
                "poll %s %s: another poller moved the cursor first",
                plan.target.queue,
                plan.target.ref,
            )
        uri, last = ingested[-1]
        reports.append(
            {
                "queue": plan.target.queue,
                "ref": plan.target.ref,
                "uri": uri,
                "request_id": last.request_id,
                "created": last.created,
                "published": last.published,
                "returned": last.returned,
                "since": plan.cursor.commit,
                "commits": len(ingested),
                "earlier": [
                    {"uri": commit, "request_id": result.request_id, "created": result.created}
                    for commit, result in ingested[:-1]
                ],
                "pending": plan.pending,
                "rewritten": plan.rewritten,
                "behind": False,
            }
        )
    return reports


def _behind_report(plan: _Plan) -> dict[str, object]:
    return {
        "queue": plan.target.queue,
        "ref": plan.target.ref,
        "uri": plan.tip,
        "since": plan.cursor.commit,
        "commits": 0,
        "earlier": [],
        "pending": 0,
        "rewritten": False,
        "behind": True,
    }


async def poll_forever(
    poller: Poller,
    targets: Sequence[PollTarget],
    *,
    interval_s: float,
    stop: asyncio.Event,
    report: Callable[[dict[str, object]], None],
    max_commits: int = MAX_COMMITS,
) -> None:
    """Poll every ``interval_s`` until ``stop`` is set; transient errors wait a round, a
    round that left commits pending is followed at once by the next."""
    last: dict[tuple[str, str], str] = {}
    while not stop.is_set():
        try:
            outcomes = await poll_round(poller, targets, strict=False, max_commits=max_commits)
        except (NotFound, Retryable) as exc:
            log.warning("poll round: %s", exc)
            outcomes = []
        for outcome in outcomes:
            key = (str(outcome["ref"]), str(outcome["queue"]))
            if outcome["uri"] != last.get(key):
                report(outcome)
                last[key] = str(outcome["uri"])
        if any(outcome["pending"] for outcome in outcomes):
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)


def print_report(outcome: dict[str, object]) -> None:
    print(json.dumps(outcome), flush=True)

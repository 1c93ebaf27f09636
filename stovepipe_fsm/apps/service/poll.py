"""``poll``: report each new head of real git refs to ingest.

The poller is stateless on purpose: every round it resolves the ref and ingests the
commit it names, as what the ref names now (``at_head``). Ingest dedups on (queue, uri),
so an unchanged head creates nothing and publishes nothing once its request left
``accepted``, and a poller restarted at any moment neither loses nor repeats a head. A
ref that moved back to a head the queue had moved on from (a rollback by force-push) is
ingested as a new head and validated again. Heads that landed and were overtaken between
two rounds are never seen; that is the coalescing the process stage would do anyway.

One process follows many refs (each into its queue): a round resolves every ref at once
and hands all the heads to :meth:`Ingest.ingest_many`, so the broker operations of a round
are pipelined instead of one ref after another.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...adapters.git import rev_parse
from ...domain.errors import NotFound, Retryable
from ...pipeline.ingest import Head, Ingest

log = logging.getLogger("stovepipe_fsm.poll")


@dataclass(frozen=True)
class PollTarget:
    repository: Path
    ref: str
    queue: str


async def poll_once(ingest: Ingest, target: PollTarget) -> dict[str, object]:
    """Resolve the ref and ingest its commit; NotFound when the ref names no commit."""
    return (await poll_round(ingest, [target], strict=True))[0]


async def poll_round(
    ingest: Ingest, targets: Sequence[PollTarget], *, strict: bool = True
) -> list[dict[str, object]]:
    """Resolve every ref, then ingest all their heads as one batch.

    ``strict``: a ref that names no commit (or a transient failure) raises; otherwise it
    is logged and left out of this round.
    """
    resolved = await asyncio.gather(
        *(rev_parse(t.repository, t.ref) for t in targets), return_exceptions=True
    )
    found: list[tuple[PollTarget, str]] = []
    for target, head in zip(targets, resolved, strict=True):
        if isinstance(head, BaseException):
            if strict or not isinstance(head, NotFound | Retryable):
                raise head
            log.warning("poll %s %s: %s", target.repository, target.ref, head)
            continue
        found.append((target, head))
    results = await ingest.ingest_many(Head(t.queue, head, at_head=True) for t, head in found)
    return [
        {
            "queue": target.queue,
            "ref": target.ref,
            "uri": head,
            "request_id": result.request_id,
            "created": result.created,
            "published": result.published,
            "returned": result.returned,
        }
        for (target, head), result in zip(found, results, strict=True)
    ]


async def poll_forever(
    ingest: Ingest,
    targets: Sequence[PollTarget],
    *,
    interval_s: float,
    stop: asyncio.Event,
    report: Callable[[dict[str, object]], None],
) -> None:
    """Poll every ``interval_s`` until ``stop`` is set; transient errors wait a round."""
    last: dict[tuple[str, str], str] = {}
    while not stop.is_set():
        try:
            outcomes = await poll_round(ingest, targets, strict=False)
        except (NotFound, Retryable) as exc:
            log.warning("poll round: %s", exc)
            outcomes = []
        for outcome in outcomes:
            key = (str(outcome["ref"]), str(outcome["queue"]))
            if outcome["uri"] != last.get(key):
                report(outcome)
                last[key] = str(outcome["uri"])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)


def print_report(outcome: dict[str, object]) -> None:
    print(json.dumps(outcome), flush=True)

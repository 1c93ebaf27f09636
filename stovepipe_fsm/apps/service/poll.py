"""``poll``: report each new head of a real git ref to ingest.

The poller is stateless on purpose: every round it resolves the ref and ingests the
commit it names, as what the ref names now (``at_head``). Ingest dedups on (queue, uri),
so an unchanged head creates nothing and publishes nothing once its request left
``accepted``, and a poller restarted at any moment neither loses nor repeats a head. A
ref that moved back to a head the queue had moved on from (a rollback by force-push) is
ingested as a new head and validated again. Heads that landed and were overtaken between
two rounds are never seen; that is the coalescing the process stage would do anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...adapters.git import rev_parse
from ...domain.errors import NotFound, Retryable
from ...pipeline.ingest import Ingest

log = logging.getLogger("stovepipe_fsm.poll")


@dataclass(frozen=True)
class PollTarget:
    repository: Path
    ref: str
    queue: str


async def poll_once(ingest: Ingest, target: PollTarget) -> dict[str, object]:
    """Resolve the ref and ingest its commit; NotFound when the ref names no commit."""
    head = await rev_parse(target.repository, target.ref)
    result = await ingest.ingest(target.queue, head, at_head=True)
    return {
        "queue": target.queue,
        "ref": target.ref,
        "uri": head,
        "request_id": result.request_id,
        "created": result.created,
        "published": result.published,
        "returned": result.returned,
    }


async def poll_forever(
    ingest: Ingest,
    target: PollTarget,
    *,
    interval_s: float,
    stop: asyncio.Event,
    report: Callable[[dict[str, object]], None],
) -> None:
    """Poll every ``interval_s`` until ``stop`` is set; transient errors wait a round."""
    last = ""
    while not stop.is_set():
        try:
            outcome = await poll_once(ingest, target)
        except (NotFound, Retryable) as exc:
            log.warning("poll %s %s: %s", target.repository, target.ref, exc)
        else:
            if outcome["uri"] != last:
                report(outcome)
                last = str(outcome["uri"])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)


def print_report(outcome: dict[str, object]) -> None:
    print(json.dumps(outcome), flush=True)

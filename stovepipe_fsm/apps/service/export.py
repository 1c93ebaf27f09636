"""``export``: a live deployment's recorded history as a timeline ``simulate`` can replay.

The request rows hold when each head was ingested and when it ended, and the policy
record says which outcome each terminal state is. From those, the timeline is the heads
as they were ingested and the outcomes the builds reported, at their real relative
times: ``ingest`` and ``complete`` steps, each batch followed by ``run``, separated by
``advance_ms`` and a ``run`` of what fell due meanwhile. What the stage decided (holds,
supersedes, admissions) is left out on purpose: replaying the timeline under a policy
decides it again, which is what ``whatif`` compares.

The commit history is taken to be first-parent trunk: each head's parent is the head
ingested before it on its queue (``history``), which is what a poller of one ref sees.
Where trunk was rewritten that is wrong, and the timeline says so in its description;
edit ``history`` there. A head that ended without a build (superseded, or failed closed
before admission) has no ``complete``; one still waiting or building at the export has
none either. Rows written before the stored times existed (layout 1) have no ingest time
and are left out, and counted.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import yaml
from nats.js import JetStreamContext

from ...adapters.jetstream import Topology
from ...adapters.jetstream.bulk import kv_snapshot
from ...adapters.jetstream.codec import decode_request
from ...adapters.jetstream.policy_record import read_policy_record
from ...config.globs import glob_match
from ...domain.entities import Request
from ...domain.errors import NonRetryable
from ...simulation.timeline_lines import SUFFIXES, timeline_lines
from .durations import parse_duration


@dataclass(frozen=True)
class Export:
    timeline: dict[str, Any]
    heads: int
    outcomes: int
    without_times: int


FORMATS = ("yaml", "jsonl")


def export_format(requested: str | None, out: str | None) -> str:
    """The format to write: the one asked for, else JSON lines for an ``--out`` named
    ``*.jsonl`` (or ``*.ndjson``), else YAML."""
    if requested:
        return requested
    return "jsonl" if out and out.lower().endswith(SUFFIXES) else "yaml"


def render_timeline(timeline: dict[str, Any], fmt: str) -> str:
    """The timeline as a file's text: YAML, or JSON lines (one header, a line per commit
    and per step), which ``simulate`` and ``whatif`` read without a YAML parser."""
    if fmt == "jsonl":
        return "".join(f"{line}\n" for line in timeline_lines(timeline))
    return yaml.safe_dump(timeline, sort_keys=False, allow_unicode=True)


def parse_since(text: str, now: datetime.datetime) -> int:
    """Epoch milliseconds of ``--since``: an ISO time (``2026-11-30T12:00:00Z``) or an age
    before ``now`` (``2h``, ``7d``). ``ValueError`` saying what is accepted."""
    try:
        return int((now.timestamp() - parse_duration(text)) * 1000)
    except ValueError:
        pass
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--since {text!r} is neither an ISO time (2026-11-30T12:00:00Z) nor an age "
            "(90m, 12h, 7d)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


def build_timeline(
    requests: list[Request],
    outcome_of_state: dict[str, str],
    *,
    since_ms: int,
    queue_glob: str,
    description: str,
) -> Export:
    """The timeline of ``requests`` ingested at or after ``since_ms`` on queues matching
    ``queue_glob``; ``outcome_of_state`` names the outcome each terminal state is."""
    events: list[tuple[int, int, str, dict[str, Any]]] = []
    heads = outcomes = without_times = 0
    for r in requests:
        if not glob_match(queue_glob, r.queue):
            continue
        if not r.ingested_at_ms:
            without_times += 1
            continue
        if r.ingested_at_ms < since_ms:
            continue
        target = {"uri": r.uri, "queue": r.queue}
        events.append((r.ingested_at_ms, 0, r.id, {"ingest": target}))
        heads += 1
        outcome = outcome_of_state.get(r.state)
        if outcome and r.build_strategy and r.ended_at_ms:
            events.append((r.ended_at_ms, 1, r.id, {"complete": {**target, "outcome": outcome}}))
            outcomes += 1
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    history: dict[str, list[str]] = {}
    previous: dict[str, str] = {}
    for _at, order, _rid, step in events:
        if order:
            continue
        ingest = step["ingest"]
        parent = previous.get(ingest["queue"])
        history.setdefault(ingest["uri"], [parent] if parent and parent != ingest["uri"] else [])
        previous[ingest["queue"]] = ingest["uri"]
    steps: list[Any] = []
    clock = events[0][0] if events else since_ms
    for at, _order, _rid, step in events:
        if at > clock:
            # What the last batch left due runs before time moves on, and what fell due
            # meanwhile runs before the next batch arrives.
            steps += ["run", {"advance_ms": at - clock}, "run"]
            clock = at
        steps.append(step)
    if steps:
        steps.append("run")
    queues = sorted({r.queue for r in requests if any(e[2] == r.id for e in events)})
    timeline: dict[str, Any] = {
        "description": description,
        "queue": queues[0] if queues else queue_glob,
        "history": history,
        "steps": steps,
    }
    return Export(timeline, heads, outcomes, without_times)


async def export_timeline(
    js: JetStreamContext,
    topology: Topology,
    *,
    since_ms: int,
    queue_glob: str,
) -> Export:
    """Read the request rows and the policy record; build the timeline."""
    requests = []
    for _key, value in await kv_snapshot(js, topology.requests_bucket):
        try:
            requests.append(decode_request(value))
        except NonRetryable:
            continue  # status lists damaged rows; a history cannot use them
    record = await read_policy_record(js, topology)
    declared = record.outcomes if record is not None else {}
    outcome_of_state = {state: name for name, states in declared.items() for state in states}
    since = datetime.datetime.fromtimestamp(since_ms / 1000, datetime.UTC)
    description = (
        f"exported from {topology.prefix} since {since.strftime('%Y-%m-%dT%H:%M:%SZ')} "
        f"for queues {queue_glob}: real ingests and build outcomes at their relative times; "
        "history assumes each head descends from the one ingested before it on its queue"
    )
    return build_timeline(
        requests,
        outcome_of_state,
        since_ms=since_ms,
        queue_glob=queue_glob,
        description=description,
    )

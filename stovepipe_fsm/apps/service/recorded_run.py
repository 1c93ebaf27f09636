"""A deployment's recorded run as a timeline: what ``export`` writes, from what it read.

The request rows say when each head was ingested, admitted and ended, and how; the
decision trail says which heads were dead-lettered and cancelled and when, and when
queues were paused and resumed; the repository says how the commits are related. From
those, the timeline holds, at their real relative times:

- each head as it came: ``ingest``; ``return`` for a commit trunk went back to (a
  rollback, a re-push: a new request for a commit seen before); ``retry`` for a request
  an operator's ``retry`` (or ``dlq replay``) made;
- ``failing`` right after the ingest of a head dead-lettered before it was admitted (its
  deliveries failed: the replay's fail too, and the runtime dead-letters it as it did),
  and ``dead_letter`` at its time for one dead-lettered after admission;
- ``cancel`` at an operator's cancel; a pause and a resume of a queue (or of a glob) as
  ``config`` steps setting ``paused`` for every exported queue it matched;
- ``run_ms`` between them, so each delivery and each build's end happens when it falls
  due, up to the time of the export;
- ``builds``: each build that ended with an outcome (when it was admitted, its duration
  from admission to end, and the outcome), in admission order, which end the builds a
  replay admits (simulation/builds.py); a culprit search's probe builds among them (a
  probe is a build, never a head: the replay's own search starts its probes).

What the stage decided (holds, supersedes, admissions, strategies) is left out on
purpose: a replay decides it again. ``history``/``changes`` are the repository's (real
parents, each commit's changes against its first parent) when one was read; otherwise
each head is taken to descend from the head ingested before it on its queue, and the
description says so. Rows without an ingest time (a release before times were stored)
are left out, and counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...adapters.git.history import RecordedHistory
from ...config.globs import glob_match
from ...domain.entities import Request
from ...domain.ids import parse_request_id
from ...domain.trail_record import DEAD_LETTERED, OPERATOR, TrailRecord
from ...process.gate import PAUSED

#: The order of steps that happen at one instant: operator verbs about queues first
#: (a pause an ingest met), then heads, then what happened to heads.
_QUEUE_VERB, _HEAD, _AFTER_HEAD, _END = 0, 1, 2, 3


@dataclass(frozen=True)
class Export:
    timeline: dict[str, Any]
    heads: int
    outcomes: int
    without_times: int
    #: Returns to a seen commit, operator retries, failing heads, dead letters after
    #: admission, cancels, pauses and resumes written as steps.
    returns: int = 0
    retries: int = 0
    dead_letters: int = 0
    cancels: int = 0
    pauses: int = 0


@dataclass(frozen=True)
class Recorded:
    """What ``export`` read: the rows, the trail's records and the repository's graph."""

    requests: Sequence[Request]
    #: state -> the build outcome it is (the policy record's)
    outcome_of_state: Mapping[str, str]
    #: request id -> its trail records (those of requests that ended without a build)
    trails: Mapping[str, Sequence[TrailRecord]] = field(default_factory=dict)
    #: operator verbs about queues (pause, resume), oldest first
    queue_verbs: Sequence[TrailRecord] = ()
    history: RecordedHistory | None = None


def recorded_timeline(
    recorded: Recorded, *, since_ms: int, until_ms: int, queue_glob: str, description: str
) -> Export:
    """The timeline of the requests ingested from ``since_ms`` on, on the queues
    ``queue_glob`` matches, up to ``until_ms`` (module docstring)."""
    chosen, without_times = _chosen(recorded.requests, since_ms, queue_glob)
    # A probe of a culprit search is a build, not a head: a replay's own search starts it.
    heads = [r for r in chosen if not r.probe_of]
    events: list[tuple[int, int, int, dict[str, Any]]] = []
    counts = {"returns": 0, "retries": 0, "dead_letters": 0, "cancels": 0, "pauses": 0}
    seen: set[tuple[str, str]] = set()
    for r in sorted(heads, key=lambda r: (r.queue, parse_request_id(r.id).counter)):
        target = {"uri": r.uri, "queue": r.queue}
        n = parse_request_id(r.id).counter
        if r.retry_of:
            kind = "retry"
            counts["retries"] += 1
        elif (r.queue, r.uri) in seen:
            kind = "return"
            counts["returns"] += 1
        else:
            kind = "ingest"
        seen.add((r.queue, r.uri))
        events.append((r.ingested_at_ms, _HEAD, n, {kind: target}))
        for record in recorded.trails.get(r.id, ()):
            if record.kind == DEAD_LETTERED:
                counts["dead_letters"] += 1
                if r.build_strategy:
                    events.append((record.at_ms, _END, n, {"dead_letter": target}))
                else:
                    events.append((r.ingested_at_ms, _AFTER_HEAD, n, {"failing": target}))
            elif record.kind == OPERATOR and record.details.get("verb") == "cancel":
                counts["cancels"] += 1
                events.append((record.at_ms, _END, n, {"cancel": target}))
    queues = sorted({r.queue for r in heads})
    for record in recorded.queue_verbs:
        verb = record.details.get("verb")
        if verb not in ("pause", "resume") or record.at_ms < since_ms:
            continue
        matched = [q for q in queues if glob_match(record.queue, q)]
        for queue in matched:
            verb_step: dict[str, Any] = {"config": {"queue": queue, PAUSED: verb == "pause"}}
            events.append((record.at_ms, _QUEUE_VERB, 0, verb_step))
        counts["pauses"] += bool(matched)
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    steps: list[Any] = []
    clock = events[0][0] if events else since_ms
    builds = _builds(chosen, recorded.outcome_of_state, clock)
    for at, _order, _n, step in events:
        if at > clock:
            steps.append({"run_ms": at - clock})
            clock = at
        steps.append(step)
    if events:
        steps.append({"run_ms": max(until_ms - clock, 0)})
    timeline: dict[str, Any] = {
        "description": description,
        "queue": queues[0] if queues else queue_glob,
    }
    if recorded.history is not None:
        timeline["history"] = recorded.history.parents
        changes = {c: paths for c, paths in recorded.history.changes.items() if paths}
        if changes:
            timeline["changes"] = changes
    else:
        timeline["history"] = _assumed_history(heads)
    timeline["builds"] = builds
    timeline["steps"] = steps
    return Export(timeline, len(heads), len(builds), without_times, **counts)


def _chosen(
    requests: Iterable[Request], since_ms: int, queue_glob: str
) -> tuple[list[Request], int]:
    chosen, without_times = [], 0
    for r in requests:
        if not glob_match(queue_glob, r.queue):
            continue
        if not r.ingested_at_ms:
            without_times += 1
        elif r.ingested_at_ms >= since_ms:
            chosen.append(r)
    return chosen, without_times


def _builds(
    requests: Iterable[Request], outcome_of_state: Mapping[str, str], start_ms: int
) -> list[Any]:
    """Every build that ended with an outcome, in admission order, admitted at a time of
    the timeline's clock (which starts at ``start_ms``)."""
    ended = [
        r
        for r in requests
        if r.build_strategy and r.admitted_at_ms and r.ended_at_ms and outcome_of_state.get(r.state)
    ]
    ended.sort(key=lambda r: (r.admitted_at_ms, r.queue, parse_request_id(r.id).counter))
    return [
        {
            "uri": r.uri,
            "queue": r.queue,
            "admitted_ms": max(r.admitted_at_ms - start_ms, 0),
            "duration_ms": max(r.ended_at_ms - r.admitted_at_ms, 0),
            "outcome": outcome_of_state[r.state],
        }
        for r in ended
    ]


def _assumed_history(requests: Iterable[Request]) -> dict[str, list[str]]:
    """Each head a child of the head ingested before it on its queue (no repository)."""
    history: dict[str, list[str]] = {}
    previous: dict[str, str] = {}
    for r in sorted(requests, key=lambda r: (r.ingested_at_ms, r.queue, r.id)):
        parent = previous.get(r.queue)
        history.setdefault(r.uri, [parent] if parent and parent != r.uri else [])
        previous[r.queue] = r.uri
    return history

"""What ``whatif`` compares: figures per queue and in total for one timed run, and the
requests whose final outcome differs between two runs.

Every figure is an integer in the timeline's clock (ms) or a count, and every list is
sorted, so the same runs always give the same document.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ...domain.entities import FULL, Request
from ...domain.ids import parse_request_id
from ...simulation.timed import TimedRun

TOTAL = "total"


@dataclass(frozen=True)
class Figures:
    """One policy's figures for one queue (or for all of them)."""

    builds_full: int
    builds_incremental: int
    supersedes: int
    holds: int
    to_green_ms: tuple[int, ...]  # ingest -> green of every request that went green, sorted
    waits_ms: tuple[int, ...]  # ingest -> admitted of every admitted request, sorted
    #: Builds a newer head ended before their outcome (a policy with the preempt role).
    preempted: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "builds": {"full": self.builds_full, "incremental": self.builds_incremental},
            "supersedes": self.supersedes,
            "preempted": self.preempted,
            "holds": self.holds,
            "ingest_to_green_ms": {
                "count": len(self.to_green_ms),
                "p50": percentile(self.to_green_ms, 50),
                "p95": percentile(self.to_green_ms, 95),
                "max": self.to_green_ms[-1] if self.to_green_ms else None,
            },
            "longest_wait_for_slot_ms": self.waits_ms[-1] if self.waits_ms else None,
        }


def percentile(values: tuple[int, ...], p: int) -> int | None:
    """The nearest-rank percentile of sorted ``values`` (one of them, never interpolated);
    ``None`` when there are none."""
    if not values:
        return None
    rank = -(-p * len(values) // 100)  # ceil(p/100 * n), in integers
    return values[max(rank, 1) - 1]


def figures_by_queue(run: TimedRun) -> dict[str, Figures]:
    """The run's figures for every queue it saw, and under :data:`TOTAL` for all."""
    world = run.world
    roles = world.machines.roles
    green = roles.green_outcome.states
    requests = world.requests.snapshot()
    holds: dict[str, int] = {}
    for hold in world.hold_log:
        holds[hold.queue] = holds.get(hold.queue, 0) + 1
    by_queue: dict[str, list[Request]] = {queue: [] for queue in holds}
    for request in requests:
        by_queue.setdefault(request.queue, []).append(request)
    out = {q: _figures(by_queue[q], run, green, holds.get(q, 0)) for q in sorted(by_queue)}
    out[TOTAL] = _figures(requests, run, green, sum(holds.values()))
    return out


def _figures(
    requests: Iterable[Request], run: TimedRun, green: frozenset[str], holds: int
) -> Figures:
    roles = run.world.machines.roles
    full = incremental = supersedes = preempted = 0
    to_green: list[int] = []
    waits: list[int] = []
    for request in requests:
        times = run.times.get(request.id)
        if request.build_strategy:
            if request.build_strategy == FULL:
                full += 1
            else:
                incremental += 1
        if request.state in roles.superseded_states:
            supersedes += 1
        elif request.state in roles.preempted_states:
            preempted += 1
        if times is None:
            continue
        if times.admitted_ms is not None:
            waits.append(times.admitted_ms - times.ingest_ms)
        if request.state in green and times.ended_ms is not None:
            to_green.append(times.ended_ms - times.ingest_ms)
    return Figures(
        full,
        incremental,
        supersedes,
        holds,
        tuple(sorted(to_green)),
        tuple(sorted(waits)),
        preempted,
    )


@dataclass(frozen=True)
class Difference:
    """A request (a head of a queue) that ends differently under the two policies."""

    queue: str
    uri: str
    request_id: str
    outcome: str
    vs_outcome: str

    def as_json(self) -> dict[str, str]:
        return {
            "queue": self.queue,
            "uri": self.uri,
            "request_id": self.request_id,
            "outcome": self.outcome,
            "vs_outcome": self.vs_outcome,
        }


@dataclass(frozen=True)
class RunSummary:
    """What the comparison needs of one run: its figures, the fate of its outcomes, and
    every head's final state. Plain data, so a run replayed in another process can send
    it back (:mod:`.parallel`)."""

    figures: dict[str, Figures]
    completes: dict[str, int]
    final: dict[tuple[str, str], tuple[str, str]]  # (queue, uri) -> (state, request id)


def summarize(run: TimedRun) -> RunSummary:
    completes = {
        "applied": run.completes_applied,
        "dropped": run.completes_dropped,
        "waiting": run.completes_waiting,
    }
    final = {(r.queue, r.uri): (r.state, r.id) for r in run.world.requests.snapshot()}
    return RunSummary(figures_by_queue(run), completes, final)


def differences(run: RunSummary, vs: RunSummary) -> list[Difference]:
    """Heads whose final state differs, by queue and ingest order. A head is the same
    head under both policies when it is the same commit of the same queue."""
    mine, theirs = run.final, vs.final
    found: list[tuple[tuple[str, int, str], Difference]] = []
    for key in mine.keys() | theirs.keys():
        a, b = mine.get(key), theirs.get(key)
        state_a = a[0] if a else "-"
        state_b = b[0] if b else "-"
        if state_a != state_b:
            rid = (a or b)[1]  # type: ignore[index]
            order = (key[0], parse_request_id(rid).counter, key[1])
            found.append((order, Difference(key[0], key[1], rid, state_a, state_b)))
    found.sort(key=_first)
    return [difference for _, difference in found]


def _first(pair: tuple[tuple[str, int, str], Difference]) -> tuple[str, int, str]:
    return pair[0]

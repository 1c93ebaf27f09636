"""The figures of one policy's replay, per queue and in total: one function of one run.

:func:`figures_by_queue` reads a finished :class:`~...simulation.timed.TimedRun` and
nothing else, so a comparison of two policies or of many computes each column the same
way. Every figure is a count or an integer in the timeline's clock (ms), but slot-hours
(rounded to a thousandth), and every list is sorted: the same run always gives the same
figures.

- builds full / incremental: requests admitted, by the strategy admission wrote;
  skipped: heads the policy ended without a build (its skip role);
- wasted speculative builds: builds admitted while another build of the queue was
  running whose verdict decided nothing: they ended without an outcome (cancelled),
  or a newer head of the queue had already gone green when they ended;
- preempted: builds a newer head ended before their outcome (a policy that declares the
  preempt role); they count as wasted speculative builds too;
- slot-hours: the time every admitted request held its slot (admission to end, or to
  the end of the replay for one still building);
- ingest->green: from ingest to the end of every request that went green;
- longest wait: the longest time from a request's ingest to its admission.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ...domain.entities import FULL, Request
from ...domain.ids import parse_request_id
from ...simulation.timed import RequestTimes, TimedRun

TOTAL = "total"
MS_PER_HOUR = 3_600_000


@dataclass(frozen=True)
class Figures:
    """One policy's figures for one queue (or for all of them)."""

    builds_full: int
    builds_incremental: int
    supersedes: int
    holds: int
    to_green_ms: tuple[int, ...]  # ingest -> green of every request that went green, sorted
    waits_ms: tuple[int, ...]  # ingest -> admitted of every admitted request, sorted
    builds_skipped: int = 0
    wasted_speculative: int = 0
    slot_ms: int = 0
    #: Builds a newer head ended before their outcome (a policy with the preempt role).
    preempted: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "builds": {
                "full": self.builds_full,
                "incremental": self.builds_incremental,
                "skipped": self.builds_skipped,
            },
            "supersedes": self.supersedes,
            "preempted": self.preempted,
            "holds": self.holds,
            "wasted_speculative_builds": self.wasted_speculative,
            "slot_hours": round(self.slot_ms / MS_PER_HOUR, 3),
            "ingest_to_green_ms": {
                "count": len(self.to_green_ms),
                "p50": percentile(self.to_green_ms, 50),
                "p95": percentile(self.to_green_ms, 95),
                "max": self.to_green_ms[-1] if self.to_green_ms else None,
            },
            "longest_wait_for_slot_ms": self.waits_ms[-1] if self.waits_ms else None,
        }


EMPTY = Figures(0, 0, 0, 0, (), ())


def percentile(values: tuple[int, ...], p: int) -> int | None:
    """The nearest-rank percentile of sorted ``values`` (one of them, never interpolated);
    ``None`` when there are none."""
    if not values:
        return None
    rank = -(-p * len(values) // 100)  # ceil(p/100 * n), in integers
    return values[max(rank, 1) - 1]


def figures_by_queue(run: TimedRun) -> dict[str, Figures]:
    """The run's figures for every queue it saw, and under :data:`TOTAL` for all: of its
    trunk heads (a culprit search's probe builds are counted apart, :mod:`.culprits`)."""
    world = run.world
    requests = [r for r in world.requests.snapshot() if not r.probe_of]
    holds: dict[str, int] = {}
    for hold in world.hold_log:
        holds[hold.queue] = holds.get(hold.queue, 0) + 1
    by_queue: dict[str, list[Request]] = {queue: [] for queue in holds}
    for request in requests:
        by_queue.setdefault(request.queue, []).append(request)
    wasted = _wasted_speculative(run, by_queue)
    out = {
        q: _figures(by_queue[q], run, holds.get(q, 0), wasted.get(q, 0)) for q in sorted(by_queue)
    }
    out[TOTAL] = _figures(requests, run, sum(holds.values()), sum(wasted.values()))
    return out


def _figures(requests: Iterable[Request], run: TimedRun, holds: int, wasted: int) -> Figures:
    roles = run.world.machines.roles
    green = roles.green_outcome.states
    end_ms = run.world.clock.now_ms()
    full = incremental = supersedes = skipped = preempted = slot_ms = 0
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
        if request.state in roles.skipped_states:
            skipped += 1
        if times is None:
            continue
        if times.admitted_ms is not None:
            waits.append(times.admitted_ms - times.ingest_ms)
            slot_ms += _ended(times, end_ms) - times.admitted_ms
        if request.state in green and times.ended_ms is not None:
            to_green.append(times.ended_ms - times.ingest_ms)
    return Figures(
        full,
        incremental,
        supersedes,
        holds,
        tuple(sorted(to_green)),
        tuple(sorted(waits)),
        skipped,
        wasted,
        slot_ms,
        preempted,
    )


def _ended(times: RequestTimes, end_ms: int) -> int:
    return times.ended_ms if times.ended_ms is not None else end_ms


def _wasted_speculative(run: TimedRun, by_queue: dict[str, list[Request]]) -> dict[str, int]:
    """Per queue, the speculative builds whose verdict decided nothing (module docstring).

    One sweep per queue in admission order (a build is speculative when one admitted
    before it, or at the same instant, still runs), and a suffix minimum of green times
    by ingest order (a newer head went green before it ended).
    """
    roles = run.world.machines.roles
    green = roles.green_outcome.states
    outcome_states = frozenset().union(*(o.states for o in roles.outcomes.values()))
    end_ms = run.world.clock.now_ms()
    out: dict[str, int] = {}
    for queue, requests in by_queue.items():
        built = sorted(
            (t.admitted_ms, parse_request_id(r.id).counter, r, t)
            for r in requests
            if (t := run.times.get(r.id)) is not None and t.admitted_ms is not None
        )
        greens = sorted(
            (n, t.ended_ms) for _, n, r, t in built if r.state in green and t.ended_ms is not None
        )
        counters = [n for n, _ in greens]
        first_green_after = [0] * len(greens)  # min green time of greens[i:]
        soonest = None
        for i in range(len(greens) - 1, -1, -1):
            soonest = greens[i][1] if soonest is None else min(soonest, greens[i][1])
            first_green_after[i] = soonest
        starts = [at for at, _, _, _ in built]
        count = 0
        running_until = -1  # the latest end of the builds admitted so far
        for at, n, request, times in built:
            shared = bisect_right(starts, at) - bisect_left(starts, at) > 1
            speculative = shared or running_until > at
            running_until = max(running_until, _ended(times, end_ms + 1))
            if not speculative or times.ended_ms is None:
                continue
            i = bisect_right(counters, n)
            overtaken = i < len(greens) and first_green_after[i] <= times.ended_ms
            if overtaken or request.state not in outcome_states:
                count += 1
        out[queue] = count
    return out

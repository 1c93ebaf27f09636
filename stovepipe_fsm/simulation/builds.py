"""Builds as part of a replay: each build the replay admits ends by itself, after a
duration and with an outcome taken from what a live run recorded.

A timeline exported from a live run lists that run's builds (``builds:``, in admission
order): each commit's duration (admission to outcome) and outcome. A replay that admits
a head starts its build at that instant and ends it:

- for a commit the live run built: after that build's duration, with its outcome (a
  commit built twice live, after a rollback or a retry, gives its builds in turn);
- for a commit never built live (the live run superseded or skipped it): after a
  duration drawn from the queue's recorded ones (all queues' when it has none) by a
  generator seeded with the replay's seed, and with the outcome of the first recorded
  build, in admission order, whose commit contains it (descends from it); without one,
  the green outcome. Such an outcome is *inferred*, and counted.

So no admitted head holds its slot for want of an outcome, and a replay under another
policy (more slots, another gate) meets the build times the live run had. A build whose
request ended meanwhile (cancelled, failed closed) ends without effect.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..adapters.memory.source_control import MemorySourceControl
from ..domain.errors import NotFound
from ..located.errors import Location


@dataclass(frozen=True)
class RecordedBuild:
    """A build a live run recorded: its commit, how long it ran and how it ended."""

    queue: str
    uri: str
    duration_ms: int
    outcome: str
    location: Location


@dataclass(frozen=True)
class Started:
    """A build the replay started: when it ends, and with which outcome."""

    due_ms: int
    order: int
    request_id: str
    outcome: str
    inferred: bool


@dataclass
class BuildModel:
    """The recorded builds and the builds a replay has running (module docstring)."""

    recorded: Sequence[RecordedBuild]
    graph: MemorySourceControl
    green_outcome: str
    seed: int = 0
    started: set[str] = field(default_factory=set)
    running: list[tuple[int, int, Started]] = field(default_factory=list)  # a heap
    inferred: int = 0
    from_record: int = 0
    _used: dict[tuple[str, str], int] = field(default_factory=dict)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._by_commit: dict[tuple[str, str], list[RecordedBuild]] = {}
        self._durations: dict[str, list[int]] = {}
        for build in self.recorded:
            self._by_commit.setdefault((build.queue, build.uri), []).append(build)
            self._durations.setdefault(build.queue, []).append(build.duration_ms)
        self._all_durations = [b.duration_ms for b in self.recorded]

    def start(self, queue: str, uri: str, request_id: str, now_ms: int) -> None:
        """The build of ``request_id`` (commit ``uri``) starts at ``now_ms``; once per
        request (a re-published build is the same build)."""
        if request_id in self.started:
            return
        self.started.add(request_id)
        key = (queue, uri)
        builds = self._by_commit.get(key)
        if builds:
            n = self._used.get(key, 0)
            self._used[key] = n + 1
            build = builds[min(n, len(builds) - 1)]
            duration, outcome, inferred = build.duration_ms, build.outcome, False
            self.from_record += 1
        else:
            durations = self._durations.get(queue) or self._all_durations
            duration = self._rng.choice(durations) if durations else 0
            outcome, inferred = self._outcome_containing(queue, uri), True
            self.inferred += 1
        ends = Started(now_ms + duration, len(self.started), request_id, outcome, inferred)
        heapq.heappush(self.running, (ends.due_ms, ends.order, ends))

    def next_due_ms(self) -> int | None:
        return self.running[0][0] if self.running else None

    def pop_due(self, now_ms: int) -> Started | None:
        """The first build that ends at or before ``now_ms``, taken off the running."""
        if self.running and self.running[0][0] <= now_ms:
            return heapq.heappop(self.running)[2]
        return None

    def _outcome_containing(self, queue: str, uri: str) -> str:
        for build in self.recorded:
            if build.queue == queue and self._contains(build.uri, uri):
                return build.outcome
        return self.green_outcome

    def _contains(self, head: str, commit: str) -> bool:
        """Whether ``head`` is ``commit`` or descends from it in the graph."""
        try:
            return self.graph.reaches(head, commit)
        except NotFound:
            return False

    def clone(self) -> BuildModel:
        twin = BuildModel(self.recorded, self.graph, self.green_outcome, self.seed)
        twin.started = set(self.started)
        twin.running = list(self.running)
        twin.inferred, twin.from_record = self.inferred, self.from_record
        twin._used = dict(self._used)
        twin._rng.setstate(self._rng.getstate())
        return twin

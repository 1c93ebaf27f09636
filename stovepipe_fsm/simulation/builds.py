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

A timeline may also say which commits broke the build and how flaky builds are:

- ``culprits``: a commit at or after a declared culprit on its first-parent line is
  *broken* (until the culprit's declared fix, if any); with culprits declared, a build of
  a broken commit ends red and any other green, whatever was recorded for it;
- ``flake_rate``: a build that would end green ends red with that chance instead.

A probe build (a culprit search's, ``probe_of``) ends the same way: its duration is drawn
from the queue's recorded ones, its outcome is the model's. Heads and probes draw from
generators of their own, both seeded with the replay's seed, so a policy's probes never
change the durations and flakes its heads draw.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

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
class Culprit:
    """A commit a timeline declares broke the build, and the commit that fixed it (``""``:
    never fixed)."""

    commit: str
    fixed_by: str
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
    #: Declared culprits (``None``: none declared, outcomes are recorded or inferred).
    culprits: Sequence[Culprit] | None = None
    flake_rate: float = 0.0
    #: The outcome a broken commit's (or a flaky) build ends with.
    red_outcome: str = ""
    started: set[str] = field(default_factory=set)
    running: list[tuple[int, int, Started]] = field(default_factory=list)  # a heap
    inferred: int = 0
    from_record: int = 0
    #: Builds that would have ended green and ended red by ``flake_rate``'s draw.
    flaky: int = 0
    _used: dict[tuple[str, str], int] = field(default_factory=dict)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._flakes = random.Random(f"flakes:{self.seed}")
        self._probe_rng = random.Random(f"probes:{self.seed}")
        self._breaking: dict[str, frozenset[str]] = {}
        self._fixes: dict[str, set[str]] = {}
        for culprit in self.culprits or ():
            if culprit.fixed_by:
                self._fixes.setdefault(culprit.fixed_by, set()).add(culprit.commit)
        self._culprit_commits = frozenset(c.commit for c in self.culprits or ())
        self._by_commit: dict[tuple[str, str], list[RecordedBuild]] = {}
        self._durations: dict[str, list[int]] = {}
        for build in self.recorded:
            self._by_commit.setdefault((build.queue, build.uri), []).append(build)
            self._durations.setdefault(build.queue, []).append(build.duration_ms)
        self._all_durations = [b.duration_ms for b in self.recorded]

    def start(
        self, queue: str, uri: str, request_id: str, now_ms: int, *, probe: bool = False
    ) -> None:
        """The build of ``request_id`` (commit ``uri``) starts at ``now_ms``; once per
        request (a re-published build is the same build). ``probe``: a culprit search's
        probe build (module docstring)."""
        if request_id in self.started:
            return
        self.started.add(request_id)
        key = (queue, uri)
        builds = None if probe else self._by_commit.get(key)
        if builds:
            n = self._used.get(key, 0)
            self._used[key] = n + 1
            build = builds[min(n, len(builds) - 1)]
            duration, outcome, inferred = build.duration_ms, build.outcome, False
            self.from_record += 1
        else:
            durations = self._durations.get(queue) or self._all_durations
            draw = self._probe_rng if probe else self._rng
            duration = draw.choice(durations) if durations else 0
            outcome, inferred = self._outcome_containing(queue, uri), True
            self.inferred += 1
        outcome = self._modelled(uri, outcome, self._probe_rng if probe else self._flakes)
        ends = Started(now_ms + duration, len(self.started), request_id, outcome, inferred)
        heapq.heappush(self.running, (ends.due_ms, ends.order, ends))

    def _modelled(self, uri: str, outcome: str, flakes: random.Random) -> str:
        """``outcome`` under the declared culprits and flake rate (module docstring)."""
        if self.culprits is not None:
            outcome = self.red_outcome if self.breaking(uri) else self.green_outcome
        flaked = self.flake_rate and outcome == self.green_outcome
        if flaked and flakes.random() < self.flake_rate:
            self.flaky += 1
            return self.red_outcome
        return outcome

    def breaking(self, uri: str) -> frozenset[str]:
        """The declared culprits that break ``uri``: on its first-parent line (``uri``
        itself included), not fixed by a commit between them and ``uri``."""
        known = self._breaking
        line: list[str] = []
        commit = uri
        while commit and commit not in known:
            line.append(commit)
            try:
                parents = self.graph.parents_of(commit)
            except NotFound:
                parents = ()
            commit = parents[0] if parents else ""
        active = known.get(commit, frozenset())
        for commit in reversed(line):  # oldest first
            fixed = self._fixes.get(commit)
            if fixed:
                active = active - fixed
            if commit in self._culprit_commits:
                active = active | {commit}
            known[commit] = active
        return active

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
        running, used = list(self.running), dict(self._used)
        twin = replace(self, started=set(self.started), running=running, _used=used)
        twin._rng.setstate(self._rng.getstate())
        twin._flakes.setstate(self._flakes.getstate())
        twin._probe_rng.setstate(self._probe_rng.getstate())
        return twin

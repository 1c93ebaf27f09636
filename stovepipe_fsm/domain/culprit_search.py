"""A culprit search: its row, and what its evidence says (pure functions, no I/O).

When a validated head goes red, the commits between the green it was built on (its
*base*) and the head are the *blamelist*, oldest first, the red head last. Coalescing
never built most of them; a search builds some (*probes*) to find the first red one.

Positions: 0 is the base (green by definition), 1..m the blamelist, m the red head.
The model the search reasons in: a culprit at position k makes every commit from k on
red; a green result is the truth; a red one may be a flake. So the highest position with
a green result, ``lo``, bounds the culprit from below, and the lowest red above it,
``hi``, from above: the culprit is in ``lo+1 .. hi`` unless every red above ``lo`` was
a flake. A commit is *named* only when its parent has a green result (it is ``lo+1``)
and it has the reds the policy asks for.

Two ways to choose probes, both deterministic:

- :func:`section_probes`: split ``lo .. hi`` into equal parts, one probe per free slot
  (one slot: bisection; ``n``: nth-section), and rerun the candidate when the interval
  has closed on it;
- :func:`likelihood_probes`: weigh every position (and "no culprit: the red was a flake")
  by how likely the results are under a flake rate, and probe where the weight splits
  evenly (a noisy binary search); a commit is named when its weight reaches the
  policy's confidence too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .entities import evolve

#: The most commits a blamelist may list (the ``max_blamelist`` parameter's maximum).
MAX_BLAMELIST = 1000


@dataclass(frozen=True)
class Tally:
    """The results of one commit's builds."""

    greens: int = 0
    reds: int = 0

    def with_result(self, green: bool) -> Tally:
        return Tally(self.greens + 1, self.reds) if green else Tally(self.greens, self.reds + 1)


@dataclass(frozen=True)
class Probe:
    """A probe build in flight: the request that builds it, the commit it builds, and
    when the search listed it (milliseconds of the clock port; 0 = not recorded)."""

    request_id: str
    commit: str
    started_at_ms: int = 0


@dataclass(frozen=True)
class CulpritSearch:
    """One queue's culprit search: one row per queue, the newest search it ran.

    ``state`` is where ``machines/culprit.yaml`` left the search (``""``: none yet).
    ``red_request_id`` is the head whose red started it, ``base_uri`` the green that
    head's blamelist starts after. ``tallies[i]`` are the results of ``blamelist[i]``
    (position ``i + 1``). ``probes`` are the probe builds in flight, this search's and any
    an earlier search of the queue left running (they keep their slots until they end).
    ``probes_started`` counts the probes this search started (its budget).
    ``culprit`` is the commit named; ``reason`` says why the search ended without one.
    """

    queue: str
    state: str = ""
    red_request_id: str = ""
    base_uri: str = ""
    blamelist: tuple[str, ...] = ()
    tallies: tuple[Tally, ...] = ()
    probes: tuple[Probe, ...] = ()
    probes_started: int = 0
    culprit: str = ""
    reason: str = ""
    started_at_ms: int = 0
    ended_at_ms: int = 0
    version: int = 1

    def position(self, commit: str) -> int:
        """``commit``'s position in the blamelist (1-based), 0 when it is not listed."""
        try:
            return self.blamelist.index(commit) + 1
        except ValueError:
            return 0

    def in_flight(self) -> tuple[int, ...]:
        """The blamelist positions of the probes in flight (0: a commit not listed)."""
        return tuple(self.position(p.commit) for p in self.probes)

    def without_lost_probes(self, now_ms: int, lease_ms: int) -> CulpritSearch:
        """This search without the probes listed more than ``lease_ms`` before
        ``now_ms`` (their builds are taken as lost: their slots are free again; a result
        that still comes is ignored). ``lease_ms`` 0: no probe is ever lost."""
        if not lease_ms:
            return self
        kept = tuple(p for p in self.probes if p.started_at_ms + lease_ms > now_ms)
        return self if kept == self.probes else evolve(self, probes=kept)

    def probe_for(self, request_id: str) -> Probe | None:
        return next((p for p in self.probes if p.request_id == request_id), None)

    def with_result(self, commit: str, green: bool) -> CulpritSearch:
        """This search with one more result for ``commit`` (a commit not listed: unchanged)."""
        at = self.position(commit)
        if not at:
            return self
        tallies = list(self.tallies)
        tallies[at - 1] = tallies[at - 1].with_result(green)
        return evolve(self, tallies=tuple(tallies))

    def with_version(self, version: int) -> CulpritSearch:
        return evolve(self, version=version)


def frontier(tallies: Sequence[Tally]) -> tuple[int, int]:
    """``(lo, hi)``: the highest position with a green result (0: the base) and the
    lowest position above it with a red one (0: none, every red above ``lo`` was
    disproved by a green)."""
    lo = max((i + 1 for i, t in enumerate(tallies) if t.greens), default=0)
    hi = next((i + 1 for i in range(lo, len(tallies)) if tallies[i].reds), 0)
    return lo, hi


def candidate(tallies: Sequence[Tally]) -> int:
    """The position the evidence has closed on (its parent green, itself red), or 0."""
    lo, hi = frontier(tallies)
    return hi if hi and hi == lo + 1 else 0


def section_probes(
    tallies: Sequence[Tally], in_flight: Sequence[int], slots: int, confirm: int
) -> tuple[int, ...]:
    """The positions to probe now with ``slots`` probes at most in flight.

    The open interval between ``lo`` and ``hi`` is split into ``slots + 1`` equal parts
    (positions already in flight are not probed twice); slots the interval cannot use
    rerun the candidate ``hi`` when its parent is known green, up to ``confirm`` reds.
    """
    free = slots - len(in_flight)
    lo, hi = frontier(tallies)
    if free <= 0 or not hi:
        return ()
    busy = set(in_flight)
    chosen: list[int] = []
    width = hi - lo
    for i in range(1, slots + 1):
        point = lo + (width * i + (slots + 1) // 2) // (slots + 1)
        if lo < point < hi and point not in busy and point not in chosen:
            chosen.append(point)
    chosen = chosen[:free]
    if hi == lo + 1:
        wanted = confirm - tallies[hi - 1].reds - list(in_flight).count(hi)
        chosen += [hi] * max(0, min(free - len(chosen), wanted))
    return tuple(chosen)


def posterior(tallies: Sequence[Tally], flake_rate: float) -> tuple[float, ...]:
    """How likely each hypothesis is given the results: index 0 "no culprit (every red
    above ``lo`` a flake)", index k "the culprit is position k" (0 for k <= lo).

    A red below the culprit is a flake (chance ``flake_rate``); a red from it on is
    certain; a green is the truth. Before any result "no culprit" and "a culprit" are
    even, and the positions share the second half evenly; the red head's own result is
    among the tallies, so "no culprit" starts from the chance of that one flake.
    """
    m = len(tallies)
    lo, _ = frontier(tallies)
    weights = [0.0] * (m + 1)
    if m == 0:
        return (1.0,)
    share = 0.5 / m
    flakes = 1.0  # the chance that every red below the position is a flake
    for k in range(lo + 1, m + 1):
        weights[k] = share * flakes
        flakes *= flake_rate ** tallies[k - 1].reds
    weights[0] = 0.5 * flakes
    total = sum(weights)
    if total <= 0.0:
        return tuple(weights)
    return tuple(w / total for w in weights)


def likelihood_probes(
    tallies: Sequence[Tally],
    in_flight: Sequence[int],
    slots: int,
    confirm: int,
    flake_rate: float,
    confidence: float,
) -> tuple[int, ...]:
    """The positions to probe now, where the weight of the hypotheses splits evenly.

    With ``n`` free slots, the positions whose cumulative weight is nearest ``1/(n+1)``,
    ``2/(n+1)``, ...; a position already in flight is not probed twice. The candidate is
    rerun as many times as it is short of ``confirm`` reds, then once at a time while it
    is short of ``confidence``.
    """
    free = slots - len(in_flight)
    lo, hi = frontier(tallies)
    if free <= 0 or not hi:
        return ()
    weights = posterior(tallies, flake_rate)
    m = len(tallies)
    cumulative: list[float] = []
    total = 0.0
    for k in range(lo + 1, m + 1):
        total += weights[k]
        cumulative.append(total)
    busy = list(in_flight)
    chosen: list[int] = []
    for i in range(1, free + 1):
        target = i / (free + 1) * total
        point = lo + 1 + min(range(len(cumulative)), key=lambda j: abs(cumulative[j] - target))
        if point not in busy and point not in chosen:
            chosen.append(point)
    chosen = chosen[:free]
    near = candidate(tallies)
    if near:
        pending = busy.count(near) + chosen.count(near)
        short = confirm - tallies[near - 1].reds - pending
        if short <= 0 and not pending and weights[near] < confidence:
            short = 1  # confirmed, not yet confident: one more rerun at a time
        chosen += [near] * max(0, min(short, free - len(chosen)))
    return tuple(chosen)


def named(
    tallies: Sequence[Tally], confirm: int, *, flake_rate: float = 0.0, confidence: float = 0.0
) -> int:
    """The position to name as the culprit, or 0: the candidate (parent green, itself
    red) with at least ``confirm`` reds and, when ``confidence`` is asked, at least that
    weight under ``flake_rate``."""
    near = candidate(tallies)
    if not near or tallies[near - 1].reds < confirm:
        return 0
    if confidence and posterior(tallies, flake_rate)[near] < confidence:
        return 0
    return near

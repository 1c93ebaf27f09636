"""The evidence math of a culprit search (``domain/culprit_search.py``), on its own.

Positions: 0 the green base, 1..m the blamelist, m the red head. A culprit at k makes
every commit from k on red; a green is the truth; a red below k is a flake. Covered: the
frontier and the candidate on hand-made tallies; where sections and the likelihood put
their probes; reruns of the candidate; and every search run round by round (start the
chosen probes, then deliver all their results) over every blamelist of 1..24 commits and
every culprit in it, without flakes (always names the culprit) and with seeded ones
(ends within a budget, never names a commit whose parent has no green result).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence

import pytest

from stovepipe_fsm.domain.culprit_search import (
    CulpritSearch,
    Probe,
    Tally,
    candidate,
    frontier,
    likelihood_probes,
    named,
    posterior,
    section_probes,
)

CONFIRM = 2
G, R, N = Tally(greens=1), Tally(reds=1), Tally()

Choose = Callable[[Sequence[Tally], Sequence[int]], tuple[int, ...]]
Name = Callable[[Sequence[Tally]], int]


def red_head(m: int) -> list[Tally]:
    """A blamelist of ``m`` commits before any probe: the head's own red only."""
    return [N] * (m - 1) + [R]


def with_interval(m: int, lo: int, hi: int) -> list[Tally]:
    """Tallies whose frontier is ``(lo, hi)``: green at ``lo``, red at ``hi`` and the head."""
    tallies = red_head(m)
    if lo:
        tallies[lo - 1] = G
    tallies[hi - 1] = R
    return tallies


# --- the frontier and the candidate ---------------------------------------------------


@pytest.mark.parametrize(
    ("tallies", "bounds", "near"),
    [
        ([], (0, 0), 0),
        ([N, N, N, R], (0, 4), 0),
        ([R], (0, 1), 1),  # the base is green: a lone red head is the candidate
        ([G, R, N, R], (1, 2), 2),
        ([N, G, N, R, R], (2, 4), 0),
        # a red below a green is a flake: the frontier starts above the highest green
        ([R, N, G, N, R, N, R], (3, 5), 0),
        ([R, R, G, R], (3, 4), 4),
        # every red above the highest green disproved: no upper bound, no candidate
        ([N, R, N, G], (4, 0), 0),
        ([G, G, G], (3, 0), 0),
        ([Tally(greens=1, reds=3), Tally(reds=2)], (1, 2), 2),
    ],
)
def test_frontier_and_candidate_read_the_highest_green_and_the_lowest_red_above_it(
    tallies: list[Tally], bounds: tuple[int, int], near: int
) -> None:
    assert frontier(tallies) == bounds
    assert candidate(tallies) == near


def test_a_search_row_tallies_results_by_blamelist_position() -> None:
    search = CulpritSearch("q", blamelist=("a", "b", "c"), tallies=(N, N, R))
    search = search.with_result("b", green=True).with_result("c", green=False)
    assert search.tallies == (N, G, Tally(reds=2))
    assert search.with_result("elsewhere", green=True) is search
    probes = (Probe("p1", "b"), Probe("p2", "x"))
    with_probes = CulpritSearch("q", blamelist=("a", "b"), probes=probes)
    assert with_probes.in_flight() == (2, 0)
    assert with_probes.probe_for("p2") == Probe("p2", "x")
    assert with_probes.probe_for("p3") is None


# --- where sections put their probes ----------------------------------------------------


def test_bisection_probes_the_midpoint_of_the_open_interval() -> None:
    assert section_probes(red_head(16), (), 1, CONFIRM) == (8,)
    assert section_probes(with_interval(16, 8, 16), (), 1, CONFIRM) == (12,)
    for lo, hi in itertools.combinations(range(20), 2):
        if hi - lo < 2:
            continue
        (point,) = section_probes(with_interval(20, lo, hi), (), 1, CONFIRM)
        # The larger side left by either answer is as small as it can be.
        assert lo < point < hi
        assert max(point - lo, hi - point) == math.ceil((hi - lo) / 2), (lo, hi, point)


@pytest.mark.parametrize("slots", [2, 3, 4])
def test_nth_section_splits_the_interval_into_slots_plus_one_parts(slots: int) -> None:
    assert section_probes(red_head(15), (), 2, CONFIRM) == (5, 10)
    assert section_probes(red_head(20), (), 4, CONFIRM) == (4, 8, 12, 16)
    for lo, hi in itertools.combinations(range(30), 2):
        if hi - lo < 2:
            continue
        points = section_probes(with_interval(30, lo, hi), (), slots, CONFIRM)
        assert list(points) == sorted(set(points)), points
        if hi - lo > slots:
            # ``slots`` points, and the n+1 parts they cut differ by one commit at most
            parts = [b - a for a, b in itertools.pairwise((lo, *points, hi))]
            assert len(points) == slots and max(parts) - min(parts) <= 1, (lo, hi, points)
        else:
            # narrower than the parts: every commit inside is probed, once
            assert points == tuple(range(lo + 1, hi)), (lo, hi, points)


@pytest.mark.parametrize("slots", [2, 3, 4])
def test_sections_never_probe_a_position_in_flight_twice_nor_exceed_the_slots(
    slots: int,
) -> None:
    for lo, hi in itertools.combinations(range(14), 2):
        tallies = with_interval(14, lo, hi)
        for busy in range(slots + 1):
            for in_flight in itertools.combinations(range(lo + 1, hi), busy):
                points = section_probes(tallies, in_flight, slots, CONFIRM)
                assert len(in_flight) + len(points) <= slots
                assert not set(points) & set(in_flight), (lo, hi, in_flight, points)
                assert len(set(points)) == len(points)
                assert all(lo < p < hi or p == hi == lo + 1 for p in points)
                if busy < min(slots, hi - lo - 1):
                    assert points, (lo, hi, in_flight)  # a free slot and room: it probes


def test_sections_rerun_the_candidate_up_to_confirm_reds() -> None:
    closed = [G, G, R, N, R]  # lo 2, hi 3: the candidate is position 3, one red
    assert section_probes(closed, (), 1, CONFIRM) == (3,)
    assert section_probes(closed, (), 4, CONFIRM) == (3,)
    assert section_probes(closed, (), 4, 3) == (3, 3)
    assert section_probes(closed, (3,), 4, 3) == (3,)  # one rerun already in flight
    assert section_probes(closed, (3, 3), 4, 3) == ()
    assert section_probes(closed, (3,), 1, 3) == ()  # no free slot
    confirmed = [G, G, Tally(reds=2), N, R]
    assert section_probes(confirmed, (), 4, CONFIRM) == ()
    assert named(confirmed, CONFIRM) == 3
    assert named(closed, CONFIRM) == 0
    assert section_probes([G, G, G], (), 2, CONFIRM) == ()  # no red left: nothing to probe


# --- the likelihood -------------------------------------------------------------------


@pytest.mark.parametrize("flake_rate", [0.0, 0.01, 0.2])
def test_the_posterior_weighs_only_what_the_results_allow(flake_rate: float) -> None:
    for tallies in ([R], red_head(9), [R, G, N, R, N, N, R], [G, N, Tally(reds=3), N, R]):
        weights = posterior(tallies, flake_rate)
        lo, hi = frontier(tallies)
        assert math.isclose(sum(weights), 1.0)
        assert all(w == 0.0 for w in weights[1 : lo + 1])  # at or below a green: ruled out
        assert all(weights[k] > 0.0 for k in range(lo + 1, hi + 1))
        if flake_rate == 0.0:  # no flakes: nothing above the lowest red, no "no culprit"
            assert weights[0] == 0.0 and not any(weights[hi + 1 :])
        else:  # every red a position must call a flake costs it ``flake_rate``
            assert weights[hi + 1] < weights[hi] if hi < len(tallies) else weights[0] < 0.5
    # unbiased before probing: the positions of a red head's blamelist weigh the same
    even = posterior(red_head(8), flake_rate)[1:]
    assert max(even) == pytest.approx(min(even))


def test_the_likelihood_probes_where_the_weight_splits_evenly() -> None:
    assert likelihood_probes(red_head(16), (), 1, CONFIRM, 0.0, 0.99) == (8,)
    assert likelihood_probes(red_head(15), (), 2, CONFIRM, 0.0, 0.99) == (5, 10)
    assert likelihood_probes(with_interval(16, 8, 12), (), 1, CONFIRM, 0.0, 0.99) == (10,)
    # with flakes the head's weight is no longer alone at the top: still near the middle
    (point,) = likelihood_probes(red_head(16), (), 1, CONFIRM, 0.05, 0.99)
    assert point in (7, 8, 9)
    # an open slot already busy on a position does not probe it again
    assert 8 not in likelihood_probes(red_head(16), (8,), 2, CONFIRM, 0.0, 0.99)
    assert likelihood_probes(red_head(16), (8, 4), 2, CONFIRM, 0.0, 0.99) == ()


def test_the_likelihood_reruns_the_candidate_until_confirmed_and_confident() -> None:
    closed = [G, G, R, N, R]
    assert set(likelihood_probes(closed, (), 2, CONFIRM, 0.0, 0.99)) == {3}
    assert likelihood_probes(closed, (3,), 2, CONFIRM, 0.0, 0.99) == ()
    # short of confirm, the candidate is rerun as often as it is short, no more
    assert likelihood_probes([G, R, *[N] * 5, R], (), 3, CONFIRM, 0.05, 0.99) == (2,)
    assert likelihood_probes([G, R, *[N] * 5, R], (), 3, 3, 0.05, 0.99) == (2, 2)
    # confirmed but short of confidence: one rerun at a time
    assert likelihood_probes([G, Tally(reds=2), *[N] * 20, R], (), 3, CONFIRM, 0.05, 0.99) == (2,)
    assert likelihood_probes([G, Tally(reds=2), *[N] * 20, R], (2,), 3, CONFIRM, 0.05, 0.99) == ()
    confirmed = [G, G, Tally(reds=2), *[N] * 20, R]
    assert named(confirmed, CONFIRM) == 3
    # two reds, but 21 commits above that would each explain them by two flakes
    assert posterior(confirmed, 0.05)[3] < 0.99
    assert named(confirmed, CONFIRM, flake_rate=0.05, confidence=0.99) == 0
    assert 3 in likelihood_probes(confirmed, (), 1, CONFIRM, 0.05, 0.99)
    sure = [G, G, Tally(reds=4), *[N] * 20, R]
    assert named(sure, CONFIRM, flake_rate=0.05, confidence=0.99) == 3


# --- whole searches, round by round ---------------------------------------------------


def sections(slots: int) -> tuple[Choose, Name]:
    def choose(tallies: Sequence[Tally], in_flight: Sequence[int]) -> tuple[int, ...]:
        return section_probes(tallies, in_flight, slots, CONFIRM)

    return choose, lambda tallies: named(tallies, CONFIRM)


def likelihood(slots: int, flake_rate: float, confidence: float = 0.99) -> tuple[Choose, Name]:
    def choose(tallies: Sequence[Tally], in_flight: Sequence[int]) -> tuple[int, ...]:
        return likelihood_probes(tallies, in_flight, slots, CONFIRM, flake_rate, confidence)

    def name(tallies: Sequence[Tally]) -> int:
        return named(tallies, CONFIRM, flake_rate=flake_rate, confidence=confidence)

    return choose, name


STRATEGIES = {
    "bisection": (1, sections(1)),
    "2-section": (2, sections(2)),
    "4-section": (4, sections(4)),
    "likelihood x1": (1, likelihood(1, 0.05)),
    "likelihood x2": (2, likelihood(2, 0.05)),
    "likelihood x1, rate 0": (1, likelihood(1, 0.0)),
    "likelihood x2, rate 0": (2, likelihood(2, 0.0)),
}


def run_rounds(
    m: int, slots: int, strategy: tuple[Choose, Name], red: Callable[[int], bool], budget: int
) -> tuple[int, list[Tally], int]:
    """One search: each round starts the chosen probes, then delivers all their results.

    Returns the position named (0: none, the search found nothing left to probe), the
    final tallies and the probes started. Fails when a round starts more probes than
    the slots, or the probes pass ``budget``.
    """
    choose, name = strategy
    tallies = red_head(m)
    started = 0
    while not (found := name(tallies)):
        probes = choose(tallies, ())
        if not probes:
            break
        assert len(probes) <= slots, probes
        started += len(probes)
        assert started <= budget, (m, tallies)
        for p in probes:
            tallies[p - 1] = tallies[p - 1].with_result(not red(p))
    return found, tallies, started


def assert_named_on_evidence(found: int, tallies: Sequence[Tally]) -> None:
    assert found == 0 or found == 1 or tallies[found - 2].greens, (found, tallies)
    assert found == 0 or tallies[found - 1].reds >= CONFIRM, (found, tallies)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_without_flakes_every_search_names_the_culprit_on_its_evidence(strategy: str) -> None:
    slots, chosen = STRATEGIES[strategy]
    for m in range(1, 25):
        # every halving, the reruns to confirm, and one spare round of slots
        budget = slots * (math.ceil(math.log2(m)) + 1) + CONFIRM
        for culprit in range(1, m + 1):
            red = culprit.__le__  # a commit is red from the culprit on
            found, tallies, _ = run_rounds(m, slots, chosen, red, budget)
            assert found == culprit, (m, culprit, tallies)
            assert_named_on_evidence(found, tallies)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_with_flakes_a_search_ends_in_budget_and_names_only_above_a_green(strategy: str) -> None:
    slots, chosen = STRATEGIES[strategy]
    rng = random.Random(f"culprits/{strategy}")
    right = total = 0
    for m in range(1, 25):
        budget = 2 * slots * (math.ceil(math.log2(m)) + CONFIRM) + 2 * CONFIRM
        for culprit in range(1, m + 1):
            for _ in range(4):
                def red(p: int, culprit: int = culprit) -> bool:
                    return p >= culprit or rng.random() < 0.05

                found, tallies, _ = run_rounds(m, slots, chosen, red, budget)
                assert_named_on_evidence(found, tallies)
                # a green is the truth: the commit named never lies above the culprit
                assert 0 < found <= culprit, (m, culprit, found, tallies)
                right += found == culprit
                total += 1
    assert right > 0.9 * total  # a wrong name needs every one of its reds to be a flake

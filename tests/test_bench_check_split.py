"""bench.check_split: the split arithmetic on graphs small enough to count by hand, and
one run of the bench on the real checker."""

from __future__ import annotations

import re

import pytest

from bench import check_split
from bench.check_split import (
    Explored,
    Split,
    balanced_split,
    claimed_split,
    split_at,
    two_cores,
)

# 0 -> 1, 2 (depth 1); 1 -> 3; 2 -> 4 (depth 2); 3 -> 5; 4 -> 5 (depth 3);
# 3 -> 2 goes back to the other half's frontier, known at the fork: never explored twice.
DEPTHS = [0, 1, 1, 2, 2, 3]
SUCCESSORS = [[1, 2], [3], [4], [5, 2], [5], []]


def test_a_state_both_halves_reach_is_explored_by_each() -> None:
    split = split_at(DEPTHS, SUCCESSORS, 1)
    assert split == Split(depth=1, before=1, halves=(3, 3), total=6, cut=1)
    assert split.work == pytest.approx(7 / 6)  # state 5 twice
    assert split.wall == pytest.approx(4 / 6)


def test_states_known_at_the_fork_are_not_explored_again() -> None:
    split = split_at(DEPTHS, SUCCESSORS, 2)
    # Halves [3] and [4]: each reaches 5; 3 -> 2 leads to a state known before the fork.
    assert split == Split(depth=2, before=3, halves=(2, 2), total=6, cut=1)


def test_the_two_core_estimate_runs_the_smaller_exploration_beside_the_split() -> None:
    small = Explored(1, 10.0, [], [], [], 100, 300)
    large = Explored(2, 40.0, [Split(5, 100, (150, 150), 400)], [], [], 400, 1200)
    unsplit, split, floor = two_cores([large, small])
    assert unsplit == 40.0
    # 0.1 s per state: 10 s before the fork, then 15 s per half; the second half waits
    # for the other core, busy with the small exploration until 10 s.
    assert split == pytest.approx(25.0)
    # 10 s unsplit and 40 s x 1.0 (no state explored twice), over two cores.
    assert floor == pytest.approx(25.0)


def test_a_balanced_cut_makes_the_larger_part_smallest() -> None:
    # Frontier 1, 2, 3, 4 at depth 1; only 1 leads on, to four states.
    depths = [0, 1, 1, 1, 1, 2, 2, 2, 2]
    successors = [[1, 2, 3, 4], [5, 6, 7, 8], [], [], [], [], [], [], []]
    assert split_at(depths, successors, 1).halves == (6, 2)  # in half: [1, 2] | [3, 4]
    split = balanced_split(depths, successors, 1)
    assert (split.cut, split.halves) == (1, (5, 3))  # [1] | [2, 3, 4]
    assert split.wall == pytest.approx((1 + 5) / 9)


def test_pieces_go_to_whichever_process_has_explored_less() -> None:
    # Frontier 1..4 at depth 1: 1 and 2 each lead to two states of their own and to the
    # shared state 9; 3 and 4 lead nowhere.
    depths = [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
    successors = [[1, 2, 3, 4], [5, 6], [7, 8], [], [], [9], [], [9], [], []]
    # Four pieces: [1] to the first process (4 states: 1, 5, 6, 9), [2] to the second
    # (2, 7, 8, 9: the shared state explored by each), then [3] and [4] to the first
    # (ties go to it) and the second.
    split = claimed_split(depths, successors, 1, 4)
    assert split == Split(depth=1, before=1, halves=(5, 5), total=10, cut=4)
    assert split.work == pytest.approx(11 / 10)
    # In one piece the first process explores everything, once.
    assert claimed_split(depths, successors, 1, 1).halves == (9, 0)


def test_the_bench_splits_the_real_checker_s_explorations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--heads", "1", "--no-rewrite", "--max-concurrent", "1", "2"]
    assert check_split.main(argv) == 0
    out = capsys.readouterr().out
    for k in (1, 2):
        assert re.search(rf"^max_concurrent={k}: \d+ states, \d+ edges", out, re.M), out
    rows = re.findall(r"^\s+\d+ \|\s+\d+ \|\s+\d+ \|\s+\d+ \|\s+([\d.]+) \|\s+([\d.]+)$", out, re.M)
    assert rows, out
    for work, wall in rows:
        assert float(work) >= 1.0 and 0.0 < float(wall) <= 1.0
    assert re.search(r"^  balanced at depth \d+: cut after \d+ frontier states", out, re.M), out
    claimed = re.findall(r"^\s+\d+ \|\s+\d+ \|\s+(\d+) \|\s+\d+ \|\s+\d+ \|\s+([\d.]+)$", out, re.M)
    assert {int(pieces) for pieces, _ in claimed} == {4, 8, 16, 32}, out
    assert all(0.0 < float(wall) <= 1.0 for _, wall in claimed), out
    figures = re.search(
        r"^two cores, every exploration: ([\d.]+) s as check runs them; ([\d.]+) s .*"
        r"no less than ([\d.]+) s",
        out,
        re.M,
    )
    assert figures is not None, out
    assert all(float(seconds) > 0 for seconds in figures.groups()), out

"""bench.culprits runs to the end on small figures, and its floor is a real ``git bisect``.

The floor's figures stand beside ours only if it bisects what it claims to: a generated
repository whose culprit adds a marker file, the test script's calls counted as builds,
and the script's flakes read from a list drawn per trial.
"""

from __future__ import annotations

import random
import re

import pytest

from bench import culprits


@pytest.mark.parametrize("culprit", [1, 5, 12, 16])
def test_git_bisect_on_a_generated_repository_names_the_culprit_without_flakes(
    culprit: int,
) -> None:
    run = culprits.git_bisect(16, culprit, 0.0, random.Random(1))
    assert run.named == culprit
    assert run.builds == run.rounds == 4  # 16 candidates, halved one build at a time


def test_git_bisect_is_misled_by_flaky_reds_below_the_culprit() -> None:
    # every build below the culprit flakes red: bisect walks down to the first commit
    run = culprits.git_bisect(16, 12, 1.0, random.Random(1))
    assert run.named == 1
    assert run.builds >= 4


def test_a_search_of_each_way_names_the_culprit_without_flakes() -> None:
    for way in culprits.WAYS:
        for culprit in (1, 40, 64):
            trunk = culprits.FlakyTrunk(culprit, 0.0, random.Random(1))
            run = culprits.search(way, 64, trunk)
            assert run.named == culprit, way
            assert run.builds <= culprits.budget(64)
            assert run.rounds >= culprits.round_limit(64, way.slots)


def test_the_bench_prints_a_table_per_flake_rate_with_every_way_side_by_side(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--sizes", "8", "--flakes", "0", "0.05", "--trials", "20", "--git-trials", "2"]
    assert culprits.main(argv) == 0
    out = capsys.readouterr().out
    assert re.findall(r"^flake rate (\d+)%$", out, re.M) == ["0", "5"]
    header = "| m | figure | bisection | 2-section | 4-section | likelihood x1 | likelihood x4 "
    assert out.count(header + "| git bisect |") == 2, out
    right = re.findall(r"^\| 8 \| named right \|(.*)\|$", out, re.M)
    assert right[0].split("|") == [" 100.0 % "] * 6, right  # no flakes: all right
    limits = re.findall(r"^\| 8 \| rounds, limit \|(.*)\|$", out, re.M)
    assert limits[0].split("|") == [" 3 ", " 2 ", " 2 ", " 3 ", " 2 ", " 3 "], limits

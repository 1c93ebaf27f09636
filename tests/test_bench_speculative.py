"""bench.speculative runs the real stage over a synthetic trunk and prints one row per
policy; on a short trunk its figures must already show what each policy is for."""

from __future__ import annotations

import pytest

from bench.greens import main as greens_main
from bench.speculative import POLICIES, main


def rows(out: str) -> dict[str, list[str]]:
    table = [line for line in out.splitlines() if line.startswith("| N=")]
    return {cells[0]: cells[1:] for cells in (line.strip("| ").split(" | ") for line in table)}


def test_the_table_has_a_row_per_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--heads", "80", "--seed", "3"]) == 0
    table = rows(capsys.readouterr().out)
    assert list(table) == [p.label for p in POLICIES]
    p50 = {label: int(cells[0]) for label, cells in table.items()}
    builds = {label: int(cells[2]) for label, cells in table.items()}
    wasted = {label: int(cells[5]) for label, cells in table.items()}
    expired = {label: int(cells[6]) for label, cells in table.items()}
    # One slot never speculates; more slots build more and reach green sooner.
    assert wasted["N=1"] == 0
    assert builds["N=1"] < builds["N=2"] < builds["N=3"]
    assert p50["N=3"] < p50["N=1"]
    # Only a lease expires slots.
    assert expired["N=1"] == expired["N=2"] == expired["N=3"] == 0
    for label, cells in table.items():
        assert int(cells[3]) + int(cells[4]) == builds[label]  # full + incremental


def test_the_same_seed_prints_the_same_table(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--heads", "40", "--seed", "11"])
    first = capsys.readouterr().out
    main(["--heads", "40", "--seed", "11"])
    assert capsys.readouterr().out == first


def test_keeping_recent_greens_turns_full_builds_after_force_pushes_incremental(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert greens_main(["--heads", "120", "--seed", "3", "--rewrites", "0.1"]) == 0
    table = [line.strip("| ").split(" | ") for line in capsys.readouterr().out.splitlines()]
    rows = {
        cells[0]: [float(c) for c in cells[1:]]
        for cells in table
        if cells[0].startswith("recent_greens")
    }
    alone, kept = rows["recent_greens 1"], rows["recent_greens 8"]
    assert kept[1] < alone[1]  # fewer full builds
    assert alone[4] <= 1.0 < kept[4] <= 8.0  # questions per admission: at most the greens kept

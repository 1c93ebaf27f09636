"""``stovepipe-fsm check`` as a user runs it: the shipped policy passes with the default
bounds, a counterexample is a timeline ``simulate`` accepts, and bad input exits 2.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from check_mutants.mutants import write_mutant

from stovepipe_fsm.apps.check import explorer
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.simulation.timeline import load_timeline

ROOT = Path(__file__).resolve().parent.parent
RESULT_LINE = re.compile(
    r"^  max_concurrent=(\d+): (\S+(?: \S+)?) - (\d+) states \((\d+) covered\), "
    r"(\d+) transitions, depth (\d+), "
    r"[\d.]+ s, \d+ states/s, cpu [\d.]+ s"
    r"(?:, split over 2 processes|, searched again unsplit for the shortest counterexample)?$"
)


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def results(out: str) -> list[tuple[int, str, int, int, int]]:
    rows = []
    for line in out.splitlines():
        match = RESULT_LINE.match(line)
        if match:
            k, verdict, states, covered, transitions, depth = match.groups()
            assert int(covered) < int(states), line
            rows.append((int(k), verdict, int(states), int(transitions), int(depth)))
    return rows


@pytest.mark.slow  # the shipped policy explored to the default bounds
def test_shipped_policy_passes_with_the_default_bounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cx.yaml"
    code, stdout, _ = run(capsys, "--quiet", "--out", str(out))
    assert code == 0, stdout
    assert "heads A1 A2 A3 R" in stdout
    rows = results(stdout)
    assert [(k, verdict) for k, verdict, *_ in rows] == [(1, "ok"), (2, "ok")]
    assert all(states > 10_000 and transitions > states for _, _, states, transitions, _ in rows)
    # States a state of their observation covers are kept, not expanded.
    covered = [int(n) for n in re.findall(r" states \((\d+) covered\)", stdout)]
    assert len(covered) == 2 and all(n > 1_000 for n in covered), stdout
    assert re.search(
        r"^ok: every invariant holds - \d+ states, \d+ transitions in [\d.]+ s "
        r"\(\d+ states/s, cpu [\d.]+ s\)$",
        stdout,
        re.M,
    )
    assert not out.exists()


def test_parallel_and_serial_runs_agree(capsys: pytest.CaptureFixture[str]) -> None:
    small = ["--heads", "2", "--no-rewrite", "--quiet"]
    _, serial, _ = run(capsys, *small, "--jobs", "1")
    _, parallel, _ = run(capsys, *small, "--jobs", "2")
    assert results(serial) == results(parallel)
    assert len(results(serial)) == 2


def test_progress_goes_to_stderr_only(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(explorer, "PROGRESS_EVERY_S", 0.0)  # a line per expanded state
    code, out, err = run(capsys, "--heads", "1", "--jobs", "1")
    assert code == 0
    assert "frontier" not in out
    lines = err.splitlines()
    assert len(lines) > 10
    assert all(
        re.match(r"check max_concurrent=[12]: \d+ states, \d+ transitions", ln) for ln in lines
    )
    code, _, quiet = run(capsys, "--heads", "1", "--jobs", "1", "--quiet")
    assert code == 0 and quiet == ""


def test_too_small_a_state_budget_is_a_failure_not_a_pass(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "--max-states", "30", "--quiet", "--jobs", "1")
    assert code == 1
    assert "INCOMPLETE" in out
    assert "incomplete: --max-states reached" in out


def test_counterexample_is_a_timeline_simulate_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machines_dir = write_mutant("no_gate", tmp_path / "no_gate")
    out = tmp_path / "cx.yaml"
    code, stdout, _ = run(
        capsys, "--machines", str(machines_dir), "--out", str(out), "--jobs", "1", "--quiet"
    )
    assert code == 1
    assert "shortest trace (4 steps):" in stdout
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Counterexample found by `stovepipe-fsm check`.\n")
    assert "# Broken: max_concurrent - never more than max_concurrent unexpired slots held" in text
    assert f"# Replay: stovepipe-fsm simulate {out} --machines {machines_dir}" in text
    timeline = load_timeline(out)
    assert [s.describe() for s in timeline.steps] == [
        "ingest A1",
        "deliver",
        "ingest A2",
        "deliver",
    ]
    assert timeline.config == {"max_concurrent": 1, "gate_wait_delay_ms": 5000, "max_attempts": 2}

    capsys.readouterr()
    assert main(["simulate", str(out), "--machines", str(machines_dir)]) == 0
    table = capsys.readouterr().out
    assert "monorepo/main: in_flight=2" in table
    assert "(A2): admitted" in table


def test_replay_of_a_clean_timeline_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--replay", "examples/walkthrough.yaml")
    assert code == 0
    assert "every invariant holds and the work can finish" in out
    assert "final requests:" in out


def test_bad_bounds_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--heads", "0"], ["--max-concurrent", "0"], ["--max-crashes", "-1"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["check", *args])
        assert exit_info.value.code == 2


def test_machines_lint_rejects_need_no_lint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machines_dir = write_mutant("terminal_holds_slot", tmp_path / "m")
    capsys.readouterr()
    assert main(["check", "--machines", str(machines_dir), "--quiet"]) == 2
    assert "slot-holding" in capsys.readouterr().err

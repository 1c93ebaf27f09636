"""Every timeline in ``tests/timelines`` replayed through the real ``simulate --json``.

Each ``NAME.yaml`` is one rule or edge case of the process stage; ``NAME.expected.json``
is the end state the behaviour spec predicts for it. The run goes through
``stovepipe_fsm.apps.cli.main`` exactly as a user's command would (shipped machines and
queue config), so a mismatch is a behaviour change somewhere between the YAML machines
and the JSON a user reads.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import pytest

from stovepipe_fsm.apps.cli import main

ROOT = Path(__file__).resolve().parent.parent
TIMELINES = Path(__file__).resolve().parent / "timelines"
CASES = sorted(TIMELINES.glob("*.yaml"))


def run_simulate_json(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Run ``simulate PATH --json`` in-process and parse what it printed."""
    capsys.readouterr()
    code = main(["simulate", str(path), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, f"simulate {path.name} exited {code}:\n{err}"
    return json.loads(out)  # type: ignore[no-any-return]


def pretty(doc: Any) -> list[str]:
    return json.dumps(doc, indent=2, sort_keys=True).splitlines()


def test_every_timeline_has_an_expectation() -> None:
    expected = {p.name.removesuffix(".expected.json") for p in TIMELINES.glob("*.expected.json")}
    assert {p.stem for p in CASES} == expected
    assert len(CASES) >= 25


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_timeline(
    path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CLI resolves the shipped machines/ and config/ relative to the working directory.
    monkeypatch.chdir(ROOT)
    actual = run_simulate_json(path, capsys)
    expected = json.loads(path.with_suffix(".expected.json").read_text())
    if actual != expected:
        diff = "\n".join(
            difflib.unified_diff(
                pretty(expected), pretty(actual), "expected", "actual", lineterm=""
            )
        )
        pytest.fail(f"{path.name}: simulate --json differs from the expectation\n{diff}")

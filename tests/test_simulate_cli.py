"""``stovepipe-fsm simulate``: the text table a user reads, and located input errors.

The JSON end states are covered timeline by timeline in ``test_timelines.py``; here we
check what only the command shows: the per-step log rows, exit codes, and that every
kind of bad timeline is reported as ``file:line:column`` with exit code 2 and no
traceback.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stovepipe_fsm.apps.cli import EXIT_USAGE, main

ROOT = Path(__file__).resolve().parent.parent
WALKTHROUGH = ROOT / "tests" / "timelines" / "waiting_for_a_slot.yaml"


def derive_strategy_step() -> str:
    """Where the shipped gate declares ``derive_strategy`` (the step that asks source
    control), as a failure of that step names it."""
    lines = (ROOT / "machines" / "queue_gate.yaml").read_text().splitlines()
    for number, text in enumerate(lines, 1):
        if "after:" in text and "derive_strategy" in text:
            return (
                f"machines/queue_gate.yaml:{number}:{text.index('derive_strategy') + 1}: in "
                "machine 'queue_gate', state 'latest', trigger 'gate', action 'derive_strategy'"
            )
    raise AssertionError("machines/queue_gate.yaml no longer names derive_strategy")


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI finds the shipped machines/ and config/ relative to the working directory."""
    monkeypatch.chdir(ROOT)


def simulate(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["simulate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def table_rows(out: str) -> list[tuple[int, int, str, str]]:
    """(step, time, action, result) for every log row of the text output."""
    rows = []
    for line in out.splitlines():
        match = re.match(r"^(\d+)\s+(\d+)\s+(\S.*?\S)\s{2,}(\S.*)$", line)
        if match:
            step, time_ms, action, result = match.groups()
            rows.append((int(step), int(time_ms), action, result))
    return rows


def test_table_shows_every_decision_of_the_walkthrough(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = simulate([str(WALKTHROUGH)], capsys)
    assert code == 0, err
    rows = table_rows(out)
    rid = "request/monorepo/main/"
    expected = [
        (2, 0, "run", f"{rid}1 (A): admitted full -> build"),
        (3, 0, "expect request A", "ok (state, strategy, base)"),
        (7, 0, "run", f"{rid}2 (B): superseded by {rid}4"),
        (7, 0, "run", f"{rid}3 (C): superseded by {rid}4"),
        (7, 0, "run", f"{rid}4 (D): held (gate_closed)"),
        (10, 0, "expect request D", "ok (state, holds, hold_reason)"),
        (11, 0, "expect queue monorepo/main", "ok (in_flight, latest, builds)"),
        (14, 0, "run", "nothing due"),
        (17, 1000, "run", f"{rid}4 (D): superseded by {rid}6"),
        (17, 1000, "run", f"{rid}5 (E): superseded by {rid}6"),
        (17, 1000, "run", f"{rid}6 (F): held (gate_closed)"),
        (21, 1000, "complete A succeeded", f"{rid}1 succeeded; in_flight=0"),
        (25, 2000, "run", f"{rid}6 (F): admitted incremental_since_green base A -> build"),
    ]
    for row in expected:
        assert row in rows, f"missing row {row}\n{out}"
    # Rows come in step order and the decisions above are the only deliveries.
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    deliveries = [r for r in rows if r[2] == "run" and r[3] != "nothing due"]
    assert len(deliveries) == 8


def test_table_ends_with_the_final_state(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = simulate([str(WALKTHROUGH)], capsys)
    assert code == 0
    final = out[out.index("final requests:") :]
    f_row = r"request/monorepo/main/6\s+F\s+processing\s+incremental_since_green\s+A"
    assert re.search(f_row, final)
    assert re.search(r"request/monorepo/main/1\s+A\s+succeeded\s+full\s+-", final)
    assert "monorepo/main: in_flight=1 last_green=A latest=request/monorepo/main/6" in final
    assert "holds: 2; pending: 0" in final
    assert final.rstrip().endswith("expectations: 33 passed, 0 failed")


def test_table_shows_crash_retry_and_redelivery(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    timeline = tmp_path / "t.yaml"
    timeline.write_text(
        "history: {A: [], B: [A]}\n"
        "steps:\n"
        "  - ingest: A\n"
        "  - crash: after_announce\n"
        "  - deliver\n"
        "  - deliver\n"
        "  - complete: {uri: A, outcome: succeeded}\n"
        "  - source_control: down\n"
        "  - ingest: B\n"
        "  - deliver\n"
        "  - redeliver: A\n"
    )
    code, out, err = simulate([str(timeline)], capsys)
    assert code == 0, err
    results = [r[3] for r in table_rows(out)]
    assert "request/monorepo/main/1 (A): crashed (after_announce)" in results
    assert (
        "request/monorepo/main/1 (A): already processing -> start re-announced, build re-published"
    ) in results
    assert (
        f"request/monorepo/main/2 (B): retry ({derive_strategy_step()}: "
        "SourceControlOutage: source control unavailable)"
    ) in results
    assert "duplicate process message for request/monorepo/main/1" in results


def test_table_shows_retries_backing_off_until_a_dead_letter(
    capsys: pytest.CaptureFixture[str],
) -> None:
    timeline = ROOT / "tests" / "timelines" / "dead_letter_after_max_attempts.yaml"
    code, out, err = simulate([str(timeline)], capsys)
    assert code == 0, err
    retries = [(t, r) for _, t, _, r in table_rows(out) if "(B): retry" in r]
    assert [t for t, _ in retries] == [0, 1000], "due 1000 ms after the first failure"
    (dead,) = [(t, r) for _, t, _, r in table_rows(out) if "dead_letter" in r]
    assert dead == (
        3000,  # 2000 ms after the second: the backoff doubled
        "request/monorepo/main/2 (B): dead_letter (gave up after 3 attempts: "
        f"{derive_strategy_step()}: SourceControlOutage: source control unavailable); "
        "request failed; in_flight=0",
    )


def test_table_shows_a_stalled_delivery_overtaken_by_its_redelivery(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fact H of docs/jetstream.md: the redelivery settles the message, the queue moves
    on, and the stalled delivery's late ack changes nothing."""
    timeline = tmp_path / "t.yaml"
    timeline.write_text(
        "history: {A: [], B: [A]}\n"
        "steps:\n"
        "  - ingest: A\n"
        "  - stall: after_publish_build\n"
        "  - deliver\n"
        "  - ingest: B\n"
        "  - resume: A\n"
    )
    code, out, err = simulate([str(timeline), "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["pending"] == 1 and "in_hand" not in doc
    assert [h["request_id"] for h in doc["hooks"]] == ["request/monorepo/main/1"] * 2
    code, out, err = simulate([str(timeline)], capsys)
    results = [r[3] for r in table_rows(out)]
    assert results[1] == (
        "request/monorepo/main/1 (A): in hand, stalled after_publish_build (message due again)"
    )
    assert results[4] == (
        "request/monorepo/main/1 (A): acked late, message already settled; request processing"
    )


def test_json_is_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = simulate([str(WALKTHROUGH), "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    plain = {"requests", "queues", "builds", "hooks", "holds", "pending"}
    assert set(doc) == {*plain, "expectations"}  # the walkthrough carries expect steps
    assert doc["expectations"] == {"passed": 33, "failed": []}


BAD_TIMELINES = {
    "unknown_step": (
        "queue: monorepo/main\nsteps:\n  - ingest: A\n  - explode: B\n",
        4,
        5,
        "steps[1]: unknown step 'explode'; a step is one of: deliver, run, {ingest: URI}",
    ),
    "unknown_bare_step": ("steps:\n  - ingest: A\n  - delivr\n", 3, 5, "unknown step 'delivr'"),
    "not_a_step": ("steps:\n  - {}\n", 2, 5, "steps[0]: not a step; a step is one of: "),
    "yaml_syntax": ("steps: [\n", 2, 1, "YAML syntax error"),
    "bad_queue_name": ('queue: "bad queue"\nsteps:\n  - ingest: A\n', 1, 8, "whitespace"),
    "negative_advance": ("steps:\n  - advance_ms: -5\n", 2, 17, "minimum"),
    "unknown_uri": (
        "steps:\n  - ingest: A\n  - complete: {uri: Q, outcome: succeeded}\n",
        3,
        5,
        "no request for uri 'Q'",
    ),
    "complete_before_admit": (
        "steps:\n  - ingest: A\n  - complete: {uri: A, outcome: succeeded}\n",
        3,
        5,
        "is accepted, not yet admitted",
    ),
    "unknown_parent": ("history: {A: [Q]}\nsteps:\n  - ingest: A\n", 1, 15, "parent 'Q'"),
    "parent_cycle": (
        "history:\n  A: [B]\n  B: [A]\nsteps:\n  - ingest: A\n",
        2,
        6,
        "parent cycle",
    ),
    "bad_config_knob": ("config: {max_concurrent: 0}\nsteps: [run]\n", 1, 26, "minimum"),
    "unknown_stall_point": ("steps:\n  - stall: after_ack\n", 2, 12, "stall"),
    "resume_nothing_in_hand": (
        "steps:\n  - ingest: A\n  - resume: A\n",
        3,
        5,
        "no stalled delivery",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_TIMELINES))
@pytest.mark.parametrize("as_json", [False, True])
def test_invalid_timeline_exits_2_with_location(
    name: str, as_json: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, line, column, fragment = BAD_TIMELINES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    code, out, err = simulate([str(path), *(["--json"] if as_json else [])], capsys)
    assert code == EXIT_USAGE
    assert out == ""
    assert "Traceback" not in err
    first = err.splitlines()[0]
    assert first.startswith(f"{path}:{line}:{column}: "), err
    assert fragment in err


def test_an_unknown_step_is_named_once_among_the_other_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("steps:\n  - ingest: A\n  - explode: A\n  - advance_ms: -1\n", encoding="utf-8")
    code, out, err = simulate([str(path)], capsys)
    assert (code, out) == (EXIT_USAGE, "")
    first, second = err.splitlines()
    assert first.startswith(f"{path}:3:5: steps[1]: unknown step 'explode'; a step is one of: ")
    for step in ("deliver", "run", "{ingest: URI}", "{advance_ms: N}", "{resume: URI}"):
        assert step in first
    assert "not a step" not in err
    assert second.startswith(f"{path}:4:17: steps[2].advance_ms: -1 is less than the minimum")


def test_missing_timeline_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "absent.yaml"
    code, _, err = simulate([str(path)], capsys)
    assert code == EXIT_USAGE
    assert err.startswith(f"{path}:1:1: ")

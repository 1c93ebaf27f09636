"""The YAML owns the vocabulary: a consistent rename works, a half-done one is located.

The runtime names no state and no trigger of the request machine; it reads them from
the machine's ``initial``, ``roles:`` and ``outcomes:``. So renaming every state and
trigger of the request machine (and an outcome, with the timeline that reports it) must
replay the seed's walkthrough to the same result under the new names, and a rename done
in one place only must be a ``validate`` error at the line to fix. The renames are made
in a copy of the tests' own policy (``tests/fixtures``), never the shipped one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fixture_policy import CONFIG, MACHINES, copy_policy

from stovepipe_fsm.apps.cli import main

ROOT = Path(__file__).resolve().parent.parent
WALKTHROUGH = ROOT / "examples" / "walkthrough.yaml"

STATES = {
    "accepted": "queued",
    "processing": "building",
    "superseded": "skipped",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "aborted",
}
TRIGGERS = {
    "admit": "start",
    "supersede": "skip",
    "succeed": "pass_build",
    "fail": "fail_build",
    "cancel": "abort",
    "fail_closed": "give_up",
}
OUTCOMES = {"succeeded": "passed"}


def renamed(text: str, names: dict[str, str]) -> str:
    """``text`` with every whole-word occurrence of each name replaced."""
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    return pattern.sub(lambda m: names[m.group(1)], text)


def rename_request_machine(text: str, *, outcomes: dict[str, str]) -> str:
    """Rename states and triggers everywhere, outcome names as given.

    Role names (the keys under ``roles:``) are the framework's vocabulary and stay; the
    triggers they name are renamed like every other mention.
    """
    out, block = [], ""
    for line in text.splitlines(keepends=True):
        if not line.startswith(" "):
            block = line.split(":", 1)[0]
        if block == "roles" and line.startswith("  "):
            key, value = line.split(":", 1)
            out.append(key + ":" + renamed(value, TRIGGERS))
        elif block == "outcomes" and line.startswith("  "):
            key, value = line.split(":", 1)
            out.append(renamed(key, outcomes) + ":" + renamed(value, TRIGGERS))
        else:
            out.append(renamed(line, {**STATES, **TRIGGERS}))
    return "".join(out)


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    return copy_policy(tmp_path)


def simulate_json(
    capsys: pytest.CaptureFixture[str], timeline: Path, machines: Path, config: Path
) -> dict[str, object]:
    code = main(
        ["simulate", str(timeline), "--json", "--machines", str(machines), "--config", str(config)]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    document: dict[str, object] = json.loads(out)
    return document


def test_a_consistent_rename_replays_the_walkthrough_to_the_same_result(
    policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request_yaml = policy / "machines" / "request.yaml"
    request_yaml.write_text(
        rename_request_machine(request_yaml.read_text(encoding="utf-8"), outcomes=OUTCOMES),
        encoding="utf-8",
    )
    timeline = policy / "walkthrough.yaml"
    timeline.write_text(
        WALKTHROUGH.read_text(encoding="utf-8").replace("outcome: succeeded", "outcome: passed"),
        encoding="utf-8",
    )
    assert "outcome: passed" in timeline.read_text(encoding="utf-8")
    assert main(["validate", str(policy / "machines")]) == 0
    capsys.readouterr()

    unrenamed = simulate_json(capsys, WALKTHROUGH, MACHINES, CONFIG)
    renamed_run = simulate_json(
        capsys, timeline, policy / "machines", policy / "config" / "queues.yaml"
    )
    # The end event is named for the outcome, which was renamed too.
    announced = json.dumps(unrenamed).replace(
        '"validation.repository.succeeded"', '"validation.repository.passed"'
    )
    expected = json.loads(renamed(announced, STATES))
    assert renamed_run == expected
    states = {r["state"] for r in renamed_run["requests"]}  # type: ignore[index]
    assert states == {"green", "skipped", "building"}


def test_an_outcome_the_machine_does_not_declare_is_a_located_simulate_error(
    policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request_yaml = policy / "machines" / "request.yaml"
    request_yaml.write_text(
        rename_request_machine(request_yaml.read_text(encoding="utf-8"), outcomes=OUTCOMES),
        encoding="utf-8",
    )
    code = main(
        [
            "simulate",
            str(WALKTHROUGH),
            "--machines",
            str(policy / "machines"),
            "--config",
            str(policy / "config" / "queues.yaml"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    line = next(
        n
        for n, text in enumerate(WALKTHROUGH.read_text(encoding="utf-8").splitlines(), 1)
        if "outcome: succeeded" in text
    )
    assert re.search(
        rf"walkthrough\.yaml:{line}:\d+: .*outcome 'succeeded' is not one of "
        r"cancelled, failed, passed",
        err,
    ), err


def located(out: str) -> list[tuple[str, int, str]]:
    found = re.findall(r"^(\S+\.yaml):(\d+):\d+: (.*)$", out, re.M)
    return [(Path(f).name, int(n), msg) for f, n, msg in found]


def line_of(path: Path, fragment: str) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    return next(n for n, text in enumerate(lines, 1) if fragment in text)


def test_a_state_renamed_only_in_its_declaration_is_located(
    policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request_yaml = policy / "machines" / "request.yaml"
    text = request_yaml.read_text(encoding="utf-8")
    request_yaml.write_text(
        text.replace("  - name: accepted\n", "  - name: queued\n"), encoding="utf-8"
    )
    assert main(["validate", str(policy / "machines")]) == 1
    issues = located(capsys.readouterr().out)
    assert (
        "request.yaml",
        line_of(request_yaml, "initial: accepted"),
        (
            "state 'accepted' is not declared; declared states: queued, processing, superseded, "
            "succeeded, failed, cancelled"
        ),
    ) in issues
    assert all(msg.startswith("state 'accepted' is not declared") for _, _, msg in issues)


def test_a_trigger_renamed_only_in_its_transitions_names_the_role(
    policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request_yaml = policy / "machines" / "request.yaml"
    text = request_yaml.read_text(encoding="utf-8")
    request_yaml.write_text(
        text.replace("  - trigger: admit\n", "  - trigger: start\n"), encoding="utf-8"
    )
    assert main(["validate", str(policy / "machines")]) == 1
    issues = located(capsys.readouterr().out)
    assert issues == [
        (
            "request.yaml",
            line_of(request_yaml, "admit: admit"),
            "role 'admit' names trigger 'admit', which no transition declares; declared "
            "triggers: start, supersede, succeed, fail, cancel, fail_closed, withdraw",
        )
    ]


def test_an_outcome_whose_trigger_was_renamed_away_is_located(
    policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request_yaml = policy / "machines" / "request.yaml"
    text = request_yaml.read_text(encoding="utf-8")
    request_yaml.write_text(
        text.replace(
            "  succeeded: {trigger: succeed, green: true}\n", "  succeeded: {trigger: succeed}\n"
        ),
        encoding="utf-8",
    )
    assert main(["validate", str(policy / "machines")]) == 1
    issues = located(capsys.readouterr().out)
    assert issues == [
        (
            "request.yaml",
            line_of(request_yaml, "outcomes:"),
            "exactly one outcome must be 'green: true' (recording it advances the queue's "
            "last green); none is",
        )
    ]

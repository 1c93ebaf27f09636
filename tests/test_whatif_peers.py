"""docs/whatif.md, "Against peers": the documented run, as a user runs it.

The command is read from the section, run, and its figures table must be the one the
section shows; the same run as JSON has one column per policy and the orderings the
section states: serial builds every head, cancel in progress throws builds away, the
shipped policy and the other peers never preempt, Zuul's supercedent manager schedules
as the shipped policy does. The trunk it runs on is the generator's, byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from documented_runs import documented, shown_in_order

from bench.whatif import BURSTY_TRUNK, generate, write_timeline
from stovepipe_fsm.apps.cli import EXIT_OK, main

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "whatif.md"
TRUNK = ROOT / "examples" / "bursty_trunk.yaml"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(argv) == EXIT_OK, capsys.readouterr().err
    return capsys.readouterr().out


def test_the_trunk_is_the_generators(tmp_path: Path) -> None:
    again = tmp_path / "bursty_trunk.yaml"
    write_timeline(generate(**BURSTY_TRUNK), again)
    assert again.read_bytes() == TRUNK.read_bytes()
    doc = yaml.safe_load(TRUNK.read_text(encoding="utf-8"))
    assert "max_concurrent" not in doc["config"]  # every policy runs with its own


def test_the_documented_table_is_what_the_command_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv, shown = documented(DOC, "Against peers")
    assert len(shown) == 1
    assert shown_in_order(run(argv, capsys).splitlines(), shown)


def test_one_column_per_policy_and_the_orderings_hold(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv, _ = documented(DOC, "Against peers")
    doc: dict[str, Any] = json.loads(run([*argv, "--json"], capsys))
    labels = [p["label"] for p in doc["policies"]]
    assert labels == [
        "policy",
        "serial_every_head",
        "cancel_in_progress",
        "skip_intermediate_builds",
        "supercedent",
        "max_concurrent=2",
    ]
    assert all(len(q["figures"]) == len(labels) for q in doc["queues"])
    total = dict(zip(labels, doc["total"], strict=True))
    heads = len(yaml.safe_load(TRUNK.read_text(encoding="utf-8"))["history"])

    def builds(figures: dict[str, Any]) -> int:
        return int(figures["builds"]["full"] + figures["builds"]["incremental"])

    serial = total["serial_every_head"]
    assert builds(serial) == heads and serial["supersedes"] == 0
    assert builds(serial) == max(builds(f) for f in total.values())
    cancel = total["cancel_in_progress"]
    assert cancel["preempted"] > 0
    assert cancel["ingest_to_green_ms"]["count"] < total["policy"]["ingest_to_green_ms"]["count"]
    for label in labels:
        if label != "cancel_in_progress":
            assert total[label]["preempted"] == 0, label
    assert total["supercedent"] == total["policy"]
    # A second slot builds more heads than one, and wastes none of them.
    assert builds(total["max_concurrent=2"]) > builds(total["policy"])

"""``whatif`` with culprit finding: the red trunk example under the find_culprits policy,
without culprit finding (probe_slots=0) and with one, two and four probe slots.

Orderings only, never timings: with no flakes every search names the declared culprit;
no queue ever runs more probes at once than its probe slots; probes take no build slot,
so every trunk head goes green when it does without culprit finding, never later.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from documented_runs import documented, shown_in_order

from bench.whatif import RED_TRUNK, generate, write_timeline
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.cli import EXIT_OK, main
from stovepipe_fsm.apps.whatif.culprits import ROWS
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.timed import replay_timed
from stovepipe_fsm.simulation.timeline import load_timeline

ROOT = Path(__file__).resolve().parent.parent
TRUNK = ROOT / "examples" / "red_trunk.yaml"
DOC = ROOT / "docs" / "whatif.md"
POLICY = ROOT / "examples" / "policies" / "find_culprits"
SLOTS = (0, 1, 2, 4)
VARY = ["--vary", "probe_slots=" + ",".join(map(str, SLOTS))]


def whatif(capsys: pytest.CaptureFixture[str], *args: str, config: Path | None = None) -> str:
    capsys.readouterr()
    config = config or POLICY / "config" / "queues.yaml"
    policy = ["--machines", str(POLICY / "machines"), "--config", str(config)]
    assert main(["whatif", *args, *policy]) == EXIT_OK, capsys.readouterr().err
    return capsys.readouterr().out


def labels_of(table: str) -> list[str]:
    """The figure label of each row of a table that shows no queue name."""
    return [re.split(r"\s{2,}", line.strip())[0] for line in table.splitlines() if line[:1] == " "]


@pytest.fixture(scope="module")
def no_flakes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The red trunk with flake_rate 0: every red build is the culprit's doing."""
    doc = yaml.safe_load(TRUNK.read_text(encoding="utf-8"))
    doc["flake_rate"] = 0.0
    path = tmp_path_factory.mktemp("red") / "no_flakes.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def by_slots(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The culprit figures of each --vary column, by its probe_slots."""
    labels = [p["label"] for p in doc["policies"]]
    return {
        int(label.split("=")[1]): figures
        for label, figures in zip(labels, doc["culprits"], strict=True)
        if label.startswith("probe_slots=")
    }


def test_the_trunk_is_the_generators(tmp_path: Path) -> None:
    again = tmp_path / "red_trunk.yaml"
    write_timeline(generate(**RED_TRUNK), again)
    assert again.read_bytes() == TRUNK.read_bytes()


def test_without_flakes_every_search_names_the_declared_culprit(
    no_flakes: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(whatif(capsys, str(no_flakes), *VARY, "--json"))
    columns = by_slots(doc)
    assert columns[0]["searches"] == columns[0]["probe_builds"] == 0
    for slots in SLOTS[1:]:
        found = columns[slots]
        assert found["searches"] > 0, slots
        assert found["named"] == found["named_right"] == found["searches"], (slots, found)
        assert (found["unresolved"], found["open"]) == (0, 0), (slots, found)
        assert found["probe_builds"] > 0, slots
        assert 0 < found["most_probes_at_once"] <= slots, (slots, found)


def test_flakes_leave_searches_unresolved_and_slots_are_never_exceeded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = json.loads(whatif(capsys, str(TRUNK), *VARY, "--json"))
    assert len(doc["culprits"]) == len(doc["policies"]) == len(doc["total"])
    columns = by_slots(doc)
    assert columns[0]["searches"] == 0
    for slots in SLOTS[1:]:
        found = columns[slots]
        assert found["most_probes_at_once"] <= slots
        assert found["named_right"] <= found["named"]
        assert found["searches"] == found["named"] + found["unresolved"] + found["open"]
        assert sum(found["unresolved_reasons"].values()) == found["unresolved"]
    assert any(f["unresolved_reasons"].get("red_not_reproduced") for f in columns.values())


@pytest.mark.parametrize("flakes", [True, False])
def test_trunk_heads_go_green_no_later_with_culprit_finding(flakes: bool, no_flakes: Path) -> None:
    machines = load_process_machines(POLICY / "machines")
    timeline = load_timeline(TRUNK if flakes else no_flakes)
    greens: dict[int, dict[str, int]] = {}
    probes: dict[int, int] = {}
    for slots in SLOTS:
        config = StaticConfigStore(
            {"defaults": {"probe_slots": slots}}, parameters=machines.parameters
        )
        run = replay_timed(timeline, machines, config)
        heads = [r for r in run.world.requests.snapshot() if not r.probe_of]
        probes[slots] = len(run.world.requests.snapshot()) - len(heads)
        greens[slots] = {
            r.uri: t.ended_ms
            for r in heads
            if r.state == "succeeded" and (t := run.times[r.id]).ended_ms is not None
        }
    assert probes[0] == 0 and all(probes[s] > 0 for s in SLOTS[1:])
    for slots in SLOTS[1:]:
        assert greens[slots].keys() >= greens[0].keys(), slots
        assert all(greens[slots][uri] <= at for uri, at in greens[0].items()), slots


def test_probes_are_counted_apart_from_the_trunk_heads(capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(whatif(capsys, str(TRUNK), *VARY, "--json"))
    heads = {json.dumps(figures, sort_keys=True) for figures in doc["total"]}
    assert len(heads) == 1, "the heads' figures are the same in every column"
    assert doc["differences"] == []


def test_both_tables_show_the_culprit_rows_after_the_outcomes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    labels = [label for label, _ in ROWS]
    columns = labels_of(whatif(capsys, str(TRUNK), *VARY))
    assert [f for f in columns if f in labels] == labels
    last_outcome = max(i for i, f in enumerate(columns) if f.startswith("outcomes "))
    assert columns.index(labels[0]) == last_outcome + 1
    reasons = columns.index("unresolved") + 1
    assert columns[reasons] == "red_not_reproduced"
    off = tmp_path / "off.yaml"
    off.write_text("defaults: {probe_slots: 0}\n")
    two = whatif(capsys, str(TRUNK), "--vs-config", str(off))
    assert [f for f in labels_of(two) if f in labels] == labels
    [row] = [line for line in two.splitlines() if line.strip().startswith("culprit searches")]
    assert row.split()[-1] == "0" and int(row.split()[-2]) > 0
    doc = json.loads(whatif(capsys, str(TRUNK), "--vs-config", str(off), "--json"))
    assert list(doc["culprits"]) == ["policy", "vs_policy"]
    on, off_figures = doc["culprits"]["policy"], doc["culprits"]["vs_policy"]
    assert off_figures["probe_builds"] == 0 < on["probe_builds"]
    assert list(on) == [
        "searches",
        "named",
        "named_right",
        "unresolved",
        "unresolved_reasons",
        "open",
        "probe_builds",
        "probe_slot_hours",
        "most_probes_at_once",
        "red_to_culprit_ms",
    ]


def test_a_run_without_a_search_shows_no_culprit_rows(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    off = tmp_path / "off.yaml"
    off.write_text("defaults: {probe_slots: 0}\n")
    out = whatif(capsys, str(TRUNK), "--vary", "probe_slots=0", config=off)
    assert "culprit searches" not in out and "probe builds" not in out
    doc = json.loads(whatif(capsys, str(TRUNK), "--vary", "probe_slots=0", "--json", config=off))
    assert "culprits" not in doc
    doc = json.loads(whatif(capsys, str(TRUNK), "--vary", "probe_slots=1", "--json", config=off))
    assert [c["searches"] > 0 for c in doc["culprits"]] == [False, True]


def test_the_documented_run_is_what_the_command_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    argv, shown = documented(DOC, "Culprit finding")
    capsys.readouterr()
    assert main(argv) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert len(shown) == 3 and shown_in_order(out, shown)

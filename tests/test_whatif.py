"""``stovepipe-fsm whatif``: one timeline under two policies, compared.

The walkthrough under the shipped policy (coalescing) against the serial-every-head
example policy shows the coalescing difference; identical policies show none; bad input
is reported exactly as ``simulate`` reports it; ``--json`` is one deterministic document.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_simulate_cli import BAD_TIMELINES

from bench.whatif import generate, write_timeline
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.cli import EXIT_OK, EXIT_USAGE, main
from stovepipe_fsm.apps.whatif import command as whatif_command
from stovepipe_fsm.apps.whatif.compare import percentile
from stovepipe_fsm.apps.whatif.parallel import can_fork
from stovepipe_fsm.config.loader import load_queue_config
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.replay import simulate
from stovepipe_fsm.simulation.timed import replay_timed
from stovepipe_fsm.simulation.timeline import load_timeline

ROOT = Path(__file__).resolve().parent.parent
WALKTHROUGH = "examples/walkthrough.yaml"
SERIAL = "examples/policies/serial_every_head"
VS_SERIAL = ["--vs-machines", f"{SERIAL}/machines", "--vs-config", f"{SERIAL}/config/queues.yaml"]
VS_SHIPPED = ["--vs-machines", "machines", "--vs-config", "config/queues.yaml"]


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def whatif_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = run_cli(["whatif", *args, "--json"], capsys)
    assert code == EXIT_OK, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_walkthrough_coalescing_against_serial_every_head(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = whatif_json([WALKTHROUGH, *VS_SERIAL], capsys)
    (queue,) = doc["queues"]
    assert queue["queue"] == "monorepo/main"
    coalescing, serial = queue["policy"], queue["vs_policy"]
    assert doc["total"] == {"policy": coalescing, "vs_policy": serial}
    # Coalescing supersedes B..E and builds A (full) then F (incremental since A);
    # serial supersedes nothing and builds in ingest order: A, then B, the rest wait.
    assert (coalescing["supersedes"], serial["supersedes"]) == (4, 0)
    assert coalescing["builds"] == {"full": 1, "incremental": 1, "skipped": 0}
    assert serial["builds"] == {"full": 1, "incremental": 1, "skipped": 0}
    assert coalescing["holds"] == 2
    assert serial["holds"] == 3
    # A went green at 1000 ms under both; F (coalescing) and B (serial) waited 2000 ms.
    green = {"count": 1, "p50": 1000, "p95": 1000, "max": 1000}
    assert coalescing["ingest_to_green_ms"] == serial["ingest_to_green_ms"] == green
    assert coalescing["longest_wait_for_slot_ms"] == serial["longest_wait_for_slot_ms"] == 2000
    rid = "request/monorepo/main/"
    assert doc["differences"] == [
        {
            "queue": "monorepo/main",
            "uri": "B",
            "request_id": f"{rid}2",
            "outcome": "superseded",
            "vs_outcome": "processing",
        },
        *(
            {
                "queue": "monorepo/main",
                "uri": uri,
                "request_id": f"{rid}{n}",
                "outcome": "superseded",
                "vs_outcome": "accepted",
            }
            for n, uri in ((3, "C"), (4, "D"), (5, "E"))
        ),
        {
            "queue": "monorepo/main",
            "uri": "F",
            "request_id": f"{rid}6",
            "outcome": "processing",
            "vs_outcome": "accepted",
        },
    ]


def test_text_shows_the_figures_side_by_side_and_the_differences(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(["whatif", WALKTHROUGH, *VS_SERIAL], capsys)
    assert code == EXIT_OK, err
    lines = out.splitlines()
    assert lines[0] == f"timeline: {WALKTHROUGH}"
    rows = [line.split() for line in lines]
    assert ["monorepo/main", "builds", "full", "1", "1"] in rows
    assert ["supersedes", "4", "0"] in rows
    assert ["longest", "wait", "for", "slot", "ms", "2000", "2000"] in rows
    assert "requests whose final outcome differs: 5" in lines
    assert ["monorepo/main", "C", "request/monorepo/main/3", "superseded", "accepted"] in rows


def test_identical_policies_differ_nowhere(capsys: pytest.CaptureFixture[str]) -> None:
    doc = whatif_json([WALKTHROUGH, *VS_SHIPPED], capsys)
    assert doc["differences"] == []
    assert doc["total"]["policy"] == doc["total"]["vs_policy"]
    assert doc["completes"]["policy"] == doc["completes"]["vs_policy"]
    code, out, _ = run_cli(["whatif", WALKTHROUGH, *VS_SHIPPED], capsys)
    assert code == EXIT_OK
    assert out.rstrip().endswith("requests whose final outcome differs: none")


def test_json_round_trips_and_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["whatif", WALKTHROUGH, *VS_SERIAL, "--json"]
    outputs = [run_cli(args, capsys)[1] for _ in range(2)]
    assert outputs[0] == outputs[1]
    doc = json.loads(outputs[0])
    assert json.dumps(doc, indent=2) + "\n" == outputs[0]
    assert set(doc) == {
        "timeline",
        "policy",
        "vs_policy",
        "seed",
        "queues",
        "total",
        "completes",
        "differences",
    }
    assert doc["vs_policy"] == {
        "machines": f"{SERIAL}/machines",
        "config": f"{SERIAL}/config/queues.yaml",
    }


# A complete for a head that is not building is a run-time refusal in ``simulate``; under
# another policy it is an outcome given early, which whatif keeps (tested below).
KEPT_BY_WHATIF = {"complete_before_admit"}


@pytest.mark.parametrize("name", sorted(set(BAD_TIMELINES) - KEPT_BY_WHATIF))
def test_invalid_timeline_is_reported_as_simulate_reports_it(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(BAD_TIMELINES[name][0])
    sim_code, _, sim_err = run_cli(["simulate", str(path)], capsys)
    code, out, err = run_cli(["whatif", str(path), *VS_SERIAL, "--json"], capsys)
    assert (code, out) == (EXIT_USAGE, "")
    assert sim_code == EXIT_USAGE
    assert err == sim_err
    _, line, column, fragment = BAD_TIMELINES[name]
    assert err.startswith(f"{path}:{line}:{column}: ")
    assert fragment in err


def test_a_complete_before_admission_is_kept_not_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (name,) = KEPT_BY_WHATIF
    path = tmp_path / f"{name}.yaml"
    path.write_text(BAD_TIMELINES[name][0])
    doc = whatif_json([str(path), *VS_SHIPPED], capsys)
    kept = {"applied": 0, "dropped": 0, "waiting": 1, "recorded": 0, "inferred": 0}
    assert doc["completes"] == {"policy": kept, "vs_policy": kept}


def test_invalid_vs_policy_is_located(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "queues.yaml"
    config.write_text("defaults:\n  max_concurrent: 0\n")
    code, out, err = run_cli(
        ["whatif", WALKTHROUGH, "--vs-machines", "machines", "--vs-config", str(config)], capsys
    )
    assert (code, out) == (EXIT_USAGE, "")
    assert err.startswith(f"{config}:2:"), err
    assert "Traceback" not in err


# --- the two replays side by side (apps/whatif/parallel.py) ----------------------------


@pytest.fixture
def parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every timeline long enough for the second replay to run in a forked process."""
    assert can_fork(), "these tests need a second core and fork"
    monkeypatch.setattr(whatif_command, "PARALLEL_FROM_STEPS", 0)


@pytest.mark.parametrize("output", [["--json"], []])
def test_side_by_side_replays_print_what_one_after_the_other_prints(
    output: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    path = tmp_path / "bench.yaml"
    write_timeline(generate(300, 3, seed=4), path)
    args = ["whatif", str(path), *VS_SERIAL, *output]
    monkeypatch.setattr(whatif_command, "can_fork", lambda: False)
    code, sequential, err = run_cli(args, capsys)
    assert code == EXIT_OK, err
    monkeypatch.setattr(whatif_command, "can_fork", lambda: True)
    monkeypatch.setattr(whatif_command, "PARALLEL_FROM_STEPS", 0)
    forked: list[bool] = []
    real = whatif_command.replay_both
    monkeypatch.setattr(
        whatif_command,
        "replay_both",
        lambda a, b, *, parallel: forked.append(parallel) or real(a, b, parallel=parallel),
    )
    code, side_by_side, err = run_cli(args, capsys)
    assert (code, err) == (EXIT_OK, "")
    assert forked == [True]
    assert side_by_side == sequential
    assert "differs: " in side_by_side or '"differences"' in side_by_side


@pytest.mark.usefixtures("parallel")
def test_an_invalid_policy_in_the_forked_replay_is_located(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "queues.yaml"
    config.write_text("defaults:\n  max_concurrent: 0\n")
    code, out, err = run_cli(
        ["whatif", WALKTHROUGH, "--vs-machines", "machines", "--vs-config", str(config)], capsys
    )
    assert (code, out) == (EXIT_USAGE, "")
    assert err.startswith(f"{config}:2:"), err
    assert "Traceback" not in err


# --- the timed replay --------------------------------------------------------------


def timed(text: str, policy: str, tmp_path: Path) -> Any:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    machines = load_process_machines(f"{policy}/machines")
    config = StaticConfigStore(
        load_queue_config(f"{policy}/config/queues.yaml", parameters=machines.parameters)
    )
    return replay_timed(load_timeline(path), machines, config)


KEPT_OUTCOME = """\
config: {max_concurrent: 1, gate_wait_delay_ms: 100}
history: {A: [], B: [A]}
steps:
  - ingest: A
  - advance_ms: 10
  - ingest: B
  - run
  - advance_ms: 40
  - complete: {uri: B, outcome: succeeded}
  - advance_ms: 50
  - complete: {uri: A, outcome: succeeded}
  - advance_ms: 100
  - run
"""


def test_an_outcome_for_a_waiting_head_is_recorded_once_it_builds(tmp_path: Path) -> None:
    run = timed(KEPT_OUTCOME, SERIAL, tmp_path)
    a, b = "request/monorepo/main/1", "request/monorepo/main/2"
    assert (run.times[a].ingest_ms, run.times[a].admitted_ms, run.times[a].ended_ms) == (0, 10, 100)
    # B waited behind A; its outcome (given at 50 ms) is recorded when it is admitted.
    assert (run.times[b].ingest_ms, run.times[b].admitted_ms, run.times[b].ended_ms) == (
        10,
        200,
        200,
    )
    assert (run.completes_applied, run.completes_dropped, run.completes_waiting) == (2, 0, 0)


def test_an_outcome_for_a_superseded_head_is_dropped(tmp_path: Path) -> None:
    run = timed(KEPT_OUTCOME, ".", tmp_path)
    a, b = "request/monorepo/main/1", "request/monorepo/main/2"
    assert run.times[a].admitted_ms is None and run.times[a].ended_ms == 10
    assert (run.times[b].admitted_ms, run.times[b].ended_ms) == (10, 50)
    assert (run.completes_applied, run.completes_dropped, run.completes_waiting) == (1, 1, 0)


def test_the_timed_replay_ends_as_simulate_ends(tmp_path: Path) -> None:
    """Where every complete applies, timing the run changes nothing in it."""
    machines = load_process_machines("machines")
    config = StaticConfigStore(
        load_queue_config("config/queues.yaml", parameters=machines.parameters)
    )
    timeline = load_timeline(WALKTHROUGH)
    run = replay_timed(timeline, machines, config)
    world = simulate(timeline, machines, config).world
    assert run.world.requests.snapshot() == world.requests.snapshot()
    assert run.world.queues.snapshot() == world.queues.snapshot()
    assert run.world.hold_log == world.hold_log


def test_percentile_is_nearest_rank() -> None:
    values = tuple(range(1, 21))  # 1..20
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 100)) == (10, 19, 20)
    assert percentile((7,), 50) == percentile((7,), 95) == 7
    assert percentile((), 50) is None


def test_the_bench_timeline_is_deterministic_and_replays(tmp_path: Path) -> None:
    doc = generate(300, 3, seed=7)
    assert doc == generate(300, 3, seed=7)
    assert doc != generate(300, 3, seed=8)
    path = tmp_path / "bench.yaml"
    write_timeline(doc, path)
    timeline = load_timeline(path)
    assert sum(1 for s in timeline.steps if s.kind == "ingest") == 300
    machines = load_process_machines("machines")
    config = StaticConfigStore(
        load_queue_config("config/queues.yaml", parameters=machines.parameters)
    )
    run = replay_timed(timeline, machines, config)
    assert len(run.times) == 300
    assert {q.name for q in run.world.queues.snapshot()} == {f"repo{i}/main" for i in range(3)}


def test_vs_config_alone_compares_two_configs_under_one_set_of_machines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    two = tmp_path / "two.yaml"
    two.write_text("defaults: {max_concurrent: 2}\n")
    args = [WALKTHROUGH, "--config", "config/queues.yaml", "--vs-config", str(two)]
    doc = whatif_json(args, capsys)
    assert doc["vs_policy"] == {"machines": "machines", "config": str(two)}
    assert doc["policy"]["machines"] == "machines"
    assert doc["seed"] == 0
    for figures in (doc["total"]["policy"], doc["total"]["vs_policy"]):
        assert set(figures) >= {"wasted_speculative_builds", "slot_hours", "builds"}
        assert set(figures["builds"]) == {"full", "incremental", "skipped"}

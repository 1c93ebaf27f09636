"""Builds in a replay (``simulation/builds.py``) and the recorded run ``export`` writes
(``apps/service/recorded_run.py``), without a broker: each build a replay admits ends by
itself, with the recorded duration and outcome of its commit or, for a commit never
built live, a seeded draw and the outcome of the first recorded build containing it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from stovepipe_fsm.adapters.git.history import RecordedHistory
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.cli import EXIT_OK, main
from stovepipe_fsm.apps.service.export import repositories_of
from stovepipe_fsm.apps.service.recorded_run import Recorded, recorded_timeline
from stovepipe_fsm.apps.whatif.figures import TOTAL, figures_by_queue
from stovepipe_fsm.domain.entities import Request
from stovepipe_fsm.domain.trail_record import DEAD_LETTERED, OPERATOR, TrailRecord, detail
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.replay import result_json, simulate
from stovepipe_fsm.simulation.timed import replay_timed
from stovepipe_fsm.simulation.timeline import load_timeline

ROOT = Path(__file__).resolve().parent.parent
Q = "mono/main"
OUTCOMES = {"succeeded": "succeeded", "failed": "failed"}
T0 = 1_800_000_000_000


def row(n: int, uri: str, state: str, ingest: int, **more: Any) -> Request:
    return Request(f"request/{Q}/{n}", Q, uri, state, ingested_at_ms=T0 + ingest, **more)


def built(n: int, uri: str, state: str, ingest: int, admit: int, end: int, **more: Any) -> Request:
    return row(
        n,
        uri,
        state,
        ingest,
        build_strategy="full",
        admitted_at_ms=T0 + admit,
        ended_at_ms=T0 + end,
        **more,
    )


def machines() -> Any:
    return load_process_machines(str(ROOT / "machines"))


def write(tmp_path: Path, timeline: dict[str, Any], name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(timeline, sort_keys=False))
    return path


def replay(path: Path, slots: int = 1, seed: int = 0) -> Any:
    config = StaticConfigStore({"defaults": {"max_concurrent": slots, "gate_wait_delay_ms": 100}})
    return replay_timed(load_timeline(path), machines(), config, seed=seed)


# A live run, one slot: A built (3 s); B, C, D come while A builds, B and C superseded,
# D held and built after A (3 s, failed); E comes later and is built (2 s).
LIVE = [
    built(1, "A", "succeeded", 0, 0, 3000),
    row(2, "B", "superseded", 1000, superseded_by=f"request/{Q}/3", ended_at_ms=T0 + 1100),
    row(3, "C", "superseded", 1100, superseded_by=f"request/{Q}/4", ended_at_ms=T0 + 1200),
    built(4, "D", "failed", 1200, 3050, 6050),
    built(5, "E", "succeeded", 7000, 7000, 9000),
]
HISTORY = RecordedHistory({"A": [], "B": ["A"], "C": ["B"], "D": ["C"], "E": ["D"]})


def exported(tmp_path: Path, rows: list[Request] = LIVE, **more: Any) -> Path:
    recorded = Recorded(rows, OUTCOMES, history=HISTORY, **more)
    export = recorded_timeline(
        recorded, since_ms=0, until_ms=T0 + 20_000, queue_glob="**", description="test"
    )
    return write(tmp_path, export.timeline)


def test_the_export_lists_builds_in_admission_order_and_steps_up_to_the_export(
    tmp_path: Path,
) -> None:
    doc = yaml.safe_load(exported(tmp_path).read_text())
    assert doc["builds"] == [
        {"uri": "A", "queue": Q, "admitted_ms": 0, "duration_ms": 3000, "outcome": "succeeded"},
        {"uri": "D", "queue": Q, "admitted_ms": 3050, "duration_ms": 3000, "outcome": "failed"},
        {"uri": "E", "queue": Q, "admitted_ms": 7000, "duration_ms": 2000, "outcome": "succeeded"},
    ]
    assert doc["history"] == HISTORY.parents
    assert sum(s["run_ms"] for s in doc["steps"] if isinstance(s, dict) and "run_ms" in s) == 20_000
    assert not any(isinstance(s, dict) and "complete" in s for s in doc["steps"])


def test_more_slots_build_the_heads_coalescing_skipped_with_inferred_outcomes(
    tmp_path: Path,
) -> None:
    path = exported(tmp_path)
    by_slots = {}
    for slots in (1, 2, 3):
        run = replay(path, slots)
        states = {r.uri: r.state for r in run.world.requests.snapshot()}
        assert "processing" not in states.values()  # no slot held for want of an outcome
        by_slots[slots] = (run, states)
    one, states_one = by_slots[1]
    assert states_one == {"A": "succeeded", "B": "superseded", "C": "superseded",
                          "D": "failed", "E": "succeeded"}  # fmt: skip
    assert one.world.builds is not None and one.world.builds.inferred == 0
    two, states_two = by_slots[2]
    # B is built beside A: never built live, its outcome is that of the first recorded
    # build containing it (D: failed), and counted as inferred.
    assert states_two["B"] == "failed"
    assert two.world.builds is not None and two.world.builds.inferred >= 1
    # With two slots B took the second one beside A, so D waited for B's (drawn) build:
    # times come from the recorded durations, and differ with the slots.
    d_one = one.times[next(r.id for r in one.world.requests.snapshot() if r.uri == "D")]
    d_two = two.times[next(r.id for r in two.world.requests.snapshot() if r.uri == "D")]
    assert d_one.admitted_ms == 3000  # when A's recorded build ended
    assert d_two.admitted_ms is not None and d_two.admitted_ms > d_one.admitted_ms
    wasted = [figures_by_queue(by_slots[n][0])[TOTAL].wasted_speculative for n in (1, 2, 3)]
    assert wasted[0] == 0


def test_a_draw_is_seeded_and_the_seed_is_stated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = exported(tmp_path)
    config = tmp_path / "two.yaml"
    config.write_text("defaults: {max_concurrent: 3}\n")
    outputs = []
    for seed in ("7", "7"):
        capsys.readouterr()
        code = main(["whatif", str(path), "--vs-config", str(config), "--seed", seed])
        assert code == EXIT_OK
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    assert "seed:      7 " in outputs[0]
    assert "outcomes inferred" in outputs[0]


def test_a_return_a_retry_a_failing_head_and_a_cancel_replay_as_recorded(
    tmp_path: Path,
) -> None:
    rows = [
        built(1, "A", "succeeded", 0, 0, 1000),
        built(2, "B", "failed", 2000, 2000, 3000),
        built(3, "B", "succeeded", 4000, 4000, 5000, retry_of=f"request/{Q}/2"),
        built(4, "A", "succeeded", 6000, 6000, 7000),  # trunk went back to A
        row(5, "C", "failed", 8000, ended_at_ms=T0 + 9000),  # dead-lettered
        built(6, "D", "succeeded", 10_000, 10_000, 13_000),
        row(7, "E", "cancelled", 11_000, ended_at_ms=T0 + 12_000),
    ]
    trails = {
        f"request/{Q}/5": [TrailRecord(DEAD_LETTERED, Q, f"request/{Q}/5", T0 + 9000)],
        f"request/{Q}/7": [
            TrailRecord(
                OPERATOR, Q, f"request/{Q}/7", T0 + 12_000, detail=detail(verb="cancel"), tag="c"
            )
        ],
    }
    history = RecordedHistory({"A": [], "B": ["A"], "C": ["B"], "D": ["C"], "E": ["D"]})
    recorded = Recorded(rows, OUTCOMES, trails, (), history)
    export = recorded_timeline(
        recorded, since_ms=0, until_ms=T0 + 20_000, queue_glob="**", description="test"
    )
    assert (export.returns, export.retries, export.dead_letters, export.cancels) == (1, 1, 1, 1)
    path = write(tmp_path, export.timeline)
    config = StaticConfigStore({"defaults": {"gate_wait_delay_ms": 100, "max_attempts": 2}})
    world = simulate(load_timeline(path), machines(), config).world
    replayed = sorted((r.id, r.uri, r.state, r.retry_of) for r in world.requests.snapshot())
    live = sorted((r.id, r.uri, r.state, r.retry_of) for r in rows)
    assert replayed == live
    assert [rid for rid, _ in world.dead_letters] == [f"request/{Q}/5"]
    assert result_json(world)["recorded_builds"] == {"recorded": 5, "inferred": 0, "seed": 0}


def test_export_reads_each_queues_repository_from_the_config_or_git_repo(tmp_path: Path) -> None:
    config = tmp_path / "queues.yaml"
    config.write_text("queues:\n  mono/main: {repository: /srv/mono}\n  other/main: {}\n")
    queues = ["mono/main", "other/main"]
    assert repositories_of(queues, str(config), None) == {"mono/main": "/srv/mono"}
    both = {"mono/main": "/srv/x", "other/main": "/srv/x"}
    assert repositories_of(queues, str(config), "/srv/x") == both
    assert repositories_of(queues, None, None) == {}


def test_a_probe_is_exported_as_a_build_never_as_a_head(tmp_path: Path) -> None:
    """A culprit search's probe of C (red head D) is a build of C in the export, not an
    ingest: a replay's own search starts its probes."""
    probe = built(6, "C", "failed", 6100, 6100, 6600, probe_of=f"request/{Q}/4")
    doc = yaml.safe_load(exported(tmp_path, [*LIVE, probe]).read_text())
    heads = [
        (kind, s[kind]["uri"])
        for s in doc["steps"]
        if isinstance(s, dict)
        for kind in ("ingest", "return", "retry")
        if kind in s
    ]
    assert heads == [("ingest", uri) for uri in "ABCDE"]
    assert {
        "uri": "C",
        "queue": Q,
        "admitted_ms": 6100,
        "duration_ms": 500,
        "outcome": "failed",
    } in doc["builds"]

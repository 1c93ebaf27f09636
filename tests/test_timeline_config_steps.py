"""``config:`` steps: a timeline changes a queue's settings mid-run, checked against the
machines' parameter declarations before anything runs.

The runs use the tests' own policy (``tests/fixtures``) through ``stovepipe-fsm test``
and ``simulate`` exactly as a user runs them; the bad-input cases must come back as one
located line each, with exit code 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixture_policy import CONFIG, GATE_YAML, MACHINES, copy_policy

from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.config.loader import load_queue_config
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.replay import Simulation, simulate
from stovepipe_fsm.simulation.timeline import load_timeline

POLICY = ["--machines", str(MACHINES), "--config", str(CONFIG)]

# One slot: B is held behind A; two slots from step 6 on: B's recheck admits it.
WIDEN = """\
queue: monorepo/main
config: {max_concurrent: 1, gate_wait_delay_ms: 1000}
history: {A: [], B: [A]}
steps:
  - ingest: A
  - run
  - ingest: B
  - run
  - expect: {request: B, state: accepted, hold_reason: gate_closed}
  - config: {set: {max_concurrent: 2}}
  - advance_ms: 1000
  - run
  - expect: {request: B, state: processing, holds: 1}
  - expect: {in_flight: 2, builds: [A, B]}
"""


def write(tmp_path: Path, text: str, name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def run_test(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["test", str(path), *POLICY])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_change_applies_from_its_step_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_test(write(tmp_path, WIDEN), capsys)
    assert (code, out) == (0, ""), err
    assert "1 passed, 0 failed" in err


def test_without_the_change_the_same_expectations_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, WIDEN.replace("  - config: {set: {max_concurrent: 2}}\n", ""))
    code, out, _ = run_test(path, capsys)
    assert code == 1
    assert "expected request B state processing, got accepted" in out


def test_a_pattern_changes_only_the_queues_it_matches(tmp_path: Path) -> None:
    text = """\
queue: mobile/ios
config: {max_concurrent: 1}
history: {A: [], B: [A]}
steps:
  - config: {queue: "mobile/*", set: {max_concurrent: 2}}
  - ingest: A
  - run
  - ingest: B
  - run
  - ingest: {uri: A, queue: web/app}
  - run
  - ingest: {uri: B, queue: web/app}
  - run
  - expect: {in_flight: 2}
  - expect: {queue: web/app, in_flight: 1}
"""
    sim = run_sim(write(tmp_path, text))
    assert [r.message for r in sim.failures] == []
    assert sum(1 for r in sim.results if r.passed) == 2
    store = sim.world.config
    assert store.get("mobile/android").param("max_concurrent") == 2
    assert store.get("web/app").param("max_concurrent") == 1


def test_later_layers_win_key_by_key(tmp_path: Path) -> None:
    text = """\
queue: monorepo/main
steps:
  - config: {queue: "monorepo/*", set: {max_concurrent: 3, max_attempts: 2}}
  - config: {set: {max_concurrent: 4}}
"""
    sim = run_sim(write(tmp_path, text))
    config = sim.world.config.get("monorepo/main")
    assert (config.param("max_concurrent"), config.max_attempts) == (4, 2)
    other = sim.world.config.get("monorepo/release")
    assert (other.param("max_concurrent"), other.max_attempts) == (3, 2)


def test_an_unknown_key_is_located_and_lists_the_allowed_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "steps:\n  - config: {set: {max_concurent: 2}}\n  - run\n")
    code, _, err = run_test(path, capsys)
    assert code == 2
    assert f"{path}:2:20: config step: unknown key 'max_concurent'; the keys a queue's " in err
    assert (
        "accepts under this policy: gate_wait_delay_ms, max_attempts, max_concurrent, ref, "
        "repository" in err
    )


def test_a_value_of_the_wrong_type_is_located_at_the_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        "steps:\n"
        "  - config:\n"
        "      set:\n"
        "        gate_wait_delay_ms: soon\n"
        "        max_attempts: 0\n",
    )
    code, _, err = run_test(path, capsys)
    assert code == 2
    assert f"{path}:4:29: config step: gate_wait_delay_ms: 'soon' is not of type 'integer'" in err
    assert f"{path}:5:23: config step: max_attempts: 0 is less than the minimum of 1" in err


def test_keys_are_those_the_policys_machines_declare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A policy that declares one more parameter accepts it; the fixture policy does not.
    policy = copy_policy(tmp_path / "policy")
    gate = policy / "machines" / GATE_YAML.name
    text = gate.read_text()
    assert "parameters:\n" in text
    gate.write_text(
        text.replace(
            "parameters:\n",
            "parameters:\n"
            "  build_window:\n"
            "    type: string\n"
            "    default: always\n"
            "    description: when builds may start\n",
            1,
        )
    )
    timeline = write(
        tmp_path,
        "history: {A: []}\n"
        "steps:\n"
        "  - config: {set: {build_window: nights}}\n"
        "  - ingest: A\n"
        "  - run\n"
        "  - expect: {in_flight: 1}\n",
    )
    code, _, err = run_test(timeline, capsys)
    assert code == 2 and "unknown key 'build_window'" in err
    capsys.readouterr()
    args = ["--machines", str(policy / "machines"), "--config", str(policy / "config/queues.yaml")]
    assert main(["test", str(timeline), *args]) == 0, capsys.readouterr().err


def test_a_bad_queue_or_an_empty_change_is_located(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad_queue = write(tmp_path, "steps:\n  - config: {queue: /bad, set: {ref: main}}\n", "q.yaml")
    code, _, err = run_test(bad_queue, capsys)
    assert code == 2
    assert f"{bad_queue}:2:21: invalid queue name '/bad'" in err
    path = write(tmp_path, "steps:\n  - config: {set: {}}\n  - config: {queue: a/b}\n")
    code, _, err = run_test(path, capsys)
    assert code == 2
    assert f"{path}:2:19: steps[0].config.set: {{}} should be non-empty" in err
    assert f"{path}:3:13: steps[1].config: 'set' is a required property" in err


def test_simulate_logs_the_change_as_a_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["simulate", str(write(tmp_path, WIDEN)), *POLICY]) == 0
    out = capsys.readouterr().out
    assert "config monorepo/main: max_concurrent=2  in force from this step on" in out
    assert "expectations: 6 passed, 0 failed" in out


def run_sim(path: Path) -> Simulation:
    """Replay ``path`` on the fixture policy (its config loaded with its declarations)."""
    machines = load_process_machines(MACHINES)
    store = StaticConfigStore(load_queue_config(CONFIG, parameters=machines.parameters))
    return simulate(load_timeline(path), machines, store)

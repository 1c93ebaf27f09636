"""The checker fails when the policy is wrong: every mutant yields a counterexample that
the simulator replays into the same broken state.

Each mutant is a copy of the tests' own machines (``tests/fixtures``) with one plausible
mistake (``check_mutants``); every run here uses that policy, never the shipped one.
For each: ``check`` exits 1 naming the expected invariant, writes a timeline, and that
timeline - loaded by the simulator's own loader and replayed by its own step function
- breaks the same invariant at its last step, checked twice: by ``replay`` and by
re-evaluating the invariant on ``simulate``'s end state directly.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from check_mutants.mutants import MUTANTS, write_mutant
from fixture_policy import CONFIG, MACHINES

from stovepipe_fsm.apps.check.invariants import Rules, check_edge, check_state
from stovepipe_fsm.apps.check.observe import observe
from stovepipe_fsm.apps.check.trace import replay
from stovepipe_fsm.apps.check.variants import Variant
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.located.errors import SpecError
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.replay import simulate
from stovepipe_fsm.simulation.timeline import Timeline, load_timeline

ROOT = Path(__file__).resolve().parent.parent

# mutant -> (invariant it must break, whether lint already rejects it)
EXPECTED = {
    "publish_before_persist": ("persist_before_publish", True),
    "no_coalesce": ("admits_latest", False),
    "no_gate": ("max_concurrent", False),
    "terminal_holds_slot": ("slot_state_holds_slot", True),
}
EDGE_INVARIANTS = {"admits_latest", "strategy_immutable", "last_green_forward"}
SMALL = ["--heads", "2", "--max-concurrent", "1", "--jobs", "1", "--quiet"]


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def run_check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``check`` on the fixture config, and on the fixture machines unless others are named."""
    capsys.readouterr()
    policy = ["--config", str(CONFIG)]
    if "--machines" not in args:
        policy += ["--machines", str(MACHINES)]
    code = main(["check", *args, *policy])
    return code, capsys.readouterr().out


def simulated_violation(timeline: Timeline, machines, rules: Rules) -> str:  # type: ignore[no-untyped-def]
    """The invariant broken by ``simulate``'s end state (edge ones: last step's pair)."""
    store = load_policy_store(str(CONFIG))
    end = observe(simulate(timeline, machines, store).world)
    before_last = replace(timeline, steps=timeline.steps[:-1])
    pre = observe(simulate(before_last, machines, store).world)
    violation = check_edge(pre, end, rules) or check_state(end, rules)
    return violation.invariant if violation else ""


def test_every_mutant_is_covered() -> None:
    assert set(EXPECTED) == set(MUTANTS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_mutant_yields_a_replayable_counterexample(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    invariant, lint_rejects = EXPECTED[name]
    machines_dir = write_mutant(name, tmp_path / name)
    if lint_rejects:
        with pytest.raises(SpecError):
            load_process_machines(machines_dir)
    out = tmp_path / "cx.yaml"

    code, stdout = run_check(
        capsys, "--machines", str(machines_dir), "--no-lint", "--out", str(out), *SMALL
    )

    assert code == 1
    assert f"invariant {invariant}:" in stdout
    assert f"wrote {out}" in stdout
    timeline = load_timeline(out)
    assert timeline.config == {"max_concurrent": 1, "gate_wait_delay_ms": 5000, "max_attempts": 2}
    assert timeline.history["R"] == ("A1",)
    machines = load_process_machines(machines_dir, lint=False)
    replayed = replay(timeline, machines, load_policy_store(str(CONFIG)))
    assert replayed.violation is not None
    assert replayed.violation.invariant == invariant
    assert replayed.step == len(timeline.steps)
    rules = Rules.for_machines(machines, max_concurrent=1, history=timeline.history)
    assert simulated_violation(timeline, machines, rules) == invariant
    if invariant not in EDGE_INVARIANTS:
        assert check_state(observe(replayed.world), rules) is not None

    code, stdout = run_check(
        capsys, "--replay", str(out), "--machines", str(machines_dir), "--no-lint"
    )
    assert code == 1
    assert f"invariant {invariant} is broken" in stdout


def test_the_same_traces_are_clean_on_the_unmutated_machines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A counterexample is about the mutation, not an artefact of the trace."""
    unmutated = load_process_machines(MACHINES)
    store = load_policy_store(str(CONFIG))
    for name in sorted(EXPECTED):
        out = tmp_path / f"{name}.yaml"
        machines_dir = write_mutant(name, tmp_path / name)
        code, _ = run_check(
            capsys, "--machines", str(machines_dir), "--no-lint", "--out", str(out), *SMALL
        )
        assert code == 1
        assert replay(load_timeline(out), unmutated, store).violation is None, name


def test_publish_before_persist_is_caught_at_the_crash_between_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machines_dir = write_mutant("publish_before_persist", tmp_path / "m")
    out = tmp_path / "cx.yaml"
    run_check(capsys, "--machines", str(machines_dir), "--no-lint", "--out", str(out), *SMALL)
    text = out.read_text(encoding="utf-8")
    assert "- {crash: after_publish_build}" in text
    world = replay(
        load_timeline(out),
        load_process_machines(machines_dir, lint=False),
        load_policy_store(str(CONFIG)),
    ).world
    (request,) = world.requests.snapshot()
    assert request.state == "accepted"
    assert [p.request_id for p in world.published.builds()] == [request.id]


def test_without_crashes_the_publish_order_mutant_goes_unseen(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The order only shows when something stops between the two writes: the crash
    points are what make this mutant observable, and the bound that turns them off
    really turns them off."""
    machines_dir = write_mutant("publish_before_persist", tmp_path / "m")
    code, stdout = run_check(
        capsys, "--machines", str(machines_dir), "--no-lint", "--no-crashes", *SMALL
    )
    assert code == 0, stdout


def test_bare_counter_leaks_a_slot_after_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "leak.yaml"
    code, stdout = run_check(capsys, "--bare-counter", "--out", str(out), *SMALL)
    assert code == 1
    assert "invariant idle_counter_exact:" in stdout
    policy = f"--machines {MACHINES} --config {CONFIG}"
    assert f"replay: stovepipe-fsm check --replay {out} {policy} --bare-counter" in stdout
    timeline = load_timeline(out)
    kinds = [step.kind for step in timeline.steps]
    assert kinds == ["ingest", "crash", "deliver", "dead_letter", "deliver"]
    assert timeline.steps[1].value == "after_claim_slot"
    machines = load_process_machines(MACHINES)
    store = load_policy_store(str(CONFIG))
    leaked = replay(timeline, machines, store, variant=Variant(bare_counter=True))
    assert leaked.violation is not None and leaked.violation.invariant == "idle_counter_exact"
    assert leaked.world.queues.snapshot()[0].in_flight_count == 1
    holders = replay(timeline, machines, store)
    assert holders.violation is None
    assert holders.world.queues.snapshot()[0].in_flight_count == 0


def test_bare_counter_wedges_the_queue_after_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a dead-letter to expose the leak, the same crash is a wedge: the head's
    own redelivery counts its own claim as somebody else's and waits forever."""
    out = tmp_path / "wedge.yaml"
    code, stdout = run_check(
        capsys, "--bare-counter", "--max-dead-letters", "0", "--out", str(out), *SMALL
    )
    assert code == 1
    assert "invariant progress:" in stdout
    timeline = load_timeline(out)
    assert [s.describe() for s in timeline.steps] == [
        "ingest A1",
        "crash after_claim_slot",
        "deliver",
    ]
    machines = load_process_machines(MACHINES)
    store = load_policy_store(str(CONFIG))
    wedged = replay(timeline, machines, store, variant=Variant(bare_counter=True))
    assert wedged.violation is not None and wedged.violation.invariant == "progress"
    assert "request/monorepo/main/1 (A1)" in wedged.violation.detail
    assert replay(timeline, machines, store).violation is None

    code, stdout = run_check(capsys, "--replay", str(out), "--bare-counter")
    assert code == 1
    assert "invariant progress is broken" in stdout

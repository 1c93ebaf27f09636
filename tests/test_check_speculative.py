"""check on speculative validation and slot leases: bounded runs at N = 2 and 3 and with
leases stay clean, and every mutation of the rules yields a counterexample that the
simulator replays into the same broken property.

The default ``check`` explores max_concurrent 1 and 2 with no lease; these runs add
N = 3, leases one hold delay long (their expiry explored through clock advances) and a
lag bound, on bounds small enough for the test suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from check_mutants.speculative import BASE, CONFIG, MUTANTS, GreenByArrival, write_mutant

from stovepipe_fsm.apps.check.explorer import Explorer, Setup
from stovepipe_fsm.apps.check.model import Bounds
from stovepipe_fsm.apps.check.trace import as_timeline, replay
from stovepipe_fsm.apps.check.variants import Variant
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.replay import simulate
from stovepipe_fsm.simulation.timeline import load_timeline

ROOT = Path(__file__).resolve().parent.parent
LEASES = CONFIG.parent / "leases.yaml"
QUIET = ["--jobs", "1", "--quiet"]
NO_FAULTS = ["--max-crashes", "0", "--max-duplicates", "0"]
ONE_DUPLICATE = ["--max-crashes", "0", "--max-duplicates", "1"]  # a redelivery, no crash
FEW_FAULTS = ["--max-dead-letters", "0", "--max-outages", "0", "--no-pauses"]

# mutant -> (check that breaks, config, bounds)
EXPECTED: dict[str, tuple[str, Path, list[str]]] = {
    "coalesce_latest_one": (
        "keeps_newest_n",
        CONFIG,
        ["--max-concurrent", "2", "--heads", "2", "--no-rewrite", *NO_FAULTS, *FEW_FAULTS],
    ),
    "repin_on_redelivery": (
        "strategy_immutable",
        CONFIG,
        ["--max-concurrent", "2", "--heads", "2", "--no-rewrite", *ONE_DUPLICATE, *FEW_FAULTS],
    ),
    "rewrite_alongside": (
        "rewrite_holder_alone",
        CONFIG,
        ["--max-concurrent", "2", "--heads", "3", *NO_FAULTS, *FEW_FAULTS],
    ),
    "expiry_ignored": (
        "lease_bounds_stall",
        LEASES,
        ["--max-concurrent", "1", "--heads", "2", "--no-rewrite", *NO_FAULTS, *FEW_FAULTS],
    ),
}


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def run_check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["check", *args, *QUIET])
    return code, capsys.readouterr().out


def test_every_mutant_is_covered() -> None:
    assert set(EXPECTED) == set(MUTANTS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_speculative_mutant_yields_a_replayable_counterexample(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    invariant, config, bounds = EXPECTED[name]
    machines_dir = write_mutant(name, tmp_path / name)
    out = tmp_path / "cx.yaml"
    policy = ["--machines", str(machines_dir), "--config", str(config)]
    code, stdout = run_check(capsys, *policy, "--no-lint", "--out", str(out), *bounds)

    assert code == 1, stdout
    assert f"invariant {invariant}:" in stdout
    timeline = load_timeline(out)
    machines = load_process_machines(machines_dir, lint=False)
    store = load_policy_store(str(config), machines.parameters)
    replayed = replay(timeline, machines, store)
    assert replayed.violation is not None
    assert replayed.violation.invariant == invariant
    assert replayed.step == len(timeline.steps)
    # simulate runs the same timeline to the same end: the trace is a plain timeline.
    simulated = simulate(timeline, machines, store).world
    assert simulated.requests.snapshot() == replayed.world.requests.snapshot()
    # On the unmutated machines the very same steps break nothing.
    shipped = load_process_machines(BASE)
    clean = replay(timeline, shipped, load_policy_store(str(config), shipped.parameters))
    assert clean.violation is None


def test_last_green_by_arrival_order_is_caught(tmp_path: Path) -> None:
    """Rule 2 lives in the record stage, not in a machine file: the mutation is a
    lifecycle that adopts every green as it arrives, and check finds the late green of
    an older head moving the bookmark back."""
    machines = load_process_machines(BASE)
    store = load_policy_store(str(CONFIG), machines.parameters)
    variant = Variant(lifecycle=GreenByArrival)
    bounds = Bounds(
        heads=2, rewrite=False, max_crashes=0, max_duplicates=0, max_dead_letters=0,
        max_outages=0, pauses=False,
    )  # fmt: skip
    setup = Setup(machines, store, bounds, 2, variant)
    result = Explorer(setup).run()
    assert result.counterexample is not None
    assert result.counterexample.violation.invariant == "last_green_forward"
    timeline = as_timeline(setup, result.counterexample)
    kinds = [step.kind for step in timeline.steps]
    assert kinds.count("complete") == 2  # the newer head's green, then the older one's
    broken = replay(timeline, machines, store, variant=variant)
    assert broken.violation is not None
    assert broken.violation.invariant == "last_green_forward"
    assert replay(timeline, machines, store).violation is None


@pytest.mark.slow  # two explorations with crashes and redeliveries
def test_two_and_three_slots_with_crashes_and_redeliveries_hold_every_invariant(
    capsys: pytest.CaptureFixture[str],
) -> None:
    policy = ["--machines", str(BASE), "--config", str(CONFIG)]
    code, stdout = run_check(
        capsys, *policy, "--max-concurrent", "2", "3", "--heads", "3", *FEW_FAULTS
    )
    assert code == 0, stdout
    assert "max_concurrent=2: ok" in stdout
    assert "max_concurrent=3: ok" in stdout
    assert "rewrite_runs_alone" in stdout and "keeps_newest_n" in stdout


def test_leases_and_a_lag_bound_hold_every_invariant(capsys: pytest.CaptureFixture[str]) -> None:
    """Leases one hold delay long expire as the clock advances; lease_bounds_stall then
    also requires that no build ever reporting still lets every waiting head through."""
    policy = ["--machines", str(BASE), "--config", str(LEASES)]
    code, stdout = run_check(
        capsys, *policy, "--max-concurrent", "1", "2", "--heads", "2", *FEW_FAULTS
    )
    assert code == 0, stdout
    assert "lease_bounds_stall" in stdout
    assert "max_concurrent=1: ok" in stdout and "max_concurrent=2: ok" in stdout

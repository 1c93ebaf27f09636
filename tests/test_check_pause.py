"""check and a paused queue: holding by intent is no wedge; once resumed it must move.

The shipped policy declares the ``paused`` parameter, so ``check`` pauses the checked
queue (a ``config`` step; ``--no-pauses`` turns it off) and may resume it. A paused
queue's waiting heads are at rest for the progress pass; after a resume the ordinary
progress requirement applies again.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stovepipe_fsm.apps.check.actions import enabled
from stovepipe_fsm.apps.check.explorer import Explorer, Setup, Tuning
from stovepipe_fsm.apps.check.invariants import quiescent
from stovepipe_fsm.apps.check.model import PAUSE, UNPAUSE, Bounds, Budget, step, step_data
from stovepipe_fsm.apps.check.observe import Observation, observe
from stovepipe_fsm.apps.check.variants import Variant
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.process.catalog import ProcessMachines, load_process_machines
from stovepipe_fsm.simulation.replay import apply_step

ROOT = Path(__file__).resolve().parent.parent
Q = "monorepo/main"
SMALL = {"heads": 2, "rewrite": False, "max_crashes": 0, "max_duplicates": 0}


@pytest.fixture(scope="module")
def machines() -> ProcessMachines:
    return load_process_machines(ROOT / "machines")


def setup_for(machines: ProcessMachines, config: Path | None = None, **bounds: Any) -> Setup:
    store = load_policy_store(str(config or ROOT / "config" / "queues.yaml"), machines.parameters)
    return Setup(machines, store, Bounds(**bounds), 1, Variant())  # type: ignore[arg-type]


def test_pause_and_resume_are_offered_when_the_policy_declares_paused(
    machines: ProcessMachines,
) -> None:
    setup = setup_for(machines, **SMALL)
    rules = setup.rules()
    assert rules.pausable
    world = setup.new_world()
    kinds = [a.kind for a in enabled(observe(world), Budget(), setup.bounds, rules)]
    assert PAUSE not in kinds  # only a delivery reads the pause: tried before one
    world.ingest(Q, "A1")
    kinds = [a.kind for a in enabled(observe(world), Budget(heads=1), setup.bounds, rules)]
    assert PAUSE in kinds and UNPAUSE not in kinds
    apply_step(world, step("config", Q, values=(("paused", True),)))
    assert observe(world).paused == frozenset({Q})
    kinds = [a.kind for a in enabled(observe(world), Budget(heads=1), setup.bounds, rules)]
    assert UNPAUSE in kinds and PAUSE not in kinds
    # Resuming is something the environment may do, never something it is assumed to do.
    fair = enabled(observe(world), Budget(heads=1), setup.bounds, rules, fair_only=True)
    assert UNPAUSE not in [a.kind for a in fair]


def test_a_paused_queue_waiting_is_at_rest_and_a_resumed_one_is_not(
    machines: ProcessMachines,
) -> None:
    setup = setup_for(machines, **SMALL)
    rules = setup.rules()
    world = setup.new_world()
    apply_step(world, step("config", Q, values=(("paused", True),)))
    world.ingest(Q, "A1")
    assert world.deliver_next().hold_reason == "paused"  # type: ignore[union-attr]
    assert quiescent(observe(world), rules)
    apply_step(world, step("config", Q, values=(("paused", False),)))
    assert not quiescent(observe(world), rules)


def test_the_shipped_policy_keeps_progress_under_pause_and_resume(
    machines: ProcessMachines,
) -> None:
    paused = Explorer(setup_for(machines, **SMALL)).run()
    never = Explorer(setup_for(machines, pauses=False, **SMALL)).run()
    assert paused.ok and never.ok
    assert paused.states > never.states  # the pause was explored, not skipped


def test_a_queue_the_config_pauses_for_ever_is_no_wedge(
    machines: ProcessMachines, tmp_path: Path
) -> None:
    config = tmp_path / "queues.yaml"
    config.write_text("queues:\n  monorepo/main: {paused: true}\n", encoding="utf-8")
    result = Explorer(setup_for(machines, config, pauses=False, **SMALL)).run()
    assert result.ok


def mutated_gate(tmp_path: Path, *edits: tuple[str, str]) -> ProcessMachines:
    """The test machines with each ``(old, new)`` text edit made once in the gate."""
    machines_dir = tmp_path / "machines"
    shutil.copytree(ROOT / "tests" / "fixtures" / "machines", machines_dir)
    gate = machines_dir / "queue_gate.yaml"
    text = gate.read_text(encoding="utf-8")
    for old, new in edits:
        assert old in text
        text = text.replace(old, new, 1)
    gate.write_text(text, encoding="utf-8")
    return load_process_machines(machines_dir, lint=False)


def test_a_hold_that_outlives_the_pause_is_a_wedge(tmp_path: Path) -> None:
    # The gate holds a head that has a newer one instead of superseding it: with nothing
    # paused that head waits for ever, and check says so.
    mutant = mutated_gate(
        tmp_path,
        (
            "    dest: acked\n    conditions: newer_head_exists\n    unless: paused\n",
            "    dest: held\n    conditions: newer_head_exists\n",
        ),
        ("    after: [supersede, ack]\n", "    after: hold\n"),
    )
    result = Explorer(setup_for(mutant, **SMALL)).run()
    assert result.counterexample is not None
    assert result.counterexample.violation.invariant == "progress"


def test_a_config_step_round_trips_through_the_counterexample_format() -> None:
    item = step("config", Q, values=(("paused", True),))
    assert step_data(item, Q) == {"config": {"paused": True}}
    other = step("config", "mobile/ios", values=(("paused", False),))
    assert step_data(other, Q) == {"config": {"queue": "mobile/ios", "paused": False}}


def test_check_command_states_the_pause_bound(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "check",
            "--heads",
            "1",
            "--no-rewrite",
            "--no-crashes",
            "--max-concurrent",
            "1",
            "--max-duplicates",
            "0",
            "--max-dead-letters",
            "0",
            "--max-outages",
            "0",
            "--no-overlaps",
            "--quiet",
            "--jobs",
            "1",
        ]
    )
    assert code == 0
    assert "pause and resume" in capsys.readouterr().out


@pytest.mark.parametrize(
    "bounds", [SMALL, {**SMALL, "max_overlaps": 1, "stall_points": ("after_load_queue",)}]
)
def test_resuming_only_where_the_queue_is_read_next_reaches_the_same_stores(
    machines: ProcessMachines, bounds: dict[str, Any]
) -> None:
    """A resume is tried only before a delivery (or a stalled one's rest), or with
    nothing waiting: a resume anywhere else reaches a state whose stores a paused state
    explored has too, and which a fair clock advance takes to a resume tried."""
    # Holds explored on both sides: resumes tried anywhere else come after them.
    reduced = Explorer(setup_for(machines, **bounds), Tuning(explore_paused_holds=True))
    anywhere = Explorer(
        setup_for(machines, **bounds), Tuning(explore_paused_holds=True, resume_anywhere=True)
    )
    assert reduced.run().ok and anywhere.run().ok

    def stores(explorer: Explorer) -> set[Observation]:
        return {replace(obs, paused=frozenset()) for obs in explorer.observations}

    assert stores(reduced) == stores(anywhere)
    assert len(reduced.parent) < len(anywhere.parent)


def test_a_head_lost_while_paused_is_found_once_resumed(tmp_path: Path) -> None:
    """A paused delivery that drops its message instead of holding it leaves an accepted
    head no message will deliver, which only shows once the queue resumes: with nothing
    left waiting, resuming is still explored."""
    mutant = mutated_gate(
        tmp_path,
        (
            "    dest: held\n    conditions: paused\n    after: hold\n",
            "    dest: acked\n    conditions: paused\n    after: ack\n",
        ),
    )
    result = Explorer(setup_for(mutant, **{**SMALL, "heads": 1})).run()
    assert result.counterexample is not None
    assert result.counterexample.violation.invariant == "progress"


def test_where_a_paused_queues_hold_leads_is_not_explored_and_no_stores_are_lost(
    machines: ProcessMachines,
) -> None:
    """A delivery that only holds the paused queue's head leads to states whose stores
    the search reaches from before the hold by the same steps, and a clock advance leads
    back to them: they are not explored, and no stores are lost."""
    reduced = Explorer(setup_for(machines, **SMALL))
    explored = Explorer(setup_for(machines, **SMALL), Tuning(explore_paused_holds=True))
    assert reduced.run().ok and explored.run().ok
    assert reduced.paused_holds > 0 and explored.paused_holds == 0

    def stores(explorer: Explorer) -> set[Observation]:
        return {
            replace(
                obs,
                paused=frozenset(),
                pending=tuple(replace(p, due_in_ms=0) for p in obs.pending),
            )
            for obs in explorer.observations
        }

    assert stores(reduced) == stores(explored)
    assert len(reduced.parent) < len(explored.parent)


def test_a_paused_queues_holds_are_explored_when_its_slots_are_leases(
    machines: ProcessMachines, tmp_path: Path
) -> None:
    """With slot leases the clock is observed (a lease's time left), so a hold is not
    an advance away from a state the search has: every hold is explored."""
    config = tmp_path / "queues.yaml"
    config.write_text("queues:\n  monorepo/main: {max_validation_ms: 10000}\n", encoding="utf-8")
    explorer = Explorer(setup_for(machines, config, **{**SMALL, "heads": 1}))
    assert explorer.run().ok
    assert explorer.explore_paused_holds and explorer.paused_holds == 0


@pytest.mark.parametrize("holds", [False, True])
@pytest.mark.parametrize("bounds", [SMALL, {**SMALL, "max_crashes": 1, "max_duplicates": 1}])
def test_a_paused_due_head_takes_only_its_delivery_and_the_resume_and_no_state_is_lost(
    machines: ProcessMachines, bounds: dict[str, Any], holds: bool
) -> None:
    """From a paused queue whose head is due the search takes only the delivery (with
    its faults) and the resume: every other step's state, paused, is reached by the
    resume, the step and the pause around it. The same states, fewer transitions (with
    the states after a paused queue's holds explored too, and without)."""
    reduced = Explorer(setup_for(machines, **bounds), Tuning(explore_paused_holds=holds))
    every = Explorer(
        setup_for(machines, **bounds),
        Tuning(explore_paused_holds=holds, steps_while_paused=True),
    )
    assert reduced.run().ok and every.run().ok
    assert set(reduced.observations) == set(every.observations)
    assert reduced.transitions < every.transitions

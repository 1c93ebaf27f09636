"""The search itself: what is hashed, which edges exist, pruning, bounds and progress."""

from __future__ import annotations

import re
from dataclasses import fields as dataclass_fields
from pathlib import Path

import pytest

from stovepipe_fsm.apps.check import explorer as explorer_module
from stovepipe_fsm.apps.check.actions import (
    crash_action,
    enabled,
    failed_delivery,
    one_step,
    perform,
)
from stovepipe_fsm.apps.check.explorer import Explorer, Setup, Tuning, can_finish
from stovepipe_fsm.apps.check.model import (
    ADVANCE,
    COMPLETE,
    DELIVER,
    INGEST,
    OUTAGE,
    REDELIVER,
    RESUME,
    STALL,
    Action,
    Bounds,
    Budget,
)
from stovepipe_fsm.apps.check.observe import observe
from stovepipe_fsm.apps.check.variants import Variant
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.domain.entities import Request
from stovepipe_fsm.process.catalog import ProcessMachines, load_process_machines
from stovepipe_fsm.simulation.world import World

ROOT = Path(__file__).resolve().parent.parent
Q = "monorepo/main"


@pytest.fixture(scope="module")
def machines() -> ProcessMachines:
    return load_process_machines(ROOT / "machines")


def setup_for(machines: ProcessMachines, k: int = 1, variant: Variant | None = None, **bounds):  # type: ignore[no-untyped-def]
    store = load_policy_store(str(ROOT / "config" / "queues.yaml"))
    return Setup(machines, store, Bounds(**bounds), k, variant or Variant())


def held_world(setup: Setup, wait_first_ms: int = 0) -> World:
    """A1 admitted, A2 held behind it."""
    world = setup.new_world()
    world.advance(wait_first_ms)
    world.ingest(Q, "A1")
    world.deliver_next()
    world.ingest(Q, "A2")
    assert world.deliver_next().outcome == "held"
    return world


def test_history_is_a_trunk_plus_a_rewrite_off_its_root() -> None:
    bounds = Bounds(heads=3)
    assert bounds.history() == {"A1": [], "A2": ["A1"], "A3": ["A2"], "R": ["A1"]}
    assert bounds.ingest_order() == ("A1", "A2", "A3", "R")
    assert Bounds(heads=2, rewrite=False).ingest_order() == ("A1", "A2")


def test_budget_spends_only_bounded_actions() -> None:
    budget = Budget().spend("crash").spend("deliver").spend("complete").spend("redeliver")
    assert budget == Budget(crashes=1, duplicates=1)


def test_observation_abstracts_the_absolute_clock(machines: ProcessMachines) -> None:
    setup = setup_for(machines)
    early, late = held_world(setup), held_world(setup, wait_first_ms=7_000)
    assert early.clock.now_ms() != late.clock.now_ms()
    assert observe(early) == observe(late)
    assert observe(early).pending[0].due_in_ms == 5_000
    later = early.clone()
    later.advance(2_000)
    assert observe(later) != observe(early)
    assert observe(later).pending[0].due_in_ms == 3_000
    overdue = early.clone()
    overdue.advance(9_000)
    exactly = early.clone()
    exactly.advance(5_000)
    assert observe(overdue) == observe(exactly)


def test_a_held_head_enables_an_advance_to_its_due_time(machines: ProcessMachines) -> None:
    setup = setup_for(machines, heads=2)
    world = held_world(setup)
    rules = setup.rules()
    actions = enabled(observe(world), Budget(heads=2), setup.bounds, rules)
    kinds = [a.kind for a in actions]
    assert "deliver" not in kinds and "crash" not in kinds
    (advance,) = [a for a in actions if a.kind == "advance"]
    assert advance.describe() == "advance_ms 5000"
    assert [a.describe() for a in actions if a.kind == "complete"] == [
        "complete A1 succeeded",
        "complete A1 failed",
        "complete A1 cancelled",
    ]
    twin = perform(world, advance)
    assert twin is not None and observe(twin).pending[0].due_in_ms == 0
    assert world.clock.now_ms() == 0, "performing an action never touches the original"


def test_crash_edges_exist_only_where_the_crash_point_is_reached(
    machines: ProcessMachines,
) -> None:
    setup = setup_for(machines, heads=2)
    rules = setup.rules()
    points = [
        "crash after_claim_slot; deliver",
        "crash after_mark_processing; deliver",
        "crash after_announce; deliver",
        "crash after_publish_build; deliver",
    ]
    held = held_world(setup)
    held.advance(5_000)
    crashes = [a for a in enabled(observe(held), Budget(heads=2), setup.bounds, rules)]
    crashes = [a for a in crashes if a.kind == "crash"]
    assert [a.describe() for a in crashes] == points
    assert [perform(held, a) for a in crashes] == [None] * 4, "held again"
    fresh = setup.new_world()
    fresh.ingest(Q, "A1")
    reached = [a for a in enabled(observe(fresh), Budget(heads=1), setup.bounds, rules)]
    reached = [a for a in reached if a.kind == "crash"]
    assert [a.describe() for a in reached] == points
    for action in reached:
        twin = perform(fresh, action)
        assert twin is not None, f"{action.describe()}: the admit reaches this point"
        assert observe(twin) != observe(fresh)


def test_small_space_is_explored_completely(machines: ProcessMachines) -> None:
    result = Explorer(setup_for(machines, heads=1, rewrite=False)).run()
    assert result.ok
    assert result.states > 20
    assert result.transitions >= result.states - 1


def test_pruning_no_op_faults_loses_no_state(machines: ProcessMachines) -> None:
    setup = setup_for(machines, 2, heads=2, rewrite=False)
    # Every state expanded, so that the states themselves compare.
    pruned = Explorer(setup, Tuning(prune_covered=False))
    full = Explorer(setup, Tuning(prune_faults=False, prune_covered=False))
    pruned_result, full_result = pruned.run(), full.run()
    assert pruned_result.ok and full_result.ok
    assert pruned_result.states == full_result.states
    assert pruned.attempts < full.attempts
    # a crash in a delivery that changed nothing only re-reaches a known state
    assert pruned_result.transitions < full_result.transitions
    # Both prunings together: the same observations, the faults still performed less.
    both, faults = Explorer(setup), Explorer(setup, Tuning(prune_faults=False))
    assert both.run().ok and faults.run().ok
    assert set(both.observations) == set(faults.observations)
    assert both.attempts < faults.attempts


@pytest.mark.parametrize(
    ("k", "bounds"),
    [
        (2, {"heads": 2, "rewrite": False}),
        (1, {"heads": 1}),
        (2, {"heads": 1, "rewrite": False, "max_overlaps": 1}),
        (2, {"heads": 1, "max_cancels": 1}),
    ],
)
def test_covered_states_are_not_expanded_and_nothing_is_lost(
    machines: ProcessMachines, k: int, bounds: dict[str, int]
) -> None:
    """A state whose budget a state of its observation covers is kept, not expanded: the
    same observations and the same edges between them are explored, each observation
    first reached at the same depth (so counterexamples stay shortest)."""
    setup = setup_for(machines, k, **bounds)
    edges: dict[str, list[tuple[int, int]]] = {"pruned": [], "full": []}
    pruned = Explorer(setup, on_edge=lambda s, d: edges["pruned"].append((s, d)))
    full = Explorer(
        setup, Tuning(prune_covered=False), on_edge=lambda s, d: edges["full"].append((s, d))
    )
    pruned_result, full_result = pruned.run(), full.run()
    assert pruned_result.ok and full_result.ok
    assert pruned_result.covered > 0 and full_result.covered == 0
    assert pruned_result.states < full_result.states
    assert pruned_result.transitions < full_result.transitions

    def between(explorer: Explorer, found: list[tuple[int, int]]) -> set[tuple[object, object]]:
        return {(explorer.observations[s], explorer.observations[d]) for s, d in found}

    def first_depths(explorer: Explorer) -> dict[object, int]:
        depths: dict[object, int] = {}
        for obs, depth in zip(explorer.observations, explorer.depth, strict=True):
            depths.setdefault(obs, depth)
        return depths

    assert set(pruned.observations) == set(full.observations)
    assert between(pruned, edges["pruned"]) == between(full, edges["full"])
    assert first_depths(pruned) == first_depths(full)
    # A covered state has edges in, none out.
    sources = {s for s, _ in edges["pruned"]}
    covered = [
        sid
        for sid in range(len(pruned.parent))
        if sid not in sources and any(sid in into for into in pruned.finishes[0].into)
    ]
    assert covered


def test_a_wedge_is_found_as_shortest_with_covered_states_pruned(
    machines: ProcessMachines,
) -> None:
    """The bare counter's wedge (a crash after the claim) is a progress counterexample:
    found at the same depth, with the same invariant, whether covered states are
    expanded or not."""
    setup = setup_for(machines, 1, Variant(bare_counter=True), heads=2, max_dead_letters=0)
    pruned, full = Explorer(setup).run(), Explorer(setup, Tuning(prune_covered=False)).run()
    assert pruned.counterexample is not None and full.counterexample is not None
    assert pruned.counterexample.violation.invariant == "progress"
    assert full.counterexample.violation.invariant == "progress"
    assert len(pruned.counterexample.trace) == len(full.counterexample.trace)


def test_a_budget_covers_one_with_the_same_heads_and_no_less_spent() -> None:
    spent = Budget(heads=2, crashes=1, outages=1)
    assert spent.covers(spent)
    assert Budget(heads=2).covers(spent)
    assert not spent.covers(Budget(heads=2))
    assert not Budget(heads=1).covers(spent)  # the next head ingested differs
    assert not Budget(heads=3).covers(Budget(heads=2))
    # Every other field counts: one more of it spent is covered, never covering.
    others = ("crashes", "duplicates", "dead_letters", "outages", "overlaps", "cancels", "retries")
    for name in others:
        more = Budget(**{name: 1})
        assert Budget().covers(more) and not more.covers(Budget()), name
    assert {f.name for f in dataclass_fields(Budget)} == {"heads", *others}


def test_reusing_each_states_world_for_its_last_action_explores_the_same_graph(
    machines: ProcessMachines,
) -> None:
    setup = setup_for(machines, 2, heads=1)
    reused, forked = Explorer(setup), Explorer(setup, Tuning(reuse_worlds=False))
    reused_result, forked_result = reused.run(), forked.run()
    assert reused_result.ok and forked_result.ok
    assert reused_result.states > 500
    assert (reused_result.states, reused_result.transitions) == (
        forked_result.states,
        forked_result.transitions,
    )
    assert reused.observations == forked.observations
    assert (reused.parent, reused.via, reused.finishes) == (
        forked.parent,
        forked.via,
        forked.finishes,
    )


@pytest.mark.parametrize(
    "bounds",
    [
        {"heads": 2, "rewrite": False},
        {"heads": 1, "max_cancels": 1},
        {"heads": 1, "rewrite": False, "max_overlaps": 1},
    ],
)
def test_performing_each_action_once_per_observation_explores_the_same_graph(
    machines: ProcessMachines, bounds: dict[str, int]
) -> None:
    assert_sharing_explores_the_same_graph(setup_for(machines, 2, **bounds))


def test_sharing_with_a_stall_after_a_timed_write_explores_the_same_graph(
    machines: ProcessMachines,
) -> None:
    """Stalled after the announce, a delivery holds the request it admitted, with the
    admit time of the world that first reached the state: sharing must not see it."""
    setup = setup_for(machines, 1, heads=1, max_overlaps=1, stall_points=("after_announce",))
    assert_sharing_explores_the_same_graph(setup)


def assert_sharing_explores_the_same_graph(setup: Setup) -> None:
    shared, alone = Explorer(setup), Explorer(setup, Tuning(share_outcomes=False))
    shared_result, alone_result = shared.run(), alone.run()
    assert shared_result.ok and alone_result.ok
    assert (shared_result.states, shared_result.transitions, shared_result.depth) == (
        alone_result.states,
        alone_result.transitions,
        alone_result.depth,
    )
    assert shared.observations == alone.observations
    assert (shared.parent, shared.via, shared.finishes) == (
        alone.parent,
        alone.via,
        alone.finishes,
    )
    # states that differ only in their budget had their actions performed once
    assert len(set(shared.observations)) < shared_result.states
    assert shared.attempts < alone.attempts


def test_a_stalled_delivery_is_observed_as_the_stores_are(machines: ProcessMachines) -> None:
    """Without times: worlds the stores cannot tell apart stay one state with a delivery
    in hand, through the rest of that delivery, so overlaps share outcomes too."""
    setup = setup_for(machines, heads=2, rewrite=False, max_overlaps=1)
    start = (
        one_step(INGEST, "ingest", Q, uri="A1"),
        one_step(DELIVER, "deliver", Q),
        one_step(COMPLETE, "complete", Q, uri="A1", outcome="succeeded"),
        one_step(INGEST, "ingest", Q, uri="A2"),
    )
    # A2 admitted at once (its delivery crashes after publishing the build), or a second
    # later (its delivery fails during an outage, its duplicate is delivered after).
    early = run_actions(setup, (*start, crash_action(Q, "after_publish_build")))
    late = run_actions(
        setup,
        (
            *start,
            failed_delivery(OUTAGE, Q),
            one_step(ADVANCE, "advance_ms", Q, amount=1000),
            one_step(REDELIVER, "redeliver", Q, uri="A2"),
            one_step(DELIVER, "deliver", Q),
        ),
    )
    assert observe(early) == observe(late)
    assert stored(early, "A2").admitted_at_ms != stored(late, "A2").admitted_at_ms
    # the redelivery of A2 stalls after its announce: in hand, A2 as it was loaded
    stall = one_step(STALL, "stall", Q, value="after_announce")
    early, late = run_actions(setup, (stall,), early), run_actions(setup, (stall,), late)
    assert early.in_hand and late.in_hand
    assert observe(early) == observe(late)
    rest = (
        one_step(RESUME, "resume", Q, uri="A2"),
        one_step(COMPLETE, "complete", Q, uri="A2", outcome="succeeded"),
    )
    early, late = run_actions(setup, rest, early), run_actions(setup, rest, late)
    assert not early.in_hand
    assert observe(early) == observe(late)
    assert Explorer(setup).tuning.share_outcomes


def stored(world: World, uri: str) -> Request:
    (request,) = (r for r in world.requests.snapshot() if r.uri == uri)
    return request


def run_actions(setup: Setup, actions: tuple[Action, ...], world: World | None = None) -> World:
    world = world.clone() if world is not None else setup.new_world()
    for action in actions:
        assert perform(world, action, in_place=True) is not None, action.describe()
    return world


def test_max_states_stops_the_search_as_incomplete(machines: ProcessMachines) -> None:
    result = Explorer(setup_for(machines), Tuning(max_states=40)).run()
    assert not result.complete
    assert result.counterexample is None
    assert result.states == 40
    assert not result.ok


def test_progress_lines_report_the_search(
    machines: ProcessMachines, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(explorer_module, "PROGRESS_EVERY_S", 0.0)  # a line per expansion
    lines: list[str] = []
    explorer = Explorer(setup_for(machines, heads=1), progress=lines.append)
    assert explorer.run().ok
    assert len(lines) > 10
    shape = re.compile(
        r"check max_concurrent=1: (\d+) states, (\d+) transitions, depth \d+, "
        r"frontier \d+, [\d.]+ s, \d+ states/s"
    )
    matches = [shape.fullmatch(line) for line in lines]
    assert all(matches), lines
    counts = [(int(m[1]), int(m[2])) for m in matches if m]
    assert counts == sorted(counts), "states and transitions only grow"
    assert counts[-1][0] > counts[0][0]


def test_fair_continuation_finishes_with_holders_but_not_with_a_bare_counter(
    machines: ProcessMachines,
) -> None:
    for variant, finishes in ((Variant(), True), (Variant(bare_counter=True), False)):
        setup = setup_for(machines, variant=variant)
        world = setup.new_world()
        world.ingest(Q, "A1")
        world.armed_crash = "after_claim_slot"
        assert world.deliver_next().outcome == "crashed"
        assert can_finish(world, setup.rules(), Q) is finishes


def test_a_delivery_that_exhausts_max_attempts_is_dead_lettered_and_failed_closed(
    machines: ProcessMachines,
) -> None:
    explorer = Explorer(setup_for(machines, heads=2, rewrite=False))
    assert explorer.run().ok
    assert explorer.setup.knobs()["max_attempts"] == 2
    dead = [sid for sid, o in enumerate(explorer.observations) if o.dead_lettered]
    assert dead, "no explored path exhausts max_attempts"
    for sid in dead:
        observation = explorer.observations[sid]
        for request_id in observation.dead_lettered:
            assert observation.by_id[request_id].state == "failed"
            assert not any(row.holds(request_id) for row in observation.queues)
    traces = [[a.kind for a in explorer.trace(sid)] for sid in dead]
    # the outage goes on over the head's next delivery, after the clock reached it
    assert all(t[t.index("outage") :].count("outage_persists") == 1 for t in traces)
    # the head that exhausted its attempts held a slot (crash after claiming it), and
    # failing it closed freed that slot
    holding = [
        explorer.trace(sid)
        for sid in dead
        if any(a.describe().startswith("crash after_claim_slot") for a in explorer.trace(sid))
    ]
    assert holding, "no explored dead letter of a slot holder"


def test_no_outage_no_dead_letter_and_a_larger_budget_takes_longer(
    machines: ProcessMachines,
) -> None:
    quiet = Explorer(setup_for(machines, heads=2, rewrite=False, max_outages=0))
    assert quiet.run().ok
    assert not any(o.dead_lettered for o in quiet.observations)
    patient = Explorer(setup_for(machines, heads=2, rewrite=False, max_attempts=3))
    assert patient.run().ok
    dead = [sid for sid, o in enumerate(patient.observations) if o.dead_lettered]
    assert dead
    assert min([a.kind for a in patient.trace(sid)].count("outage_persists") for sid in dead) == 2

"""The newest green ancestor as an admission's base.

A queue keeps its recent greens (``recent_greens`` of them, newest first); an
admission builds incremental on the newest that is an ancestor of its head, asking
source control newest first and stopping at the first ancestor. Covered here: the row's
list (order, bound, idempotence, last green first), the search (how many questions,
unknown commits, why full), the decision on the simulated world with its trail, and a
replay of a generated trunk with force-pushes.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from stovepipe_fsm.adapters.memory import MemorySourceControl
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.domain.entities import FULL, INCREMENTAL_SINCE_GREEN, Green, Queue
from stovepipe_fsm.domain.ids import compare_request_id
from stovepipe_fsm.domain.trail_record import ADMITTED
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.process.greens import (
    ANCESTRY_UNKNOWN,
    COLD_START,
    NO_GREEN_ANCESTOR,
    newest_green_ancestor,
)
from stovepipe_fsm.simulation.broker import run_sync
from stovepipe_fsm.simulation.world import World
from stovepipe_fsm.views.explain import sentence

ROOT = Path(__file__).resolve().parent.parent
MACHINES = load_process_machines(ROOT / "machines")
Q = "monorepo/main"


def rid(n: int) -> str:
    return f"request/{Q}/{n}"


def newer(a: str, b: str) -> bool:
    return compare_request_id(Q, a, b) > 0


def green(n: int, uri: str | None = None) -> Green:
    return Green(uri or f"c{n}", rid(n), n * 10)


# --- the row's list -----------------------------------------------------------------


def test_greens_are_kept_newest_first_within_the_bound_last_green_first() -> None:
    row = Queue(Q)
    for n in (1, 2, 3, 4):
        row = row.with_green(green(n), 3, newer=newer)
    assert row.greens == (green(4), green(3), green(2))
    assert (row.last_green_uri, row.last_green_request_id) == ("c4", rid(4))


def test_a_late_older_green_joins_the_list_without_moving_last_green() -> None:
    row = Queue(Q).with_green(green(5), 4, newer=newer).with_green(green(2), 4, newer=newer)
    late = row.with_green(green(3), 4, newer=newer)
    assert late.greens == (green(5), green(3), green(2))
    assert late.last_green_request_id == rid(5)
    # Beyond the bound an older green is not kept at all: the row does not change.
    full = Queue(Q).with_green(green(5), 1, newer=newer)
    assert full.with_green(green(3), 1, newer=newer) is full


def test_recording_a_green_again_changes_nothing_and_a_commit_is_listed_once() -> None:
    row = Queue(Q).with_green(green(1), 8, newer=newer).with_green(green(2), 8, newer=newer)
    assert row.with_green(green(2), 8, newer=newer) is row
    retried = row.with_green(green(3, "c1"), 8, newer=newer)  # a retry of c1, green again
    assert retried.greens == (green(3, "c1"), green(2))
    assert retried.with_green(green(1), 8, newer=newer) is retried


def test_a_row_without_the_list_reads_its_last_green_alone() -> None:
    old = Queue(Q, last_green_uri="c7", last_green_request_id=rid(7))
    assert old.greens == (Green("c7", rid(7)),)
    assert Queue(Q).greens == ()
    # A list that does not start with last green (last green set alone) is not trusted.
    stale = Queue(Q, last_green_uri="c9", last_green_request_id=rid(9), recent_greens=(green(7),))
    assert stale.greens == (Green("c9", rid(9)),)
    grown = old.with_green(green(8), 8, newer=newer)
    assert grown.greens == (green(8), Green("c7", rid(7)))


def test_without_a_bound_the_row_keeps_as_many_as_it_has() -> None:
    row = Queue(Q).with_green(green(1), 3, newer=newer).with_green(green(2), 3, newer=newer)
    assert row.with_green(green(3), None, newer=newer).greens == (green(3), green(2))
    alone = row.with_green(green(3), 1, newer=newer)
    # Keeping one green the row has no list: it reads (and is stored) as rows did before.
    assert alone.recent_greens == () and alone.greens == (Green("c3", rid(3)),)


# --- the search ---------------------------------------------------------------------


def trunk_with_rewrite() -> MemorySourceControl:
    """c1 - c2 - c3 - c4, and r5 force-pushed on top of c2."""
    return MemorySourceControl({"c1": [], "c2": ["c1"], "c3": ["c2"], "c4": ["c3"], "r5": ["c2"]})


async def test_the_search_stops_at_the_first_ancestor_newest_first() -> None:
    graph = trunk_with_rewrite()
    greens = (green(4), green(3), green(2), green(1))
    choice = await newest_green_ancestor(graph, greens, "r5")
    assert choice.green == green(2)
    assert choice.passed == (green(4), green(3)) and choice.asked == 3
    assert graph.calls == 3  # c1 was never asked about
    assert not choice.descends_from_last_green and choice.full_cause == ""
    fast_forward = await newest_green_ancestor(graph, greens, "c4")
    assert fast_forward.green == green(4) and fast_forward.asked == 1
    assert fast_forward.descends_from_last_green


async def test_why_there_is_no_base() -> None:
    graph = trunk_with_rewrite()
    graph.add_commit("x1")
    assert (await newest_green_ancestor(graph, (), "c4")).full_cause == COLD_START
    none = await newest_green_ancestor(graph, (green(4), green(3)), "x1")
    assert none.green is None and none.full_cause == NO_GREEN_ANCESTOR and none.asked == 2
    unknown = await newest_green_ancestor(graph, (green(4),), "nowhere")
    assert unknown.full_cause == ANCESTRY_UNKNOWN


async def test_a_green_source_control_does_not_know_is_passed_over() -> None:
    graph = trunk_with_rewrite()
    greens = (Green("gone", rid(9)), green(2))
    choice = await newest_green_ancestor(graph, greens, "r5")
    assert choice.green == green(2) and choice.unknown == (Green("gone", rid(9)),)
    assert not choice.descends_from_last_green


# --- the decision, on the simulated world -------------------------------------------


def world(history: dict[str, list[str]], **config: object) -> World:
    store = StaticConfigStore({"defaults": dict(config)}, parameters=MACHINES.parameters)
    return World(MACHINES, store, history)


def admit(w: World, uri: str, outcome: str | None = "succeeded") -> str:
    request_id = w.ingest(Q, uri).request_id
    while w.deliver_next() is not None:
        pass
    if outcome is not None:
        w.complete(request_id, outcome)
    return request_id


def request(w: World, request_id: str):  # type: ignore[no-untyped-def]
    return run_sync(w.requests.get(request_id))


HISTORY = {"A": [], "B": ["A"], "C": ["B"], "R": ["B"]}


@pytest.mark.parametrize("recent_greens", [8, 1])
def test_a_force_push_onto_an_older_green_builds_incremental_on_it(recent_greens: int) -> None:
    w = world(HISTORY, recent_greens=recent_greens)
    a, b, c = (admit(w, uri) for uri in "ABC")
    r = admit(w, "R", outcome=None)
    row = run_sync(w.queues.get(Q))
    assert row.last_green_uri == "C"
    admitted = request(w, r)
    history = run_sync(w.trail.history(r)) if w.trail else []
    note = next(rec for rec in history if rec.kind == ADMITTED)
    if recent_greens == 1:  # last green alone: what the gate did before it kept more
        assert row.greens == (Green("C", c, row.greens[0].at_ms),)
        assert (admitted.build_strategy, admitted.base_uri) == (FULL, "")
        assert note.details["full_cause"] == NO_GREEN_ANCESTOR
        assert note.details["newer_greens_not_ancestors"] == "1"
        return
    assert [g.request_id for g in row.greens] == [c, b, a]
    assert (admitted.build_strategy, admitted.base_uri) == (INCREMENTAL_SINCE_GREEN, "B")
    assert note.details["base_request"] == b
    assert note.details["newer_greens_not_ancestors"] == "1"
    assert note.details["ancestry_queries"] == "2"
    assert "full_cause" not in note.details
    assert sentence(note).endswith(f"; green of {b} (1 newer green(s) not ancestors)")
    # R still does not descend from last green: it runs alone.
    assert row.serial_holder == r


def test_a_path_rule_forces_full_from_the_chosen_green() -> None:
    history = {"A": [], "B": ["A"], "C": ["B"], "R": ["B"]}
    changes = {"C": ["WORKSPACE"], "R": ["src/x.c"]}
    store = StaticConfigStore(
        {"defaults": {"full_build_paths": ["WORKSPACE"]}}, parameters=MACHINES.parameters
    )
    w = World(MACHINES, store, history, changes=changes)
    for uri in "ABC":
        admit(w, uri)
    # The diff from B (the green R builds on) does not touch WORKSPACE: incremental.
    r = request(w, admit(w, "R", outcome=None))
    assert (r.build_strategy, r.base_uri) == (INCREMENTAL_SINCE_GREEN, "B")
    w.graph.add_commit("S", ["B"])
    w.graph.set_changes("S", ["WORKSPACE"])
    w.complete(r.id, "failed")
    s = admit(w, "S", outcome=None)
    assert request(w, s).build_strategy == FULL
    note = next(x for x in run_sync(w.trail.history(s)) if x.kind == ADMITTED)  # type: ignore[union-attr]
    assert note.details["full_cause"] == "path rule"


def test_a_red_head_is_never_a_base() -> None:
    w = world({"A": [], "B": ["A"], "R": ["B"]})
    a = admit(w, "A")
    admit(w, "B", outcome="failed")
    r = request(w, admit(w, "R", outcome=None))
    assert (r.build_strategy, r.base_uri) == (INCREMENTAL_SINCE_GREEN, "A")
    assert [g.request_id for g in run_sync(w.queues.get(Q)).greens] == [a]


# --- a generated trunk with force-pushes --------------------------------------------


def generated_trunk(heads: int, seed: int) -> list[tuple[str, list[str], bool]]:
    """(commit, parents, green) for ``heads`` commits; now and then a force-push drops
    the last one to four commits of the ref, and about one build in six is red."""
    rng = random.Random(seed)
    tip: list[str] = []
    trunk = []
    for i in range(1, heads + 1):
        if len(tip) > 5 and rng.random() < 0.15:
            tip = tip[: -rng.randint(1, 4)]
        uri = f"c{i}"
        trunk.append((uri, [tip[-1]] if tip else [], rng.random() > 1 / 6))
        tip.append(uri)
    return trunk


def replay(trunk: list[tuple[str, list[str], bool]], recent_greens: int) -> list[object]:
    """Each admission as (commit, strategy, base), every head built and reported before
    the next arrives; each base checked against a search of our own."""
    history = {uri: parents for uri, parents, _ in trunk}
    w = world(history, recent_greens=recent_greens)
    graph = MemorySourceControl(history)
    greens: list[str] = []  # newest first
    seen = []
    for uri, _, is_green in trunk:
        r = request(w, admit(w, uri, outcome="succeeded" if is_green else "failed"))
        expected = next(
            (g for g in greens[:recent_greens] if run_sync(graph.is_ancestor(g, uri))), ""
        )
        assert r.base_uri == expected, (uri, greens[:recent_greens])
        assert r.build_strategy == (INCREMENTAL_SINCE_GREEN if expected else FULL)
        if is_green:
            greens.insert(0, uri)
        seen.append((uri, r.build_strategy, r.base_uri))
    return seen


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_generated_trunk_with_force_pushes_builds_on_the_newest_green_ancestor(
    seed: int,
) -> None:
    trunk = generated_trunk(80, seed)
    kept = replay(trunk, 8)
    alone = replay(trunk, 1)
    full_kept = [uri for uri, strategy, _ in kept if strategy == FULL]
    full_alone = [uri for uri, strategy, _ in alone if strategy == FULL]
    assert set(full_kept) < set(full_alone)
    # Every head built in full with last green alone and incremental now (a head pushed
    # over last green) builds on an older green.
    recovered = {uri: base for uri, strategy, base in kept if strategy != FULL}
    assert all(recovered.get(uri) for uri in set(full_alone) - set(full_kept))

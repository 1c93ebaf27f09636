"""The checker's invariants on hand-built observations: each one fires on the state it
forbids and stays quiet on its legal neighbour, so a green ``check`` means something.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from stovepipe_fsm.apps.check.invariants import (
    STATE_INVARIANTS,
    Rules,
    check_edge,
    check_state,
    quiescent,
)
from stovepipe_fsm.apps.check.observe import Observation, Pending
from stovepipe_fsm.domain.entities import Queue, Request
from stovepipe_fsm.process.catalog import load_process_machines

ROOT = Path(__file__).resolve().parent.parent
Q = "monorepo/main"
HISTORY = {"A1": [], "A2": ["A1"], "A3": ["A2"], "R": ["A1"]}


def rid(n: int) -> str:
    return f"request/{Q}/{n}"


@pytest.fixture(scope="module")
def rules() -> Rules:
    machines = load_process_machines(ROOT / "machines")
    return Rules.for_machines(machines, max_concurrent=1, history=HISTORY)


def req(n: int, uri: str, state: str = "accepted", strategy: str = "", base: str = "") -> Request:
    return Request(rid(n), Q, uri, state=state, build_strategy=strategy, base_uri=base)


def obs(
    *requests: Request,
    holders: tuple[str, ...] = (),
    latest: str = "",
    green: str = "",
    pending: tuple[str, ...] = (),
    builds: tuple[str, ...] = (),
    hooks: tuple[tuple[str, str], ...] = (),
    dead_lettered: tuple[str, ...] = (),
) -> Observation:
    green_uri = next((r.uri for r in requests if r.id == green), "")
    queue = Queue(
        Q,
        last_green_uri=green_uri,
        last_green_request_id=green,
        latest_request_id=latest or (requests[-1].id if requests else ""),
        slot_holders=holders,
        version=0,
    )
    return Observation(
        requests=tuple(requests),
        queues=(queue,),
        pending=tuple(Pending(Q, r, 0) for r in pending),
        builds=frozenset(builds),
        hooks=frozenset(hooks),
        dead_lettered=frozenset(dead_lettered),
        source_control_up=True,
        armed_crash="",
    )


def broken(observation: Observation, rules: Rules) -> str:
    violation = check_state(observation, rules)
    return violation.invariant if violation else ""


def admitted(n: int, uri: str, state: str = "processing") -> Request:
    return req(n, uri, state, "full")


def test_a_healthy_admission_breaks_nothing(rules: Rules) -> None:
    state = obs(admitted(1, "A1"), holders=(rid(1),), builds=(rid(1),), hooks=((rid(1), "e"),))
    assert check_state(state, rules) is None


def test_processing_without_a_slot(rules: Rules) -> None:
    assert broken(obs(admitted(1, "A1")), rules) == "slot_state_holds_slot"


def test_accepted_holder_needs_its_message_pending(rules: Rules) -> None:
    mid_admit = obs(req(1, "A1"), holders=(rid(1),), pending=(rid(1),))
    assert check_state(mid_admit, rules) is None
    lost = obs(req(1, "A1"), holders=(rid(1),))
    assert broken(lost, rules) == "holder_is_admitting"


def test_terminal_holder_is_a_leak(rules: Rules) -> None:
    state = obs(admitted(1, "A1", "succeeded"), req(2, "A2"), holders=(rid(1),), pending=(rid(2),))
    assert broken(state, rules) == "holder_is_admitting"


def test_holder_without_a_request_row(rules: Rules) -> None:
    unknown = obs(admitted(1, "A1"), holders=(rid(1), rid(9)), builds=(rid(1),))
    assert broken(unknown, rules) == "holder_is_admitting"


def test_idle_queue_holders_are_exactly_the_processing_requests(rules: Rules) -> None:
    # Earlier invariants imply this one; checked on its own so it cannot rot unnoticed.
    (idle,) = [i for i in STATE_INVARIANTS if i.name == "idle_holders_exact"]
    exact = obs(admitted(1, "A1"), admitted(2, "A2", "failed"), holders=(rid(1),))
    assert list(idle.check(exact, rules)) == []
    extra = obs(req(1, "A1"), holders=(rid(1),))
    assert len(list(idle.check(extra, rules))) == 1
    missing = obs(admitted(1, "A1"))
    assert len(list(idle.check(missing, rules))) == 1
    waiting = obs(req(1, "A1"), holders=(rid(1),), pending=(rid(1),))
    assert list(idle.check(waiting, rules)) == []


def test_more_holders_than_max_concurrent(rules: Rules) -> None:
    two = obs(admitted(1, "A1"), admitted(2, "A2"), holders=(rid(1), rid(2)))
    assert broken(two, rules) == "max_concurrent"
    assert check_state(two, replace(rules, max_concurrent=2)) is None


def test_newest_head_superseded(rules: Rules) -> None:
    state = obs(req(1, "A1", "superseded"), req(2, "A2", "superseded"))
    assert broken(state, rules) == "newest_not_superseded"
    older_only = obs(req(1, "A1", "superseded"), req(2, "A2"), pending=(rid(2),))
    assert check_state(older_only, rules) is None


def test_superseded_request_with_a_build(rules: Rules) -> None:
    state = obs(req(1, "A1", "superseded"), req(2, "A2"), pending=(rid(2),), builds=(rid(1),))
    assert broken(state, rules) == "superseded_never_started"


def test_build_before_the_admission_is_persisted(rules: Rules) -> None:
    state = obs(req(1, "A1"), holders=(rid(1),), pending=(rid(1),), builds=(rid(1),))
    assert broken(state, rules) == "persist_before_publish"
    hooked = obs(req(1, "A1"), holders=(rid(1),), pending=(rid(1),), hooks=((rid(1), "e"),))
    assert broken(hooked, rules) == "persist_before_publish"


def test_two_event_ids_for_one_admission(rules: Rules) -> None:
    state = obs(admitted(1, "A1"), holders=(rid(1),), hooks=((rid(1), "e1"), (rid(1), "e2")))
    assert broken(state, rules) == "one_event_per_admission"


def test_incremental_build_on_a_non_ancestor(rules: Rules) -> None:
    good = req(4, "R", "processing", "incremental_since_green", "A1")
    assert check_state(obs(good, holders=(rid(4),)), rules) is None
    bad = req(4, "R", "processing", "incremental_since_green", "A2")
    assert broken(obs(bad, holders=(rid(4),)), rules) == "strategy_sound"
    full_with_base = req(4, "R", "processing", "full", "A1")
    assert broken(obs(full_with_base, holders=(rid(4),)), rules) == "strategy_sound"


def test_strategy_changing_after_it_was_set(rules: Rules) -> None:
    before = obs(req(2, "A2", "processing", "incremental_since_green", "A1"), holders=(rid(2),))
    after = obs(req(2, "A2", "processing", "full"), holders=(rid(2),))
    violation = check_edge(before, after, rules)
    assert violation is not None and violation.invariant == "strategy_immutable"
    finished = obs(req(2, "A2", "succeeded", "incremental_since_green", "A1"))
    assert check_edge(before, finished, rules) is None


def test_last_green_moving_back(rules: Rules) -> None:
    a1, a2 = admitted(1, "A1", "succeeded"), admitted(2, "A2", "succeeded")
    ahead = obs(a1, a2, green=rid(2))
    behind = obs(a1, a2, green=rid(1))
    violation = check_edge(ahead, behind, rules)
    assert violation is not None and violation.invariant == "last_green_forward"
    assert check_edge(behind, ahead, rules) is None


def test_admitting_a_stale_head(rules: Rules) -> None:
    before = obs(req(1, "A1"), req(2, "A2"), pending=(rid(1), rid(2)))
    stale = obs(admitted(1, "A1"), req(2, "A2"), holders=(rid(1),), pending=(rid(2),))
    violation = check_edge(before, stale, rules)
    assert violation is not None and violation.invariant == "admits_latest"
    latest = obs(req(1, "A1", "superseded"), admitted(2, "A2"), holders=(rid(2),))
    assert check_edge(before, latest, rules) is None


def test_every_head_queue_may_admit_an_older_head_but_supersedes_none(rules: Rules) -> None:
    every = replace(rules, every_head=True)
    before = obs(req(1, "A1"), req(2, "A2"), pending=(rid(1), rid(2)))
    oldest_first = obs(admitted(1, "A1"), req(2, "A2"), holders=(rid(1),), pending=(rid(2),))
    assert check_edge(before, oldest_first, every) is None
    superseded = obs(req(1, "A1", "superseded"), req(2, "A2"), pending=(rid(2),))
    violation = check_edge(before, superseded, every)
    assert violation is not None and violation.invariant == "keeps_newest_n"
    assert check_edge(before, superseded, rules) is None


def test_keep_newest_sets_the_heads_kept_apart_from_the_slots(rules: Rules) -> None:
    before = obs(req(1, "A1"), req(2, "A2"), pending=(rid(1), rid(2)))
    superseded = obs(req(1, "A1", "superseded"), req(2, "A2"), pending=(rid(2),))
    keep_two = replace(rules, keep_newest=2)
    violation = check_edge(before, superseded, keep_two)
    assert violation is not None and violation.invariant == "keeps_newest_n"
    older = obs(admitted(1, "A1"), req(2, "A2"), holders=(rid(1),), pending=(rid(2),))
    assert check_edge(before, older, keep_two) is None
    assert keep_two.kept == 2 and keep_two.max_concurrent == 1


def test_rules_read_the_checked_queue_mode() -> None:
    machines = load_process_machines(ROOT / "machines")
    plain = Rules.for_machines(machines, max_concurrent=2, history=HISTORY)
    assert (plain.every_head, plain.kept) == (False, 2)
    chosen = {"every_head": True, "keep_newest": 3}
    moded = Rules.for_machines(machines, max_concurrent=2, history=HISTORY, parameters=chosen)
    assert (moded.every_head, moded.kept) == (True, 3)


def test_bare_counter_swaps_holder_identity_for_counting(rules: Rules) -> None:
    bare = replace(rules, bare_counter=True)
    anonymous = obs(admitted(1, "A1"), holders=("in_flight#1",), builds=(rid(1),))
    assert broken(anonymous, rules) == "slot_state_holds_slot"
    assert check_state(anonymous, bare) is None
    leaked = obs(admitted(1, "A1", "failed"), holders=("in_flight#1",))
    assert broken(leaked, bare) == "idle_counter_exact"


def test_bare_counter_below_the_processing_requests(rules: Rules) -> None:
    bare = replace(rules, bare_counter=True)
    uncounted = obs(admitted(1, "A1"), builds=(rid(1),))
    assert broken(uncounted, bare) == "counter_covers_processing"
    counted = obs(admitted(1, "A1"), holders=("in_flight#1",), builds=(rid(1),))
    assert check_state(counted, bare) is None


def test_a_dead_letter_is_failed_closed_and_frees_its_slot(rules: Rules) -> None:
    reconciled = obs(admitted(1, "A1", "failed"), builds=(rid(1),), dead_lettered=(rid(1),))
    assert check_state(reconciled, rules) is None
    # no request row at all (a message for a missing request): nothing to fail closed
    assert check_state(obs(dead_lettered=(rid(9),)), rules) is None
    left_running = obs(
        admitted(1, "A1"), holders=(rid(1),), builds=(rid(1),), dead_lettered=(rid(1),)
    )
    assert broken(left_running, rules) == "dead_letter_failed_closed"
    (rule,) = [i for i in STATE_INVARIANTS if i.name == "dead_letter_failed_closed"]
    # a terminal holder is also a leak of its own; this rule names the dead letter
    leaked = obs(admitted(1, "A1", "failed"), holders=(rid(1),), dead_lettered=(rid(1),))
    assert "still holds a slot" in " ".join(rule.check(leaked, rules))


def test_quiescent_means_no_message_and_nobody_accepted(rules: Rules) -> None:
    assert quiescent(obs(admitted(1, "A1"), holders=(rid(1),)), rules)
    assert not quiescent(obs(req(1, "A1")), rules)
    assert not quiescent(obs(admitted(1, "A1"), holders=(rid(1),), pending=(rid(1),)), rules)

"""Behaviour of the in-memory adapters beyond the shared port contracts.

These are the features simulation and model checking rely on: snapshots, independent
clones, injected failures, and recording exactly what a controller did.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stovepipe_fsm.adapters.memory import (
    ACKED,
    BUILD,
    HELD,
    HOOK,
    PROCESS,
    DeliveryAlreadyFinished,
    ManualClock,
    MemoryCounter,
    MemoryDelivery,
    MemoryPublisher,
    MemoryQueueStore,
    MemoryRequestStore,
    MemorySourceControl,
    MemorySourceControlProvider,
    MemoryUriIndex,
    SystemClock,
)
from stovepipe_fsm.domain.entities import Queue, Request, evolve
from stovepipe_fsm.domain.errors import AlreadyExists, NotFound, Retryable, VersionMismatch
from stovepipe_fsm.domain.hooks import started_event
from stovepipe_fsm.domain.ids import format_request_id
from stovepipe_fsm.domain.settle import SettleKind, Settlement

T = TypeVar("T")
QUEUE = "monorepo/main"


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that must finish without suspending (no real awaits inside)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("a memory adapter suspended on a real await")


def rid(n: int, queue: str = QUEUE) -> str:
    return format_request_id(queue, n)


# -- stores --------------------------------------------------------------------------


async def test_request_snapshot_is_sorted_by_key_and_hashable() -> None:
    store = MemoryRequestStore()
    for n in (3, 1, 2):
        await store.create(Request(id=rid(n), queue=QUEUE, uri=f"u{n}", state="accepted"))
    snapshot = store.snapshot()
    assert [r.id for r in snapshot] == sorted([rid(1), rid(2), rid(3)])
    assert hash(snapshot) == hash(store.snapshot())
    assert len(store) == 3
    assert rid(2) in store


async def test_snapshot_stays_in_key_order_whatever_order_keys_arrive_in() -> None:
    """Ids past 9 sort before 2 as text; a store built from rows, a create past the last
    key, one below it, an update and a fork all keep the snapshot in key order."""
    ids = [rid(n) for n in (2, 10, 1, 11, 3)]
    store = MemoryRequestStore([Request(id=ids[0], queue=QUEUE, uri="u", state="accepted")])
    for request_id in ids[1:]:
        await store.create(Request(id=request_id, queue=QUEUE, uri="u", state="accepted"))
        assert [r.id for r in store.snapshot()] == sorted(r.id for r in store.snapshot())
    built = MemoryRequestStore(reversed(store.snapshot()))
    assert built.snapshot() == store.snapshot()
    first = store.snapshot()[0]
    await store.update(evolve(first, state="processing"), first.version, first.version + 1)
    fork = store.clone()
    await fork.create(Request(id=rid(12), queue=QUEUE, uri="u", state="accepted"))
    for each in (store, fork):
        assert [r.id for r in each.snapshot()] == sorted(r.id for r in each.snapshot())
    assert [r.id for r in fork.snapshot()] == sorted([*ids, rid(12)])
    assert store.snapshot()[0].state == "processing"


async def test_request_store_clone_is_independent_both_ways() -> None:
    original = MemoryRequestStore([Request(id=rid(1), queue=QUEUE, uri="u1", state="accepted")])
    fork = original.clone()
    await fork.update(Request(id=rid(1), queue=QUEUE, uri="u1", state="processing"), 1, 2)
    await fork.create(Request(id=rid(2), queue=QUEUE, uri="u2", state="accepted"))
    await original.create(Request(id=rid(3), queue=QUEUE, uri="u3", state="accepted"))
    assert [(r.id, r.state, r.version) for r in original.snapshot()] == [
        (rid(1), "accepted", 1),
        (rid(3), "accepted", 1),
    ]
    assert [(r.id, r.state, r.version) for r in fork.snapshot()] == [
        (rid(1), "processing", 2),
        (rid(2), "accepted", 1),
    ]


async def test_store_rejects_values_of_the_wrong_type() -> None:
    with pytest.raises(TypeError, match="stores Request values"):
        await MemoryRequestStore().create({"id": rid(1)})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="stores Queue values"):
        await MemoryQueueStore().create(Request(id=rid(1), queue=QUEUE, uri="u", state="accepted"))  # type: ignore[arg-type]


async def test_queue_store_never_keeps_a_callers_list() -> None:
    holders = [rid(1)]
    store = MemoryQueueStore()
    await store.create(Queue(name=QUEUE, slot_holders=holders))  # type: ignore[arg-type]
    holders.append(rid(2))
    stored = await store.get(QUEUE)
    assert stored.slot_holders == (rid(1),)
    assert type(stored.slot_holders) is tuple


async def test_queue_store_clone_and_snapshot() -> None:
    store = MemoryQueueStore([Queue(name="b"), Queue(name="a")])
    fork = store.clone()
    row = await fork.get("a")
    await fork.update(row.with_holder(rid(1, "a")), 1, 2)
    assert [q.name for q in store.snapshot()] == ["a", "b"]
    assert (await store.get("a")).slot_holders == ()
    assert (await fork.get("a")).slot_holders == (rid(1, "a"),)


async def test_uri_index_snapshot_and_clone() -> None:
    index = MemoryUriIndex()
    await index.put_if_absent("q2", "u", rid(1, "q2"))
    await index.put_if_absent("q1", "u", rid(1, "q1"))
    fork = index.clone()
    assert await fork.put_if_absent("q1", "v", rid(2, "q1")) == rid(2, "q1")
    assert index.snapshot() == ((("q1", "u"), rid(1, "q1")), (("q2", "u"), rid(1, "q2")))
    assert await index.get("q1", "v") is None
    assert len(fork) == 3


async def test_counter_clone_continues_each_sequence_independently() -> None:
    counter = MemoryCounter()
    for _ in range(3):
        await counter.next("a")
    await counter.next("b")
    fork = counter.clone()
    assert await fork.next("a") == 4
    assert await fork.next("a") == 5
    assert await counter.next("a") == 4
    assert counter.peek("a") == 4
    assert counter.peek("never") == 0
    assert counter.snapshot() == (("a", 4), ("b", 1))
    assert fork.snapshot() == (("a", 5), ("b", 1))


def test_store_operations_complete_without_suspending() -> None:
    store = MemoryRequestStore()
    run_now(store.create(Request(id=rid(1), queue=QUEUE, uri="u", state="accepted")))
    assert run_now(store.get(rid(1))).uri == "u"
    assert run_now(MemoryCounter().next(QUEUE)) == 1
    assert run_now(MemoryUriIndex().put_if_absent(QUEUE, "u", rid(1))) == rid(1)


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["create", "update", "get"]),
        st.integers(min_value=1, max_value=3),  # request counter
        st.integers(min_value=0, max_value=4),  # old version guess
        st.sampled_from(["accepted", "processing", "superseded"]),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(_OPS)
def test_request_store_matches_a_reference_model(ops: list[tuple[str, int, int, str]]) -> None:
    """Any sequence of operations leaves the store exactly where a plain dict model says."""
    store = MemoryRequestStore()
    model: dict[str, Request] = {}
    for op, n, old, state in ops:
        key = rid(n)
        entity = Request(id=key, queue=QUEUE, uri=f"u{n}", state=state, version=old)
        if op == "create":
            if key in model:
                with pytest.raises(AlreadyExists):
                    run_now(store.create(entity))
            else:
                run_now(store.create(entity))
                model[key] = entity
        elif op == "update":
            if key not in model:
                with pytest.raises(NotFound):
                    run_now(store.update(entity, old, old + 1))
            elif model[key].version != old:
                with pytest.raises(VersionMismatch):
                    run_now(store.update(entity, old, old + 1))
            else:
                run_now(store.update(entity, old, old + 1))
                model[key] = dataclasses.replace(entity, version=old + 1)
        elif key in model:
            assert run_now(store.get(key)) == model[key]
        else:
            with pytest.raises(NotFound):
                run_now(store.get(key))
    assert store.snapshot() == tuple(model[k] for k in sorted(model))


# -- source control ------------------------------------------------------------------


async def test_source_control_unavailable_raises_retryable_until_restored() -> None:
    sc = MemorySourceControl({"a": [], "b": ["a"]})
    sc.set_available(False)
    assert sc.available is False
    for args in (("a", "b"), ("a", "missing")):
        with pytest.raises(Retryable, match="source control unavailable"):
            await sc.is_ancestor(*args)
    sc.available = True
    assert await sc.is_ancestor("a", "b") is True
    assert sc.calls == 3


async def test_add_commit_fast_forward_and_force_push() -> None:
    sc = MemorySourceControl({"green": []})
    sc.add_commit("next", ["green"])
    sc.add_commit("rewritten", [])
    assert await sc.is_ancestor("green", "next") is True
    assert await sc.is_ancestor("green", "rewritten") is False
    with pytest.raises(NotFound):
        await sc.is_ancestor("green", "not-yet")
    sc.add_commit("not-yet", ["next"])
    assert await sc.is_ancestor("green", "not-yet") is True
    assert sc.commits() == ("green", "next", "not-yet", "rewritten")
    assert sc.parents_of("not-yet") == ("next",)


def test_commits_are_immutable_and_parents_must_exist() -> None:
    sc = MemorySourceControl({"a": []})
    sc.add_commit("b", ["a"])
    sc.add_commit("b", ["a"])  # same commit again: no-op
    assert sc.parents_of("b") == ("a",)
    with pytest.raises(ValueError, match="commits are immutable"):
        sc.add_commit("b", [])
    with pytest.raises(ValueError, match="unknown parents"):
        sc.add_commit("c", ["nope"])
    with pytest.raises(TypeError, match="not a string"):
        sc.add_commit("d", "a")
    with pytest.raises(NotFound):
        sc.parents_of("nope")


def test_graph_may_be_given_in_any_order_but_must_be_closed_and_acyclic() -> None:
    sc = MemorySourceControl({"c": ["b"], "b": ["a"], "a": []})
    assert sc.commits() == ("a", "b", "c")
    with pytest.raises(ValueError, match=r"unknown parents \['ghost'\]"):
        MemorySourceControl({"a": ["ghost"]})
    with pytest.raises(ValueError, match="cycle"):
        MemorySourceControl({"a": ["b"], "b": ["a"]})


async def test_source_control_clone_forks_graph_and_availability() -> None:
    sc = MemorySourceControl({"a": []})
    fork = sc.clone()
    fork.add_commit("b", ["a"])
    fork.set_available(False)
    assert sc.available is True
    with pytest.raises(NotFound):
        await sc.is_ancestor("a", "b")
    with pytest.raises(Retryable):
        await fork.is_ancestor("a", "a")


async def test_provider_mapping_default_and_clone() -> None:
    shared = MemorySourceControl({"a": []})
    special = MemorySourceControl({"s": []})
    provider = MemorySourceControlProvider({"q/special": special}, default=shared)
    assert provider.for_queue("q/special") is special
    assert provider.for_queue("q/any") is shared
    assert MemorySourceControlProvider({"q": special}).for_queue("other") is None
    provider.register("q/late", special)
    assert provider.for_queue("q/late") is special

    fork = provider.clone()
    forked_special = fork.for_queue("q/special")
    assert isinstance(forked_special, MemorySourceControl)
    assert forked_special is not special
    assert fork.for_queue("q/late") is forked_special  # shared members stay shared
    assert fork.for_queue("q/any") is not shared
    forked_special.set_available(False)
    assert await special.is_ancestor("s", "s") is True


# -- publisher -----------------------------------------------------------------------


async def test_publisher_records_everything_in_order_with_dedup_ids() -> None:
    publisher = MemoryPublisher()
    event = started_event(QUEUE, rid(1), admitted_version=2, now_ms=1234)
    await publisher.publish_hook(event)
    await publisher.publish_build(QUEUE, rid(1))
    await publisher.publish_build(QUEUE, rid(1))  # a redelivery re-publishes
    await publisher.publish_process(QUEUE, rid(2))
    assert [(r.kind, r.request_id, r.dedup_id) for r in publisher.records] == [
        (HOOK, rid(1), event.id),
        (BUILD, rid(1), rid(1)),
        (BUILD, rid(1), rid(1)),
        (PROCESS, rid(2), rid(2)),
    ]
    assert len(publisher.builds()) == 2
    assert len(publisher.unique(BUILD)) == 1
    assert publisher.processes()[0].queue == QUEUE
    hook = publisher.hooks()[0]
    assert hook.queue == QUEUE
    assert hook.event() == event
    with pytest.raises(ValueError, match="no hook event"):
        publisher.builds()[0].event()


async def test_publisher_keeps_no_reference_to_a_hook_payload() -> None:
    publisher = MemoryPublisher()
    event = started_event(QUEUE, rid(1), admitted_version=2, now_ms=0)
    await publisher.publish_hook(event)
    event.payload["request_id"] = "tampered"
    assert publisher.hooks()[0].request_id == rid(1)
    assert publisher.hooks()[0].event().payload["request_id"] == rid(1)


async def test_injected_failure_hits_only_the_next_publish_of_its_kind() -> None:
    publisher = MemoryPublisher()
    publisher.fail_next(BUILD)
    await publisher.publish_process(QUEUE, rid(1))
    with pytest.raises(Retryable, match="injected build publish failure"):
        await publisher.publish_build(QUEUE, rid(1))
    assert publisher.builds() == ()
    await publisher.publish_build(QUEUE, rid(1))
    assert [r.kind for r in publisher.records] == [PROCESS, BUILD]

    publisher.fail_next(HOOK, times=2)
    assert publisher.pending_failures(HOOK) == 2
    event = started_event(QUEUE, rid(1), admitted_version=2, now_ms=0)
    for _ in range(2):
        with pytest.raises(Retryable):
            await publisher.publish_hook(event)
    await publisher.publish_hook(event)
    assert len(publisher.hooks()) == 1


def test_fail_next_validates_its_arguments() -> None:
    publisher = MemoryPublisher()
    with pytest.raises(ValueError, match="unknown publish kind"):
        publisher.fail_next("email")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="times must be"):
        publisher.fail_next(BUILD, times=0)


async def test_publisher_clone_forks_records_and_failures() -> None:
    publisher = MemoryPublisher()
    await publisher.publish_build(QUEUE, rid(1))
    publisher.fail_next(BUILD)
    fork = publisher.clone()
    with pytest.raises(Retryable):
        await fork.publish_build(QUEUE, rid(2))
    await fork.publish_build(QUEUE, rid(3))
    assert [r.request_id for r in fork.builds()] == [rid(1), rid(3)]
    assert [r.request_id for r in publisher.builds()] == [rid(1)]
    assert publisher.pending_failures(BUILD) == 1
    publisher.clear()
    assert publisher.records == ()
    assert len(fork.records) == 2


# -- clocks --------------------------------------------------------------------------


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(1_000)
    assert clock.now_ms() == 1_000
    assert clock.advance(250) == 1_250
    assert clock.now_ms() == 1_250
    clock.set(10)
    assert clock.now_ms() == 10
    with pytest.raises(ValueError, match="negative"):
        clock.advance(-1)
    fork = clock.clone()
    fork.advance(5)
    assert (clock.now_ms(), fork.now_ms()) == (10, 15)


def test_system_clock_is_integer_wall_clock_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    now = SystemClock().now_ms()
    after = time.time_ns() // 1_000_000
    assert isinstance(now, int)
    assert before <= now <= after


# -- delivery ------------------------------------------------------------------------


def ack() -> Settlement:
    return Settlement(SettleKind.ACK, 0)


def hold(delay_ms: int) -> Settlement:
    return Settlement(SettleKind.HOLD, 0, delay_ms / 1000)


async def test_delivery_ack() -> None:
    delivery = MemoryDelivery(QUEUE, rid(1))
    assert (delivery.queue, delivery.request_id, delivery.outcome) == (QUEUE, rid(1), None)
    await delivery.in_progress()
    await delivery.in_progress()
    delivery.perform(ack())
    assert (delivery.outcome, delivery.delay_ms, delivery.finished) == (ACKED, None, True)
    assert delivery.in_progress_calls == 2


async def test_delivery_hold_records_delay() -> None:
    delivery = MemoryDelivery(QUEUE, rid(1))
    delivery.perform(hold(5_000))
    assert (delivery.outcome, delivery.delay_ms) == (HELD, 5_000)
    assert "held" in repr(delivery)


@pytest.mark.parametrize("first", ["ack", "hold"])
@pytest.mark.parametrize("second", ["ack", "hold", "in_progress"])
async def test_delivery_cannot_be_finished_twice(first: str, second: str) -> None:
    delivery = MemoryDelivery(QUEUE, rid(1))
    delivery.perform(ack() if first == "ack" else hold(100))
    outcome = delivery.outcome
    with pytest.raises(DeliveryAlreadyFinished, match=rid(1)):
        if second == "ack":
            delivery.perform(ack())
        elif second == "hold":
            delivery.perform(hold(7))
        else:
            await delivery.in_progress()
    assert delivery.outcome == outcome
    assert delivery.delay_ms == (None if first == "ack" else 100)


async def test_delivery_rejects_a_negative_hold() -> None:
    delivery = MemoryDelivery(QUEUE, rid(1))
    with pytest.raises(ValueError, match=">= 0"):
        delivery.perform(hold(-1))
    assert delivery.finished is False


async def test_delivery_performs_only_what_a_finished_flow_leads_to() -> None:
    delivery = MemoryDelivery(QUEUE, rid(1))
    with pytest.raises(ValueError, match="an ack or a hold"):
        delivery.perform(Settlement(SettleKind.RETRY, 1, 1.0, "down"))
    assert delivery.finished is False

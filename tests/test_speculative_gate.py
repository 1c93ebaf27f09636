"""The speculative rules and slot leases at the level of one delivery and one config.

Timelines (``tests/timelines/speculative_*``, ``baseline_lag_bound``, ``lease_expiry``)
show the rules end to end; these pin the details: which heads count as the newest N,
what a lease on the queue row looks like, the located config errors and the warning
for N > 1 without a repository.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
from memory_stages import memory_stages

from stovepipe_fsm.adapters.memory import MemoryDelivery
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.config.loader import check_queue_config
from stovepipe_fsm.domain.entities import Queue
from stovepipe_fsm.domain.hooks import VALIDATION_LEASE_EXPIRED, lease_expired_event_id
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.process.gate import baseline_lag

ROOT = Path(__file__).resolve().parent.parent
MACHINES = load_process_machines(ROOT / "machines")
Q = "monorepo/main"


def rid(n: int) -> str:
    return f"request/{Q}/{n}"


async def queue_with(config: dict, states: dict[int, str], latest: int = 0):  # type: ignore[no-untyped-def]
    """Stages over a queue with requests ``n`` in ``states``; the newest is stamped latest
    unless ``latest`` names another counter."""
    store = StaticConfigStore({"queues": {Q: config}}, parameters=MACHINES.parameters)
    stages = memory_stages(MACHINES, config=store)
    services = stages.services
    await services.queues.create(Queue(Q, latest_request_id=rid(latest or max(states))))
    for n, state in states.items():
        request = stages.lifecycle.new_request(rid(n), Q, f"c{n}")
        await services.requests.create(replace(request, state=state))
    return stages


@pytest.mark.parametrize(
    ("states", "outcome"),
    [
        # 1 waits; 2 and 3 are newer and live: 1 is third newest -> superseded
        ({1: "accepted", 2: "accepted", 3: "accepted"}, "acked"),
        # 2 went green: only 3 is newer and live -> 1 is among the newest 2, admitted
        ({1: "accepted", 2: "succeeded", 3: "accepted"}, "acked-admitted"),
        # the latest counts whatever its state: 2 and 3 ended, 3 is latest -> 1 kept
        ({1: "accepted", 2: "failed", 3: "succeeded"}, "acked-admitted"),
        # a counter spent on a lost ingest race (no request 2) is skipped
        ({1: "accepted", 3: "accepted"}, "acked-admitted"),
    ],
)
async def test_the_newest_two_are_counted_over_heads_not_yet_terminal(
    states: dict[int, str], outcome: str
) -> None:
    stages = await queue_with({"max_concurrent": 2}, states)
    handled = (await stages.controller.handle(MemoryDelivery(Q, rid(1)))).outcome
    request = await stages.services.requests.get(rid(1))
    if outcome == "acked":
        assert (handled, request.state) == ("acked", "superseded")
    else:
        assert (handled, request.state) == ("acked", "processing")


async def test_with_one_slot_any_newer_head_supersedes_without_reading_it() -> None:
    # Head 2 is stamped latest but has no row: with one slot it is never looked up.
    stages = await queue_with({"max_concurrent": 1}, {1: "accepted"}, latest=2)
    assert (await stages.controller.handle(MemoryDelivery(Q, rid(1)))).outcome == "acked"
    assert (await stages.services.requests.get(rid(1))).state == "superseded"


async def test_a_claim_under_max_validation_ms_writes_the_lease_with_the_slot() -> None:
    stages = await queue_with({"max_validation_ms": 60_000}, {1: "accepted"})
    stages.services.clock.advance(1_000)  # type: ignore[attr-defined]
    assert (await stages.controller.handle(MemoryDelivery(Q, rid(1)))).outcome == "acked"
    row = await stages.services.queues.get(Q)
    assert row.slot_holders == (rid(1),)
    assert row.leases == ((rid(1), 61_000),)
    assert row.expires_at(rid(1)) == 61_000 and not row.is_expired(rid(1), 60_999)


async def test_an_expired_holder_is_reclaimed_once_and_announced_with_a_stable_id() -> None:
    stages = await queue_with({"max_validation_ms": 5_000}, {1: "accepted", 2: "accepted"})
    services = stages.services
    stages.services.clock.advance(0)  # type: ignore[attr-defined]
    await stages.services.queues.update(
        replace(await stages.services.queues.get(Q), latest_request_id=rid(1)), 1, 2
    )
    admitted = await stages.controller.handle(MemoryDelivery(Q, rid(1)))
    assert admitted.outcome == "acked"
    await stages.services.queues.update(
        replace(await stages.services.queues.get(Q), latest_request_id=rid(2)), 3, 4
    )
    slot_taken = await stages.controller.handle(MemoryDelivery(Q, rid(2)))
    assert slot_taken.outcome == "held"
    services.clock.advance(5_000)  # type: ignore[attr-defined]
    assert (await stages.controller.handle(MemoryDelivery(Q, rid(2)))).outcome == "acked"
    row = await services.queues.get(Q)
    assert row.slot_holders == (rid(2),)
    assert (await services.requests.get(rid(1))).state == "processing"  # not failed
    hooks = services.publisher.hooks()  # type: ignore[attr-defined]
    expired = [p for p in hooks if p.event_type == VALIDATION_LEASE_EXPIRED]
    assert [p.dedup_id for p in expired] == [lease_expired_event_id(rid(1), 5_000)]
    assert services.metrics.total("leases_expired") == 1
    # The late outcome: recorded, and its release leaves the current holder alone.
    await stages.record.complete(rid(1), "succeeded")
    row = await services.queues.get(Q)
    assert (row.slot_holders, row.last_green_uri) == ((rid(2),), "c1")


def test_baseline_lag_is_the_ingest_order_distance() -> None:
    assert baseline_lag(rid(7), rid(4)) == 3


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "queues.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def issues(path: Path) -> list[str]:
    found = check_queue_config(path, display_name="queues.yaml", parameters=MACHINES.parameters)
    return [str(i) for i in found]


def test_a_lease_shorter_than_the_hold_delay_is_located(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "defaults:\n"
        "  max_validation_ms: 4000\n"  # shorter than the declared 5000 ms hold
        "queues:\n"
        "  a/b: {gate_wait_delay_ms: 1000}\n"  # 4000 >= 1000: fine
        '  "c/*": {gate_wait_delay_ms: 9000}\n'  # the default lease is now too short
        "  d/e: {max_validation_ms: 0}\n",  # no expiry
    )
    assert issues(path) == [
        "queues.yaml:2:22: defaults.max_validation_ms: max_validation_ms 4000 is shorter than "
        "gate_wait_delay_ms 5000; a slot lease must last at least one hold delay (or be 0: "
        "no expiry)",
        "queues.yaml:5:31: queues.c/*.gate_wait_delay_ms: max_validation_ms 4000 is shorter "
        "than gate_wait_delay_ms 9000; a slot lease must last at least one hold delay (or be "
        "0: no expiry)",
    ]


def test_a_lease_equal_to_the_hold_delay_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, "defaults: {max_validation_ms: 5000, max_baseline_lag: 0}\n")
    assert issues(path) == []


async def test_n_above_one_without_a_repository_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stages = await queue_with({"max_concurrent": 2}, {1: "accepted", 2: "accepted"})
    with caplog.at_level(logging.WARNING):
        for n in (1, 2):
            assert (await stages.controller.handle(MemoryDelivery(Q, rid(n)))).outcome == "acked"
    messages = [r.getMessage() for r in caplog.records]
    warned = [m for m in messages if "every admit is a full build" in m]
    assert warned == [
        "queue monorepo/main has max_concurrent 2 but no repository configured; every admit "
        "is a full build"
    ]


async def test_a_rewrite_that_ended_without_its_release_does_not_wedge_the_queue() -> None:
    """A crash between a rewrite's terminal write and its release leaves it listed as the
    serial holder; the gate looks it up, finds it ended and frees it in one CAS."""
    stages = await queue_with({"max_concurrent": 2}, {1: "succeeded", 2: "accepted"})
    services = stages.services
    row = await services.queues.get(Q)
    await services.queues.update(row.with_holder(rid(1), serial=True), row.version, 2)
    assert (await stages.controller.handle(MemoryDelivery(Q, rid(2)))).outcome == "acked"
    row = await services.queues.get(Q)
    assert (row.slot_holders, row.serial_holder) == ((rid(2),), "")
    assert (await services.requests.get(rid(2))).state == "processing"

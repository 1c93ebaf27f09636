"""The request lifecycle as compiled from ``machines/request.yaml``, and its slot effects.

The slot rules are derived from the YAML (``holds_slot``, ``terminal``), not written per
transition; these tests pin the derived effects and the idempotence every writer relies
on (claim twice, release twice, release from any source state).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stovepipe_fsm.adapters.memory import MemoryQueueStore, MemoryRequestStore
from stovepipe_fsm.domain.entities import FULL, Queue, Request
from stovepipe_fsm.domain.errors import VersionMismatch
from stovepipe_fsm.machine.compiler import IllegalTransition
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.process.lifecycle import RequestLifecycle
from stovepipe_fsm.simulation.broker import run_sync

ROOT = Path(__file__).resolve().parent.parent
MACHINES = load_process_machines(ROOT / "machines")
Q = "monorepo/main"
R1 = f"request/{Q}/1"
R2 = f"request/{Q}/2"

LEGAL = {
    ("accepted", "admit"): "processing",
    ("accepted", "supersede"): "superseded",
    ("accepted", "fail_closed"): "failed",
    ("processing", "succeed"): "succeeded",
    ("processing", "fail"): "failed",
    ("processing", "cancel"): "cancelled",
    ("processing", "fail_closed"): "failed",
}
STATES = ("accepted", "processing", "superseded", "succeeded", "failed", "cancelled")
TRIGGERS = ("admit", "supersede", "succeed", "fail", "cancel", "fail_closed")


async def lifecycle_with(*requests: Request, holders: tuple[str, ...] = ()) -> RequestLifecycle:
    store, queues = MemoryRequestStore(), MemoryQueueStore()
    for request in requests:
        await store.create(request)
    await queues.create(Queue(Q, latest_request_id=R2, slot_holders=holders))
    return RequestLifecycle(MACHINES.request, MACHINES.roles, store, queues)


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("trigger", TRIGGERS)
def test_transition_table(state: str, trigger: str) -> None:
    """Exactly the declared transitions are legal; notably nothing preempts processing."""
    request = Request(id=R1, queue=Q, uri="A", state=state)
    machine = MACHINES.request
    dest = LEGAL.get((state, trigger))
    if dest is None:
        with pytest.raises(IllegalTransition):
            run_sync(machine.decide(state, trigger, request))
        return
    step = run_sync(machine.decide(state, trigger, request))
    assert step.dest == dest
    assert step.takes_slot == (dest == "processing")
    assert step.releases_slot == (dest != "processing")


async def test_claim_slot_is_idempotent_per_request() -> None:
    lifecycle = await lifecycle_with(Request(id=R1, queue=Q, uri="A", state="accepted"))
    request = await lifecycle.requests.get(R1)
    first = await lifecycle.claim_slot(await lifecycle.queues.get(Q), request, "admit")
    second = await lifecycle.claim_slot(first, request, "admit")
    assert second == first
    assert (await lifecycle.queues.get(Q)) == first
    assert first.slot_holders == (R1,)


async def test_claim_slot_on_a_stale_row_loses_the_race() -> None:
    lifecycle = await lifecycle_with(Request(id=R1, queue=Q, uri="A", state="accepted"))
    stale = await lifecycle.queues.get(Q)
    await lifecycle.update_queue(Q, lambda row: row.with_holder(R2))
    with pytest.raises(VersionMismatch):
        await lifecycle.claim_slot(stale, await lifecycle.requests.get(R1), "admit")
    assert (await lifecycle.queues.get(Q)).slot_holders == (R2,)


async def test_claim_for_a_trigger_that_takes_no_slot_writes_nothing() -> None:
    lifecycle = await lifecycle_with(Request(id=R1, queue=Q, uri="A", state="accepted"))
    queue = await lifecycle.queues.get(Q)
    assert await lifecycle.claim_slot(queue, await lifecycle.requests.get(R1), "supersede") == queue


@pytest.mark.parametrize(
    ("state", "trigger"),
    [
        ("processing", "succeed"),
        ("processing", "fail"),
        ("processing", "cancel"),
        ("processing", "fail_closed"),
        ("accepted", "fail_closed"),  # accepted holder: crashed mid-admit
        ("accepted", "supersede"),
    ],
)
async def test_every_terminal_transition_releases_a_held_slot(state: str, trigger: str) -> None:
    request = Request(id=R1, queue=Q, uri="A", state=state, build_strategy=FULL)
    lifecycle = await lifecycle_with(request, holders=(R1, R2))
    updated = await lifecycle.apply(request, trigger)
    assert updated.version == request.version + 1
    assert (await lifecycle.requests.get(R1)) == updated
    assert (await lifecycle.queues.get(Q)).slot_holders == (R2,)


async def test_admit_neither_takes_nor_releases_a_slot_by_itself() -> None:
    """Taking is the separate, earlier claim_slot CAS; apply('admit') only writes R."""
    request = Request(id=R1, queue=Q, uri="A", state="accepted")
    lifecycle = await lifecycle_with(request)
    queue = await lifecycle.queues.get(Q)
    await lifecycle.apply(request, "admit", build_strategy=FULL)
    assert await lifecycle.queues.get(Q) == queue


async def test_apply_on_a_stale_request_loses_and_writes_nothing() -> None:
    request = Request(id=R1, queue=Q, uri="A", state="processing", build_strategy=FULL)
    lifecycle = await lifecycle_with(request, holders=(R1,))
    await lifecycle.apply(request, "succeed")
    with pytest.raises(IllegalTransition):
        await lifecycle.apply(await lifecycle.requests.get(R1), "fail")
    with pytest.raises(VersionMismatch):
        await lifecycle.apply(request, "fail")
    assert (await lifecycle.requests.get(R1)).state == "succeeded"


async def test_settle_queue_is_safe_to_repeat() -> None:
    request = Request(id=R1, queue=Q, uri="A", state="failed")
    lifecycle = await lifecycle_with(request, holders=(R1,))
    once = await lifecycle.settle_queue(request)
    twice = await lifecycle.settle_queue(request)
    assert once.slot_holders == () and twice == once


async def test_release_stale_holders_frees_only_terminal_ones() -> None:
    done = Request(id=R1, queue=Q, uri="A", state="cancelled")
    mid_admit = Request(id=R2, queue=Q, uri="B", state="accepted")
    lifecycle = await lifecycle_with(done, mid_admit, holders=(R1, R2, f"request/{Q}/9"))
    queue = await lifecycle.release_stale_holders(await lifecycle.queues.get(Q), keep="")
    # The terminal holder goes; the accepted one is mid-admit and the unknown id has no
    # row to judge by, so both stay.
    assert queue.slot_holders == (R2, f"request/{Q}/9")
    assert await lifecycle.queues.get(Q) == queue

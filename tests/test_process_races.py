"""A delivery that resumes after its request moved on must not leave a slot behind.

These are the overlaps a stale ack allows (docs/jetstream.md fact H): a slow delivery
loaded the request and queue row, then something else finished or failed the request
before it claimed its slot.
"""

from __future__ import annotations

from pathlib import Path

from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.broker import run_sync
from stovepipe_fsm.simulation.world import World

ROOT = Path(__file__).resolve().parent.parent
Q = "monorepo/main"
A1 = f"request/{Q}/1"


def world() -> World:
    config = StaticConfigStore({"defaults": {"max_concurrent": 1, "gate_wait_delay_ms": 1000}})
    return World(load_process_machines(ROOT / "machines"), config, {"A1": []})


def holders(w: World) -> tuple[str, ...]:
    return run_sync(w.queues.get(Q)).slot_holders


def test_an_admit_write_that_loses_to_a_dead_letter_releases_its_claim() -> None:
    w = world()
    w.ingest(Q, "A1")
    assert w.stall("after_derive_strategy") is not None
    w.dead_letter(A1)  # A1 held no slot: the queue row is untouched
    report = w.resume(A1)
    assert report.outcome == "retry" and "changed while admitting" in report.detail
    # The claim succeeded on the unchanged row, the admit write lost: claim released.
    assert holders(w) == ()
    assert run_sync(w.requests.get(A1)).state == "failed"


def test_a_claim_that_loses_to_a_finished_request_decides_again_and_acks() -> None:
    w = world()
    w.ingest(Q, "A1")
    w.stall("after_load_queue")
    w.deliver_next()  # the redelivery admits A1 and settles the message
    w.complete(A1, "succeeded")
    report = w.resume(A1)
    assert report.outcome == "acked"  # reloaded the request: terminal, nothing to do
    assert holders(w) == ()
    assert [p.request_id for p in w.published.builds()] == [A1]  # one build, not two


def test_the_terminal_branch_frees_a_slot_a_finished_request_still_holds() -> None:
    w = world()
    w.ingest(Q, "A1")
    w.stall("after_derive_strategy")
    w.dead_letter(A1)
    w.armed_crash = "after_claim_slot"
    assert w.resume(A1).outcome == "crashed"
    assert holders(w) == (A1,)  # a failed request holding a slot, until ...
    assert w.deliver_next().outcome == "acked"  # ... its redelivery finds it terminal
    assert holders(w) == ()

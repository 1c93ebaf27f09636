"""Overlapping deliveries of one queue (a stale ack, ``docs/jetstream.md`` fact H).

A delivery can be stalled in hand after an action while its message is redelivered and
the queue moves on; ``check --overlaps`` explores that with the real controller. Here:
the flow pauses and resumes without changing what it does, a stalled delivery survives
a world fork independently, the shipped policy passes the bounded exploration at the
admit path's crash points, and a lifecycle that writes ``processing`` without a
compare-and-set passes without overlaps but fails with one, in a counterexample that
the simulator's loader and step function replay into the same broken invariant.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from stovepipe_fsm.apps.check.explorer import Explorer, Setup
from stovepipe_fsm.apps.check.invariants import quiescent
from stovepipe_fsm.apps.check.model import Bounds
from stovepipe_fsm.apps.check.observe import observe
from stovepipe_fsm.apps.check.trace import replay, write_counterexample
from stovepipe_fsm.apps.check.variants import Variant
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.domain.entities import Request
from stovepipe_fsm.machine.compiler import Step
from stovepipe_fsm.process.catalog import ProcessMachines, load_process_machines
from stovepipe_fsm.process.controller import PausedDelivery
from stovepipe_fsm.process.lifecycle import QueueChange, RequestLifecycle
from stovepipe_fsm.process.services import LifecycleFactory
from stovepipe_fsm.simulation.broker import run_sync
from stovepipe_fsm.simulation.timeline import load_timeline
from stovepipe_fsm.simulation.world import STALL_POINTS, World

ROOT = Path(__file__).resolve().parent.parent
Q = "monorepo/main"
A1 = "request/monorepo/main/1"
# Only the overlap: no other fault, so what fails can only come from the stall.
ONLY_OVERLAPS = {
    "heads": 2,
    "rewrite": False,
    "max_crashes": 0,
    "max_duplicates": 0,
    "max_dead_letters": 0,
    "max_outages": 0,
}


@pytest.fixture(scope="module")
def machines() -> ProcessMachines:
    return load_process_machines(ROOT / "machines")


def setup_for(machines: ProcessMachines, variant: Variant | None = None, **bounds: Any) -> Setup:
    store = load_policy_store(str(ROOT / "config" / "queues.yaml"))
    return Setup(machines, store, Bounds(**bounds), 1, variant or Variant())


def state_of(world: World, request_id: str) -> str:
    return run_sync(world.requests.get(request_id)).state


def test_a_paused_flow_resumes_to_what_an_uninterrupted_run_does(
    machines: ProcessMachines,
) -> None:
    plain, paused = (setup_for(machines).new_world() for _ in range(2))
    for world in (plain, paused):
        world.ingest(Q, "A1")
    assert plain.deliver_next().outcome == "acked"

    report = paused.stall("after_claim_slot")
    assert report.outcome == "stalled"
    (held,) = paused.in_hand
    assert isinstance(held.paused, PausedDelivery)
    # claim_slot ends the gate's transition: the admit decision is still to be taken.
    assert (held.paused.cursor.state, held.paused.cursor.pending_names) == ("slot_claimed", ())
    # Halfway: the slot is claimed, nothing else written, the message due again.
    assert run_sync(paused.queues.get(Q)).slot_holders == (A1,)
    assert state_of(paused, A1) == "accepted"
    assert [m.request_id for m in paused.broker.due(paused.clock.now_ms())] == [A1]

    assert paused.resume(A1).outcome == "acked"
    assert not paused.in_hand
    assert observe(paused) == observe(plain)


def test_a_stalled_delivery_of_a_failing_head_fails_as_every_delivery_of_it_does(
    machines: ProcessMachines,
) -> None:
    """A timeline's ``failing`` step makes every delivery of the head fail: one stalled
    in hand too, which then fails before its first action and is never in hand."""
    plain, stalled = (setup_for(machines).new_world() for _ in range(2))
    for world in (plain, stalled):
        world.ingest(Q, "A1")
        world.fail_deliveries(A1)
    expected = plain.deliver_next()
    report = stalled.stall("after_claim_slot")
    assert report == expected and report.outcome == "retry"
    assert not stalled.in_hand
    assert state_of(stalled, A1) == "accepted"
    assert stalled.raised == plain.raised


def test_a_stalled_delivery_is_forked_with_its_world(machines: ProcessMachines) -> None:
    world = setup_for(machines).new_world()
    world.ingest(Q, "A1")
    world.stall("after_mark_processing")
    (pending,) = observe(world).in_hand
    assert pending.pending_actions == ("release_lost_claim", "announce", "publish_build", "ack")
    world = setup_for(machines).new_world()
    world.ingest(Q, "A1")
    world.stall("after_claim_slot")
    twin = world.clone()
    (mine,), (theirs,) = world.in_hand, twin.in_hand
    assert theirs.paused.ctx.services is twin.stages.controller.services
    assert theirs.paused.ctx.delivery is theirs.message
    assert theirs.message is twin.broker.find(mine.message.seq)

    twin.resume(A1)
    assert state_of(twin, A1) == "processing"
    assert state_of(world, A1) == "accepted"  # the original is untouched
    assert world.in_hand == [mine]
    assert observe(world).in_hand[0].flow_state == "slot_claimed"


def test_a_late_ack_of_a_settled_message_is_a_no_op(machines: ProcessMachines) -> None:
    """Fact H: the redelivery settles the message; the stalled delivery's ack is stale."""
    world = setup_for(machines).new_world()
    world.ingest(Q, "A1")
    world.stall("after_publish_build")
    assert world.deliver_next().outcome == "acked"  # the redelivery re-announces and acks
    world.ingest(Q, "A2")  # the queue moves on under the stalled delivery
    assert [m.request_id for m in world.broker.messages] == ["request/monorepo/main/2"]

    report = world.resume(A1)
    assert (report.outcome, report.detail) == ("acked", "message already settled")
    assert [m.request_id for m in world.broker.messages] == ["request/monorepo/main/2"]
    assert state_of(world, A1) == "processing"


def test_a_stalled_delivery_is_pending_work(machines: ProcessMachines) -> None:
    setup = setup_for(machines)
    rules = setup.rules()
    world = setup.new_world()
    world.ingest(Q, "A1")
    world.stall("after_publish_build")
    world.deliver_next()
    obs = observe(world)
    assert not obs.pending and obs.in_hand
    assert not quiescent(obs, rules)
    world.resume(A1)
    world.complete(A1, "succeeded")
    assert quiescent(observe(world), rules)


@pytest.mark.slow  # the shipped policy explored with stalls
def test_the_shipped_policy_passes_with_a_stall_at_every_point(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    code = main(
        [
            "check",
            "--heads", "2", "--no-rewrite", "--max-concurrent", "1", "--jobs", "1", "--quiet",
            "--overlaps", "--stall-at", *STALL_POINTS, "--out", str(tmp_path / "cx.yaml"),
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "1 stalled delivery(ies) at after_load_queue after_derive_strategy" in out
    assert "ok: every invariant holds" in out
    assert not (tmp_path / "cx.yaml").exists()


class OverwritingLifecycle(RequestLifecycle):
    """A mutant: Request writes overwrite whatever is stored (no compare-and-set).

    Within one atomic delivery the request it writes is the one it just loaded, so the
    missing check never matters; a delivery that stalls with a request it loaded earlier
    writes that stale request back over newer work.
    """

    async def apply(
        self,
        request: Request,
        trigger: str,
        *,
        queue_change: QueueChange | None = None,
        planned: Step | None = None,
        **changes: Any,
    ) -> Request:
        stored = await self.requests.get(request.id)
        return await super().apply(
            replace(request, version=stored.version),
            trigger,
            queue_change=queue_change,
            planned=planned,
            **changes,
        )


@dataclass(frozen=True)
class OverwritingVariant(Variant):
    @property
    def lifecycle_factory(self) -> LifecycleFactory:
        return OverwritingLifecycle


def test_writes_without_cas_pass_atomic_deliveries(machines: ProcessMachines) -> None:
    result = Explorer(setup_for(machines, OverwritingVariant(), heads=2, rewrite=False)).run()
    assert result.ok, result.counterexample


def test_writes_without_cas_fail_with_an_overlap_and_the_trace_replays(
    machines: ProcessMachines, tmp_path: Path
) -> None:
    variant = OverwritingVariant()
    setup = setup_for(
        machines, variant, max_overlaps=1, stall_points=("after_claim_slot",), **ONLY_OVERLAPS
    )
    result = Explorer(setup).run()
    counterexample = result.counterexample
    assert counterexample is not None
    # The redelivery admits and announces A1; the stalled delivery then writes its stale
    # "accepted" request to processing again, a new version, and announces a second start.
    assert counterexample.violation.invariant == "one_event_per_admission"
    assert "(A1, processing) was announced under 2 event ids" in counterexample.violation.detail
    described = [a.describe() for a in counterexample.trace]
    assert described == ["ingest A1", "stall after_claim_slot", "deliver", "resume A1"]

    path = write_counterexample(tmp_path / "cx.yaml", setup, counterexample, "replay")
    timeline = load_timeline(path)
    replayed = replay(timeline, machines, setup.config, variant=variant)
    assert replayed.violation is not None
    assert replayed.violation.invariant == "one_event_per_admission"
    assert replayed.step == len(timeline.steps)
    # The shipped lifecycle refuses the stale write on the same timeline.
    assert replay(timeline, machines, setup.config).violation is None

"""The decision trail in memory: the walkthrough's story, collapsed holds, no doubles.

The simulated world keeps the trail the service keeps (same stages, same notes); here the
seed's "Waiting for a slot" walkthrough tells, per head, the story the spec tells.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from memory_stages import memory_stages

from stovepipe_fsm.adapters.memory import MemoryPublisher
from stovepipe_fsm.adapters.memory.decision_trail import MemoryTrail
from stovepipe_fsm.adapters.memory.delivery import MemoryDelivery
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.domain.entities import Queue, Request
from stovepipe_fsm.domain.trail_record import (
    ADMITTED,
    ENDED,
    HELD,
    INGESTED,
    RECLAIMED,
    SUPERSEDED,
    TrailRecord,
)
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.process.trail_notes import HeldLogLimiter
from stovepipe_fsm.simulation.replay import simulate
from stovepipe_fsm.simulation.timeline import load_timeline
from stovepipe_fsm.views.explain import render_history, sentence

ROOT = Path(__file__).resolve().parent.parent
WALKTHROUGH = ROOT / "examples" / "walkthrough.yaml"
MACHINES = load_process_machines(ROOT / "machines")


def story(records: list[TrailRecord]) -> list[tuple[str, dict[str, str]]]:
    return [(r.kind, dict(r.details)) for r in records]


def walkthrough_trail() -> tuple[MemoryTrail, dict[str, str]]:
    world = simulate(
        load_timeline(WALKTHROUGH), MACHINES, load_policy_store(str(ROOT / "config/queues.yaml"))
    ).world
    assert world.trail is not None
    ids = {r.uri: r.id for r in world.requests.snapshot()}
    return world.trail, ids


async def test_the_walkthrough_tells_the_story_of_every_head() -> None:
    trail, ids = walkthrough_trail()
    a = await trail.history(ids["A"])
    assert [r.kind for r in a] == [INGESTED, ADMITTED, ENDED]
    assert a[1].details == {"strategy": "full", "why": "no last green", "full_cause": "cold start"}
    assert a[2].details == {"outcome": "succeeded", "by": "build"}
    for uri, by in (("B", "D"), ("C", "D"), ("D", "F"), ("E", "F")):
        kinds = [r.kind for r in await trail.history(ids[uri])]
        assert kinds[0] == INGESTED and kinds[-1] == SUPERSEDED, (uri, kinds)
        last = (await trail.history(ids[uri]))[-1]
        assert last.details == {"by": ids[by]}
    d = await trail.history(ids["D"])
    assert [r.kind for r in d] == [INGESTED, HELD, SUPERSEDED]
    assert d[1].details["reason"] == "gate_closed"
    assert d[1].details["holders"] == ids["A"]
    assert "max_concurrent=1" in d[1].details["parameters"]
    f = await trail.history(ids["F"])
    assert [r.kind for r in f] == [INGESTED, HELD, ADMITTED]
    assert f[2].details == {
        "strategy": "incremental_since_green",
        "base": "A",
        "why": "descends from last green A",
        "base_request": ids["A"],
        "newer_greens_not_ancestors": "0",
        "ancestry_queries": "1",
    }
    assert sentence(f[2]) == (
        "admitted: incremental_since_green build on A (descends from last green A); "
        f"green of {ids['A']} (0 newer green(s) not ancestors)"
    )


async def test_holds_for_one_reason_are_one_record_with_a_count_and_both_times() -> None:
    trail = MemoryTrail()
    first = TrailRecord(HELD, "q", "request/q/1", 1000, tag="gate_closed")
    await trail.append(first)
    await trail.append(TrailRecord(HELD, "q", "request/q/1", 6000, tag="gate_closed"))
    await trail.append(TrailRecord(HELD, "q", "request/q/1", 11000, tag="gate_closed"))
    await trail.append(TrailRecord(HELD, "q", "request/q/1", 12000, tag="paused"))
    (gate, paused) = await trail.history("request/q/1")
    assert (gate.count, gate.first_at_ms, gate.at_ms) == (3, 1000, 11000)
    assert (paused.count, paused.first_at_ms) == (1, 12000)
    assert "held 3 times until" in sentence(gate)


async def test_a_repeated_decision_is_one_record() -> None:
    """Record twice (a redelivered outcome) and reconcile the ended request: one end."""
    trail = MemoryTrail()
    stages = memory_stages(MACHINES, publisher=MemoryPublisher(), trail=trail)
    await stages.ingest.ingest("q", "A")
    request = await stages.services.requests.get("request/q/1")
    queue = await stages.services.queues.get("q")
    await stages.lifecycle.claim_slot(queue, request, "admit")
    await stages.lifecycle.apply(request, "admit", build_strategy="full")
    await stages.record.complete("request/q/1", "succeeded")
    await stages.record.complete("request/q/1", "succeeded")
    await stages.reconciler.reconcile("request/q/1", error="late", attempts=5)
    kinds = [r.kind for r in await trail.history("request/q/1")]
    assert kinds.count(ENDED) == 1 and kinds.count(INGESTED) == 1
    ended = next(r for r in await trail.history("request/q/1") if r.kind == ENDED)
    assert ended.details == {"outcome": "succeeded", "by": "build"}
    assert await trail.has("request/q/1", ENDED)
    assert not await trail.has("request/q/2", ENDED)
    ends = [e for e in stages.services.publisher.hooks() if e.event_type.endswith("succeeded")]
    assert len(ends) == 1


def test_a_trail_record_round_trips_through_json_and_refuses_an_unknown_kind() -> None:
    record = TrailRecord(HELD, "q", "request/q/1", 5, detail=(("reason", "paused"),), count=2)
    assert TrailRecord.from_json(record.as_json()) == record
    with pytest.raises(ValueError, match="kind must be one of"):
        TrailRecord("guessed", "q", "request/q/1", 0)


async def test_explain_text_names_every_decision() -> None:
    trail, ids = walkthrough_trail()
    text = render_history(None, await trail.history(ids["D"]))
    assert "ingested D" in text
    assert "held once: gate_closed (slot holders: request/monorepo/main/1" in text
    assert f"superseded by {ids['F']} (never built)" in text


def test_repeated_holds_log_once_then_once_per_interval_with_the_count() -> None:
    quiet = HeldLogLimiter(interval_s=3600)
    assert [quiet.should_log("r1", "gate_closed") for _ in range(4)] == [1, 0, 0, 0]
    assert quiet.should_log("r1", "paused") == 1  # another reason is another run
    quiet.forget("r1")
    assert quiet.should_log("r1", "gate_closed") == 1
    chatty = HeldLogLimiter(interval_s=0)
    assert [chatty.should_log("r2", "gate_closed") for _ in range(3)] == [1, 1, 1]
    bounded = HeldLogLimiter(interval_s=3600, limit=2)
    for n in range(5):
        bounded.should_log(f"r{n}", "x")
    assert bounded.should_log("r0", "x") == 1, "the oldest runs were forgotten, not kept"


async def test_a_slot_the_gate_takes_back_is_noted_on_the_request_that_held_it() -> None:
    """A ended (request written) but still listed as holder; B's gate finishes it."""
    trail = MemoryTrail()
    stages = memory_stages(MACHINES, trail=trail)
    services = stages.services
    a = Request("request/q/1", "q", "A", "succeeded", build_strategy="full", version=3)
    b = Request("request/q/2", "q", "B", "accepted")
    await services.requests.create(a)
    await services.requests.create(b)
    await services.queues.create(
        Queue("q", latest_request_id=b.id, slot_holders=(a.id,))
    )
    delivery = MemoryDelivery("q", b.id, stream_seq=7)
    assert (await stages.controller.handle(delivery)).outcome == "acked"
    (reclaimed,) = [r for r in await trail.history(a.id) if r.kind == RECLAIMED]
    assert (reclaimed.details, reclaimed.stream_seq) == (
        {"by": b.id, "why": "ended, slot not yet freed"},
        7,
    )
    assert sentence(reclaimed) == (
        f"slot reclaimed by the gate: ended, slot not yet freed (found while deciding {b.id})"
    )

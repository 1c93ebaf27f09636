"""Speculative validation and slot leases on the real service (JetStream, KV, git).

The speculative worked example (``tests/timelines/speculative_worked_example.yaml``,
docs/process.md) goes through JetStream with git ancestry and must end in exactly the
rows ``simulate`` ends in; a stuck build's lease runs out on the wall clock and the
waiting head is admitted within the lease plus one hold delay, with no operator.
"""

from __future__ import annotations

from pathlib import Path

from test_service_support import (
    Running,
    machines,
    running_service,
    stream_messages,
    untimed,
    wait_for,
)

from stovepipe_fsm.adapters.git import GitSourceControlProvider
from stovepipe_fsm.adapters.jetstream.decision_trail import JetStreamTrail
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.apps.service.demo import make_repository
from stovepipe_fsm.apps.service.operators import status_document
from stovepipe_fsm.domain.hooks import VALIDATION_LEASE_EXPIRED, lease_expired_event_id
from stovepipe_fsm.domain.trail_record import ADMITTED, HELD, RECLAIMED
from stovepipe_fsm.simulation.replay import result_json, simulate
from stovepipe_fsm.simulation.timeline import load_timeline

TIMELINE = Path(__file__).parent / "timelines" / "speculative_worked_example.yaml"
Q = "monorepo/main"


async def _held(run: Running, request_id: str, times: int = 1) -> None:
    async def held() -> bool:
        return run.events.count("held", request_id) >= times

    await wait_for(held, f"{request_id} held {times} time(s)")


async def _admitted(run: Running, request_id: str, strategy: str, base: str) -> None:
    await run.wait_state(request_id, "processing")
    request = await run.request(request_id)
    assert (request.build_strategy, request.base_uri) == (strategy, base), request


async def test_speculative_worked_example_ends_like_simulate(js_env, tmp_path) -> None:
    timeline = load_timeline(TIMELINE)
    expected = result_json(
        simulate(timeline, machines(), load_policy_store("config/queues.yaml")).world
    )
    assert set(timeline.history) == set("ABCDEF")
    repo = make_repository(tmp_path / "repo")
    config = {"defaults": dict(timeline.config), "queues": {Q: {"repository": str(repo)}}}
    provider = GitSourceControlProvider({Q: repo})
    async with running_service(js_env.server, js_env.topology, config, provider=provider) as run:
        ids: dict[str, str] = {}
        # 1.-2. A, then B at once beside it, both full: no last green yet.
        ids["A"] = await run.ingest(Q, "A")
        await _admitted(run, ids["A"], "full", "")
        ids["B"] = await run.ingest(Q, "B")
        await _admitted(run, ids["B"], "full", "")
        # 3. C, D, E while A and B run: C superseded, D (then E) waits for a slot.
        for uri in "CDE":
            ids[uri] = await run.ingest(Q, uri)
        await run.wait_state(ids["C"], "superseded")
        await _held(run, ids["D"])
        # 4.-5. A green: D admitted since A; E held (B and D hold the slots).
        await run.pipeline.stages.record.complete(ids["A"], "succeeded")
        await _admitted(run, ids["D"], "incremental_since_green", "A")
        await _held(run, ids["E"])
        # 6.-8. F ingested; B green: E, still among the newest two, admitted since B.
        ids["F"] = await run.ingest(Q, "F")
        await run.pipeline.stages.record.complete(ids["B"], "succeeded")
        await _admitted(run, ids["E"], "incremental_since_green", "B")
        await _held(run, ids["F"])
        # 9.-10. D green: F admitted since D.
        await run.pipeline.stages.record.complete(ids["D"], "succeeded")
        await _admitted(run, ids["F"], "incremental_since_green", "D")
        # 11.-12. F green, then E's late green: recorded, moot.
        await run.pipeline.stages.record.complete(ids["F"], "succeeded")
        await run.pipeline.stages.record.complete(ids["E"], "succeeded")
        row = await run.queue(Q)
        assert (row.last_green_uri, row.slot_holders) == ("F", ())
        doc = await status_document(js_env.js, js_env.topology)

    # The times are each clock's own (the world's from 0, the service's the wall clock).
    assert untimed(doc["requests"]) == untimed(expected["requests"])
    assert doc["queues"] == expected["queues"]
    validated = [r["uri"] for r in doc["requests"] if r["build_strategy"]]
    assert validated == ["A", "B", "D", "E", "F"]


async def test_an_expired_lease_frees_the_slot_without_an_operator(js_env) -> None:
    lease_ms, hold_ms = 1500, 200
    config = {
        "defaults": {
            "max_concurrent": 1,
            "gate_wait_delay_ms": hold_ms,
            "max_validation_ms": lease_ms,
        },
        "queues": {Q: {}},
    }
    async with running_service(js_env.server, js_env.topology, config) as run:
        stuck = await run.ingest(Q, "A")
        await run.wait_state(stuck, "processing")
        expires_at = (await run.queue(Q)).expires_at(stuck)
        assert expires_at is not None
        waiting = await run.ingest(Q, "B")
        await _held(run, waiting)
        # A never reports: its lease runs out, the next gate check reclaims the slot.
        await run.wait_state(waiting, "processing", timeout=lease_ms / 1000 + 10)
        # B was held while A's lease ran and admitted once it had run out; A's story says
        # its slot was reclaimed for that reason (times as the service's clock noted them).
        trail = JetStreamTrail(js_env.js, js_env.topology)
        story = await trail.history(waiting)
        holds = [r.first_at_ms for r in story if r.kind == HELD]
        admitted = [r.at_ms for r in story if r.kind == ADMITTED]
        assert holds and len(admitted) == 1
        assert min(holds) < expires_at <= admitted[0]
        reclaims = [r for r in await trail.history(stuck) if r.kind == RECLAIMED]
        assert [(r.details.get("why"), r.details.get("by")) for r in reclaims] == [
            ("lease expired", waiting)  # by B's own check, which then admitted B
        ]
        assert expires_at <= reclaims[0].at_ms
        assert await run.state(stuck) == "processing"  # expiry does not fail the request
        assert (await run.queue(Q)).slot_holders == (waiting,)
        # A's late green is still recorded (the newest green so far: adopted); its
        # release finds no slot and leaves B's alone.
        await run.pipeline.stages.record.complete(stuck, "succeeded")
        row = await run.queue(Q)
        assert (row.last_green_uri, row.slot_holders) == ("A", (waiting,))
        hooks = await stream_messages(
            js_env.js,
            js_env.topology.hooks_stream,
            js_env.topology.hook_subject(VALIDATION_LEASE_EXPIRED),
        )
    assert [h["id"] for h in hooks] == [lease_expired_event_id(stuck, expires_at)]
    assert hooks[0]["payload"]["request_id"] == stuck

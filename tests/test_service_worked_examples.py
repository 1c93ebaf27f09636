"""The seed's "Concurrency lifecycle" worked example, run on the real service.

The timeline ``tests/timelines/concurrency_lifecycle.yaml`` encodes the example for
``simulate``; here the same heads go through JetStream, KV and git ancestry, and the
live pipeline must end in exactly the rows the simulation ends in. Agreement is what
lets the simulator stand in for the service when reasoning about coalescing and slots.
"""

from __future__ import annotations

from pathlib import Path

from test_service_support import Running, machines, running_service, untimed, wait_for

from stovepipe_fsm.adapters.git import GitSourceControlProvider
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.apps.service.demo import make_repository
from stovepipe_fsm.apps.service.operators import status_document
from stovepipe_fsm.simulation.replay import result_json, simulate
from stovepipe_fsm.simulation.timeline import load_timeline

TIMELINE = Path(__file__).parent / "timelines" / "concurrency_lifecycle.yaml"


async def _wait_held(run: Running, request_id: str, uri: str) -> None:
    """A hold is only visible as an event: the request stays ``accepted`` meanwhile."""

    async def held() -> bool:
        return run.events.count("held", request_id) >= 1

    await wait_for(held, f"{uri} held")


async def test_concurrency_lifecycle_ends_like_simulate(js_env, tmp_path) -> None:
    timeline = load_timeline(TIMELINE)
    expected = result_json(
        simulate(timeline, machines(), load_policy_store("config/queues.yaml")).world
    )
    queue = timeline.queue
    # Real ancestry for the incremental strategies: one tagged commit per letter, the
    # same linear history the timeline lists.
    assert set(timeline.history) == set("ABCDEF")
    repo = make_repository(tmp_path / "repo")
    config = {"defaults": dict(timeline.config), "queues": {queue: {"repository": str(repo)}}}
    provider = GitSourceControlProvider({queue: repo})
    async with running_service(js_env.server, js_env.topology, config, provider=provider) as run:
        ids: dict[str, str] = {}

        # 1. A admitted (cold start: full), published to build.
        ids["A"] = await run.ingest(queue, "A")
        await run.wait_state(ids["A"], "processing")
        # 2.-3. B, C, D ingested while A runs: B, C superseded, D waits for the slot.
        for uri in "BCD":
            ids[uri] = await run.ingest(queue, uri)
        for uri in "BC":
            await run.wait_state(ids[uri], "superseded")
        await _wait_held(run, ids["D"], "D")
        assert await run.state(ids["D"]) == "accepted"  # held, not admitted past A
        # 4.-5. A completes, the slot frees, D re-checks and is admitted since A.
        await run.pipeline.stages.record.complete(ids["A"], "succeeded")
        await run.wait_state(ids["D"], "processing")
        # 6. E, F ingested while D runs: E superseded, F waits for the slot.
        for uri in "EF":
            ids[uri] = await run.ingest(queue, uri)
        await run.wait_state(ids["E"], "superseded")
        await _wait_held(run, ids["F"], "F")
        assert await run.state(ids["F"]) == "accepted"
        # 7. D completes, F admitted since D.
        await run.pipeline.stages.record.complete(ids["D"], "succeeded")
        await run.wait_state(ids["F"], "processing")
        doc = await status_document(js_env.js, js_env.topology)

    # The times are each clock's own (the world's from 0, the service's the wall clock).
    assert untimed(doc["requests"]) == untimed(expected["requests"])
    assert doc["queues"] == expected["queues"]
    # Only the heads the example validates ever held a slot; no intermediate did.
    admitted = [r["uri"] for r in doc["requests"] if r["build_strategy"]]
    assert admitted == ["A", "D", "F"]

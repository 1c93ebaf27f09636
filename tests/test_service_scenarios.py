"""Whole-pipeline scenarios through the service: the seed's walkthrough, a restart in the
middle of a burst, and two replicas sharing the consumers."""

from __future__ import annotations

import asyncio
import collections
import contextlib

from test_service_support import FAST, machines, running_service, untimed, wait_for

from stovepipe_fsm.adapters.git import GitSourceControlProvider
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.apps.service.broker_pipeline import open_pipeline
from stovepipe_fsm.apps.service.demo import make_repository
from stovepipe_fsm.apps.service.operators import status_document
from stovepipe_fsm.apps.service.service_options import ServiceOptions
from stovepipe_fsm.domain.errors import StovepipeError
from stovepipe_fsm.simulation.replay import result_json, simulate
from stovepipe_fsm.simulation.timeline import load_timeline

QUEUES = ("monorepo/main", "mobile/app")
SETTLED = {"superseded", "succeeded"}
BURST_CONFIG = {
    "defaults": {"max_concurrent": 1, "gate_wait_delay_ms": 100, "max_attempts": 5},
    "queues": {q: {} for q in QUEUES},
}


async def test_walkthrough_ends_like_simulate(js_env, tmp_path) -> None:
    expected = result_json(
        simulate(
            load_timeline("examples/walkthrough.yaml"),
            machines(),
            load_policy_store("config/queues.yaml"),
        ).world
    )
    queue = "monorepo/main"
    repo = make_repository(tmp_path / "repo")
    config = {
        "defaults": {"max_concurrent": 1, "gate_wait_delay_ms": 300},
        "queues": {queue: {"repository": str(repo)}},
    }
    provider = GitSourceControlProvider({queue: repo})
    async with running_service(js_env.server, js_env.topology, config, provider=provider) as run:
        ids = {}
        for uri in "A":
            ids[uri] = await run.ingest(queue, uri)
        await run.wait_state(ids["A"], "processing")
        for uri in "BCD":
            ids[uri] = await run.ingest(queue, uri)
        for uri in "BC":
            await run.wait_state(ids[uri], "superseded")

        async def d_held() -> bool:
            return run.events.count("held", ids["D"]) >= 1

        await wait_for(d_held, "D held")
        for uri in "EF":
            ids[uri] = await run.ingest(queue, uri)
        for uri in "DE":
            await run.wait_state(ids[uri], "superseded")
        await run.pipeline.stages.record.complete(ids["A"], "succeeded")
        await run.wait_state(ids["F"], "processing")
        doc = await status_document(js_env.js, js_env.topology)
    # The times are each clock's own (the world's from 0, the service's the wall clock).
    assert untimed(doc["requests"]) == untimed(expected["requests"])
    assert doc["queues"] == expected["queues"]


async def ingest_burst(pipeline, count: int, offset: int = 0) -> list[str]:  # type: ignore[no-untyped-def]
    ids = []
    for n in range(offset, offset + count):
        queue = QUEUES[n % len(QUEUES)]
        ids.append((await pipeline.stages.ingest.ingest(queue, f"c{n:03d}")).request_id)
        await asyncio.sleep(0.005)
    return ids


async def settle_everything(js_env, pipeline) -> dict:  # type: ignore[no-untyped-def]
    """Report every admitted build green until no request is left open; the final status."""

    async def consistent() -> dict | None:
        doc = await status_document(js_env.js, js_env.topology)
        for q in doc["queues"]:
            rows = [r for r in doc["requests"] if r["queue"] == q["name"]]
            processing = sum(r["state"] == "processing" for r in rows)
            if q["in_flight_count"] != processing:
                return None
        return doc

    async def done() -> dict | None:
        doc = await consistent()
        if doc is None:
            return None
        open_ = [r for r in doc["requests"] if r["state"] not in SETTLED]
        for r in open_:
            if r["state"] == "processing":
                with contextlib.suppress(StovepipeError):
                    await pipeline.stages.record.complete(r["id"], "succeeded")
        return None if open_ else doc

    # At a quiet moment the slots match the processing requests exactly.
    await wait_for(consistent, "slot holders to match processing requests")
    return await wait_for(done, "every request settled", timeout=60)


def check_final(doc: dict, ingested: list[str]) -> None:
    assert sorted(r["id"] for r in doc["requests"]) == sorted(ingested)
    assert {r["state"] for r in doc["requests"]} <= SETTLED
    for q in doc["queues"]:
        assert q["in_flight_count"] == 0
        # the newest head of every queue is always validated, never superseded
        latest = [r for r in doc["requests"] if r["id"] == q["latest_request_id"]]
        assert latest and latest[0]["state"] == "succeeded"


async def test_restart_mid_burst_loses_nothing(js_env) -> None:
    pipeline = await open_pipeline(
        js_env.js, js_env.topology, machines(), StaticConfigStore(BURST_CONFIG)
    )
    impatient = ServiceOptions(**{**FAST.__dict__, "shutdown_timeout_s": 0.0})
    ingested: list[str] = []
    async with running_service(
        js_env.server, js_env.topology, BURST_CONFIG, options=impatient
    ) as first:
        ingested += await ingest_burst(pipeline, 12)
        # Stop with work in hand: runners are cancelled mid-step and hand messages back.
        await asyncio.sleep(0.05)
    assert first.events.seen, "the first service handled part of the burst"
    ingested += await ingest_burst(pipeline, 8, offset=12)
    async with running_service(js_env.server, js_env.topology, BURST_CONFIG) as second:
        ingested += await ingest_burst(pipeline, 10, offset=20)
        doc = await settle_everything(js_env, second.pipeline)
    check_final(doc, ingested)
    info = await js_env.js.stream_info(js_env.topology.process_stream)
    assert info.state.messages == 0


async def test_two_replicas_keep_each_queue_serialized(js_env) -> None:
    in_hand: collections.Counter[str] = collections.Counter()
    peak: collections.Counter[str] = collections.Counter()
    handled: collections.Counter[int] = collections.Counter()

    def instrument(run, replica: int) -> None:  # type: ignore[no-untyped-def]
        controller = run.pipeline.stages.controller
        original = controller.handle

        async def handle(delivery, **kwargs):  # type: ignore[no-untyped-def]
            in_hand[delivery.queue] += 1
            peak[delivery.queue] = max(peak[delivery.queue], in_hand[delivery.queue])
            handled[replica] += 1
            try:
                await asyncio.sleep(0.01)  # widen the window a second delivery would use
                return await original(delivery, **kwargs)
            finally:
                in_hand[delivery.queue] -= 1

        controller.handle = handle

    pipeline = await open_pipeline(
        js_env.js, js_env.topology, machines(), StaticConfigStore(BURST_CONFIG)
    )
    async with (
        running_service(js_env.server, js_env.topology, BURST_CONFIG) as one,
        running_service(js_env.server, js_env.topology, BURST_CONFIG) as two,
    ):
        instrument(one, 1)
        instrument(two, 2)
        ingested = await ingest_burst(pipeline, 30)
        doc = await settle_everything(js_env, pipeline)
    check_final(doc, ingested)
    assert set(peak) == set(QUEUES)
    assert max(peak.values()) == 1
    assert handled[1] + handled[2] > 0


async def test_a_crash_with_a_message_in_hand_is_redelivered_after_ack_wait(js_env) -> None:
    quick = ServiceOptions(**{**FAST.__dict__, "ack_wait_s": 1.0, "shutdown_timeout_s": 0.0})
    queue = QUEUES[0]
    stuck = asyncio.Event()
    async with running_service(js_env.server, js_env.topology, BURST_CONFIG, options=quick) as dead:

        async def hang(delivery, **kwargs):  # type: ignore[no-untyped-def]
            stuck.set()
            await asyncio.Event().wait()  # the process "dies" holding the message

        dead.pipeline.stages.controller.handle = hang
        rid = await dead.ingest(queue, "A")
        await asyncio.wait_for(stuck.wait(), 10)
        await dead.nc.close()  # gone without ack or NAK: only the ack deadline frees it
    async with running_service(js_env.server, js_env.topology, BURST_CONFIG, options=quick) as live:
        await live.wait_state(rid, "processing", timeout=15)
        assert (await live.queue(queue)).slot_holders == (rid,)

"""Idle queues park one long pull request each, and still react at once.

Every service here waits 120 s on a parked pull request and lists the queues bucket only
every 120 s, so anything that happens within a few seconds was brought by the broker
answering a parked request, by the publish subscription, or by a renewal after a
reconnect, never by a poll coming round.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from nats_server import JsEnv
from test_service_support import FAST, Running, running_service, wait_for

from stovepipe_fsm.adapters.jetstream import NatsServer, Topology
from stovepipe_fsm.adapters.jetstream.codec import WorkMessage, encode_work
from stovepipe_fsm.adapters.jetstream.durable_consumer import existing_consumers

PARKED = dataclasses.replace(FAST, fetch_timeout_s=120.0, discover_interval_s=120.0)
#: Far below the parked wait: reaching a state within this proves no poll was needed.
SOON_S = 8.0
QUEUE = "monorepo/main"
CONFIG = {
    "defaults": {"max_concurrent": 1, "gate_wait_delay_ms": 100, "max_attempts": 5},
    "queues": {QUEUE: {}, "mobile/app": {}},
}


async def _parked(run: Running, queue: str) -> None:
    async def check() -> bool:
        consumer = run.service.crew.queues.consumers.get(queue)
        return consumer is not None and consumer.parked

    await wait_for(check, f"{queue} to park its pull request", SOON_S)


async def test_a_head_into_a_parked_queue_is_admitted_at_once(nats_server: NatsServer) -> None:
    async with running_service(
        nats_server, Topology.isolated("parked-admit"), CONFIG, options=PARKED
    ) as run:
        await _parked(run, QUEUE)
        await asyncio.sleep(0.3)  # parked a while: the request is not a fresh one
        first = await run.ingest(QUEUE, "A")
        await run.wait_state(first, "processing", timeout=SOON_S)
        # A held head (the one slot is taken) comes back after its NAK delay to the
        # request the loop parked after the hold, and is admitted when the slot frees.
        second = await run.ingest(QUEUE, "B")
        await wait_for(lambda: _count(run, "held", second), f"{second} to be held", timeout=SOON_S)
        await run.pipeline.stages.record.complete(first, "succeeded")
        await run.wait_state(second, "processing", timeout=SOON_S)


async def _count(run: Running, event: str, request_id: str) -> bool:
    return run.events.count(event, request_id) > 0


async def test_a_new_queue_gets_a_consumer_from_its_first_publish(
    nats_server: NatsServer,
) -> None:
    async with running_service(
        nats_server, Topology.isolated("parked-new"), CONFIG, options=PARKED
    ) as run:
        await _parked(run, QUEUE)
        assert "tools/new" not in run.service.crew.queues.consumers
        request_id = await run.ingest("tools/new", "A")
        await run.wait_state(request_id, "processing", timeout=SOON_S)
        assert "tools/new" in run.service.crew.queues.consumers


async def test_a_forged_publish_for_a_queue_never_ingested_starts_no_consumer(
    js_env: JsEnv,
) -> None:
    """A publish on a queue's subject wakes the service, but a queue ingest never made a
    row for gets no consumer (a flood of forged subjects must not use up the stream's
    consumers): its messages are dead-lettered as orphans at once, not a discovery
    round later."""
    topology = js_env.topology
    async with running_service(js_env.server, topology, CONFIG, options=PARKED) as run:
        await _parked(run, QUEUE)
        ghost = "ghost/queue"
        work = encode_work(WorkMessage(queue=ghost, request_id=f"request/{ghost}/1"))
        await js_env.js.publish(
            topology.process_subject(ghost), work, stream=topology.process_stream
        )

        async def swept() -> bool:
            return run.events.count("orphan") == 1

        await wait_for(swept, "the forged message dead-lettered as an orphan", SOON_S)
        assert ghost not in run.service.crew.queues.consumers
        listed = await existing_consumers(js_env.js, topology.process_stream)
        assert topology.process_consumer_name(ghost) not in listed


@pytest.mark.nats
async def test_parked_requests_are_renewed_after_a_broker_restart(tmp_path) -> None:
    async with (
        NatsServer(tmp_path / "store") as server,
        running_service(
            server,
            Topology.isolated("parked-restart"),
            CONFIG,
            options=PARKED,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
        ) as run,
    ):
        await _parked(run, QUEUE)
        renewed_before = run.service.nc.stats["reconnects"]
        await asyncio.to_thread(server.restart)  # the broker forgets every pull request

        async def reconnected() -> bool:
            return bool(run.service.nc.stats["reconnects"] > renewed_before)

        await wait_for(reconnected, "the service to reconnect", SOON_S)
        request_id = None
        for _ in range(50):  # the ingesting side may still be reconnecting
            try:
                request_id = await run.ingest(QUEUE, "A")
                break
            except Exception:
                await asyncio.sleep(0.2)
        assert request_id is not None
        await run.wait_state(request_id, "processing", timeout=SOON_S)


async def test_two_parked_replicas_share_the_queues_and_settle_each_head_once(
    nats_server: NatsServer,
) -> None:
    topology = Topology.isolated("parked-two")
    async with (
        running_service(nats_server, topology, CONFIG, options=PARKED) as one,
        running_service(nats_server, topology, CONFIG, options=PARKED) as two,
    ):
        for run in (one, two):
            await _parked(run, QUEUE)
            await _parked(run, "mobile/app")
        ids = []
        for n, queue in enumerate([QUEUE, "mobile/app"] * 3):
            request_id = await one.ingest(queue, f"h{n}")
            ids.append(request_id)
            await one.wait_state(request_id, "processing", timeout=SOON_S)
            await one.pipeline.stages.record.complete(request_id, "succeeded")
        for request_id in ids:
            await one.wait_state(request_id, "succeeded", timeout=SOON_S)
        admitted = sum(
            run.events.count("acked", request_id) for run in (one, two) for request_id in ids
        )
        assert admitted == len(ids)  # every head settled once, by one replica or the other


async def test_a_restart_binds_the_listed_consumers_and_rewrites_no_unchanged_parameters(
    nats_server: NatsServer,
) -> None:
    topology = Topology.isolated("parked-restart-many")
    many = {"defaults": CONFIG["defaults"], "queues": {f"team/q{n:03d}": {} for n in range(300)}}
    key = "queue.team/q123"
    async with running_service(nats_server, topology, many, options=PARKED) as run:
        listed = await existing_consumers(run.service.js, topology.process_stream)
        assert len(listed) == 300  # more than one page of the broker's listing
        kv = await run.service.js.key_value(topology.service_bucket)
        written = (await kv.get(key)).revision
    async with running_service(nats_server, topology, many, options=PARKED) as run:
        assert len(run.service.crew.queues.consumers) == 300
        kv = await run.service.js.key_value(topology.service_bucket)
        assert (await kv.get(key)).revision == written  # the same parameters: not rewritten
        request_id = await run.ingest("team/q123", "A")
        await run.wait_state(request_id, "processing", timeout=SOON_S)

"""Start waits only for the queues that can have work; the other consumers come behind it.

A first start on thousands of configured queues would otherwise wait for the broker to
create a consumer for every queue with nothing to do. Here start binds the consumers that
exist, opens the queues with messages waiting, and returns; the missing consumers are
created behind it (``warm_up``), and a queue's first publish creates its consumer at once
either way.
"""

from __future__ import annotations

import asyncio
import dataclasses

from nats_server import connect
from test_service_support import FAST, machines, memory_provider, running_service, wait_for

from stovepipe_fsm.adapters.jetstream import NatsServer, Topology
from stovepipe_fsm.adapters.jetstream.durable_consumer import existing_consumers
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.service.broker_pipeline import open_pipeline
from stovepipe_fsm.domain.entities import Queue

COLD = dataclasses.replace(FAST, warm_up=False)
DEFAULTS = {"max_concurrent": 1, "gate_wait_delay_ms": 100, "max_attempts": 5}
QUEUES = {f"team/q{n:03d}": {} for n in range(120)}
CONFIG = {"defaults": DEFAULTS, "queues": QUEUES}


async def _listed(run_js: object, topology: Topology) -> set[str]:
    return set(await existing_consumers(run_js, topology.process_stream))  # type: ignore[arg-type]


async def test_start_creates_no_consumer_for_queues_without_work(nats_server: NatsServer) -> None:
    topology = Topology.isolated("start-cold")
    async with running_service(nats_server, topology, CONFIG, options=COLD) as run:
        assert run.service.crew.queues.consumers == {}
        assert await _listed(run.service.js, topology) == set()
        assert run.service.ready  # nothing the service knows of waits for a consumer
        # A queue's first head creates its consumer (the publish subscription) at once.
        request_id = await run.ingest("team/q042", "A")
        await run.wait_state(request_id, "processing", timeout=8.0)
        assert list(run.service.crew.queues.consumers) == ["team/q042"]
        assert await _listed(run.service.js, topology) == {
            topology.process_consumer_name("team/q042")
        }


async def test_a_head_waiting_before_start_is_served_by_start_itself(
    nats_server: NatsServer,
) -> None:
    topology = Topology.isolated("start-waiting")
    # Ingest with no service running: the head waits in the stream with no consumer.
    nc = await connect(nats_server)
    try:
        pipeline = await open_pipeline(
            nc.jetstream(),
            topology,
            machines(),
            StaticConfigStore(CONFIG),
            source_control=memory_provider()[1],
        )
        request_id = (await pipeline.stages.ingest.ingest("team/q007", "A")).request_id
    finally:
        await nc.close()
    async with running_service(nats_server, topology, CONFIG, options=COLD) as run:
        # start() returned with that queue's consumer open, and only that one.
        assert list(run.service.crew.queues.consumers) == ["team/q007"]
        await run.wait_state(request_id, "processing", timeout=8.0)
        assert await _listed(run.service.js, topology) == {
            topology.process_consumer_name("team/q007")
        }


async def test_the_missing_consumers_are_created_behind_start(nats_server: NatsServer) -> None:
    topology = Topology.isolated("start-warm")
    async with running_service(nats_server, topology, CONFIG, warmed=False) as run:
        await asyncio.wait_for(run.service.crew.queues.warmed(), 60.0)
        assert set(run.service.crew.queues.consumers) == set(QUEUES)
        names = {topology.process_consumer_name(q) for q in QUEUES}
        assert await _listed(run.service.js, topology) == names
        assert run.service.ready
    # A restart finds them all and binds them before it returns.
    async with running_service(nats_server, topology, CONFIG, warmed=False) as run:
        assert set(run.service.crew.queues.consumers) == set(QUEUES)
        await asyncio.wait_for(run.service.crew.queues.warmed(), 1.0)


async def test_a_queue_row_without_work_gets_its_consumer_behind_start(
    nats_server: NatsServer,
) -> None:
    topology = Topology.isolated("start-known")
    nc = await connect(nats_server)
    try:  # a queue ingest made (not configured), with nothing waiting and no consumer
        pipeline = await open_pipeline(
            nc.jetstream(), topology, machines(), StaticConfigStore(CONFIG)
        )
        await pipeline.stages.lifecycle.queues.create(Queue(name="tools/new"))
    finally:
        await nc.close()
    async with running_service(nats_server, topology, CONFIG, options=COLD) as run:
        assert "tools/new" not in run.service.crew.queues.consumers  # no work: start does not wait
        assert await _listed(run.service.js, topology) == set()
    async with running_service(nats_server, topology, CONFIG, warmed=False) as run:

        async def served() -> bool:
            return "tools/new" in run.service.crew.queues.consumers

        await wait_for(served, "the queue's consumer created behind start", 30.0)
        await asyncio.wait_for(run.service.crew.queues.warmed(), 60.0)
        assert set(run.service.crew.queues.consumers) == {"tools/new", *QUEUES}


async def test_discovery_rounds_run_one_at_a_time(nats_server: NatsServer) -> None:
    """The loop's round and one a publish or a reconnect starts never list and act side by
    side (they would both dead-letter an orphan, or both move a stray message)."""
    topology = Topology.isolated("one-round")
    async with running_service(nats_server, topology, CONFIG) as run:
        discovery = run.service.crew.discovery
        inside = most = 0
        rounds = discovery._discover_from

        async def counted(subjects: dict[str, int], known: list[str]) -> list[str]:
            nonlocal inside, most
            inside += 1
            most = max(most, inside)
            try:
                await asyncio.sleep(0.05)  # long enough for the others to overlap
                return await rounds(subjects, known)
            finally:
                inside -= 1

        discovery._discover_from = counted  # type: ignore[method-assign]
        await asyncio.gather(*(discovery.discover() for _ in range(4)))
        assert most == 1

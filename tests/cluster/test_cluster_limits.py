"""The process stream's consumer limit on a 3-node cluster, raised by two replicas at once.

Two service replicas start side by side on a replicated topology whose process stream
was created for fewer queues than the policy names: both meet the limit while creating
consumers, both raise it, and every queue ends up served by both, with a head of each
admitted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from nats_cluster import NatsCluster
from test_service_support import Events, wait_for

from stovepipe_fsm.adapters.jetstream import Topology, ensure_topology
from stovepipe_fsm.adapters.memory import MemorySourceControlProvider
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.service.runtime import Service, ServiceOptions, open_pipeline
from stovepipe_fsm.process.catalog import load_process_machines

QUEUES = [f"limit/q{n}" for n in range(6)]
CONFIG = {"defaults": {"gate_wait_delay_ms": 100}, "queues": {q: {} for q in QUEUES}}
OPTIONS = ServiceOptions(fetch_timeout_s=0.5, discover_interval_s=0.5, shutdown_timeout_s=5.0)


@contextlib.asynccontextmanager
async def _replicas(cluster: NatsCluster, topology: Topology) -> AsyncIterator[list[Service]]:
    connections = [await cluster.connect() for _ in range(2)]
    services = [
        Service(
            nc,
            topology,
            load_process_machines("machines"),
            StaticConfigStore(CONFIG),
            source_control=MemorySourceControlProvider(),
            options=OPTIONS,
            observer=Events(),
        )
        for nc in connections
    ]
    try:
        await asyncio.wait_for(asyncio.gather(*(s.start() for s in services)), 60)
        await asyncio.wait_for(asyncio.gather(*(s.warmed() for s in services)), 60)
        yield services
    finally:
        for service in services:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(service.stop(), 30)
        for nc in connections:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 10)


async def test_two_replicas_raise_a_replicated_streams_consumer_limit(
    nats_cluster: NatsCluster,
) -> None:
    topology = Topology.isolated("limits", replicas=3, initial_queue_limit=2)
    nc = await nats_cluster.connect()
    try:
        js = nc.jetstream()
        await ensure_topology(js, topology)
        assert (await js.stream_info(topology.process_stream)).config.max_consumers == 2
        async with _replicas(nats_cluster, topology) as services:
            for service in services:
                assert sorted(service.consumers) == QUEUES and service.refused == {}
            info = await js.stream_info(topology.process_stream)
            assert info.config.num_replicas == 3
            assert info.state.consumer_count == len(QUEUES)
            assert info.config.max_consumers >= 1002
            load = await open_pipeline(
                js, topology, load_process_machines("machines"), StaticConfigStore(CONFIG)
            )
            ids = [(await load.ingest.ingest(queue, "A")).request_id for queue in QUEUES]

            async def admitted() -> bool:
                states = [(await load.lifecycle.requests.get(rid)).state for rid in ids]
                return states == ["processing"] * len(ids)

            await wait_for(admitted, "a head of every queue admitted", 60)
    finally:
        await nc.close()

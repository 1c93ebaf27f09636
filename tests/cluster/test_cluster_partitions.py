"""Queues spread over partitions of a replicated process stream, by two replicas at once.

The cluster's one account caps each stream at two consumers: two service replicas
starting side by side on a replicated topology move the queues past that limit to new
replicated partitions, agree on each queue's partition, and admit a head of every queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from nats_cluster import NatsCluster
from nats_server import account_limited_config
from test_service_support import Events, wait_for

from stovepipe_fsm.adapters.jetstream import Topology
from stovepipe_fsm.adapters.jetstream.durable_consumer import existing_consumers
from stovepipe_fsm.adapters.jetstream.partitions import partitions
from stovepipe_fsm.adapters.memory import MemorySourceControlProvider
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.service.runtime import Service, ServiceOptions, open_pipeline
from stovepipe_fsm.process.catalog import load_process_machines

QUEUES = [f"spread/q{n}" for n in range(6)]
CONFIG = {"defaults": {"gate_wait_delay_ms": 100}, "queues": {q: {} for q in QUEUES}}
OPTIONS = ServiceOptions(fetch_timeout_s=0.5, discover_interval_s=0.5, shutdown_timeout_s=5.0)


@pytest.fixture(scope="module")
def nats_cluster() -> Iterator[NatsCluster]:
    """Three nodes whose one account lets each stream hold two consumers (this module's
    own cluster, in place of the shared one)."""
    root = Path(tempfile.mkdtemp(prefix="stovepipe-test-cluster-limited-"))
    cluster = NatsCluster(root, config=account_limited_config(root, max_consumers=2))
    try:
        cluster.start()
        with ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(asyncio.run, cluster.wait_ready()).result(timeout=90)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


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
        await asyncio.wait_for(asyncio.gather(*(s.start() for s in services)), 90)
        await asyncio.wait_for(asyncio.gather(*(s.warmed() for s in services)), 90)
        yield services
    finally:
        for service in services:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(service.stop(), 30)
        for nc in connections:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 10)


async def test_two_replicas_spread_queues_over_replicated_partitions(
    nats_cluster: NatsCluster,
) -> None:
    topology = Topology.isolated("spread", replicas=3)
    nc = await nats_cluster.connect()
    try:
        js = nc.jetstream()
        async with _replicas(nats_cluster, topology) as services:
            for service in services:
                assert sorted(service.consumers) == QUEUES and service.refused == {}
            numbers = await partitions(js, topology)
            assert numbers == [0, 1, 2]
            held: dict[str, list[int]] = {}
            for partition in numbers:
                info = await js.stream_info(topology.process_stream_of(partition))
                assert info.config.num_replicas == 3
                assert info.state.consumer_count == 2
                stream = topology.process_stream_of(partition)
                for name in await existing_consumers(js, stream):
                    held.setdefault(name, []).append(partition)
            # One consumer per queue, where both replicas run it.
            for queue in QUEUES:
                where = held[topology.process_consumer_name(queue)]
                assert len(where) == 1
                assert {s.consumers[queue].partition for s in services} == set(where)
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

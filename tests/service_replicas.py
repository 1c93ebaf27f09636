"""Service replicas started side by side on one cluster, for the tests under ``tests/cluster``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from nats.js import JetStreamContext
from nats_cluster import NatsCluster
from test_service_support import Events, wait_for

from stovepipe_fsm.adapters.jetstream import Topology
from stovepipe_fsm.adapters.memory import MemorySourceControlProvider
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.service.broker_pipeline import open_pipeline
from stovepipe_fsm.apps.service.service_options import ServiceOptions
from stovepipe_fsm.apps.service.supervisor import Service
from stovepipe_fsm.process.catalog import load_process_machines

#: Short fetches and discovery rounds: the tests wait on what the replicas do.
OPTIONS = ServiceOptions(fetch_timeout_s=0.5, discover_interval_s=0.5, shutdown_timeout_s=5.0)


@contextlib.asynccontextmanager
async def replicas(
    cluster: NatsCluster, topology: Topology, config: Mapping[str, Any], count: int = 2
) -> AsyncIterator[list[Service]]:
    """``count`` services, each on its own connection, started and warmed together."""
    connections = [await cluster.connect() for _ in range(count)]
    services = [
        Service(
            nc,
            topology,
            load_process_machines("machines"),
            StaticConfigStore(config),
            source_control=MemorySourceControlProvider(),
            options=OPTIONS,
            observer=Events(),
        )
        for nc in connections
    ]
    try:
        await asyncio.wait_for(asyncio.gather(*(s.start() for s in services)), 90)
        await asyncio.wait_for(asyncio.gather(*(s.crew.queues.warmed() for s in services)), 90)
        yield services
    finally:
        for service in services:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(service.stop(), 30)
        for nc in connections:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 10)


async def admit_a_head_of_each(
    js: JetStreamContext, topology: Topology, config: Mapping[str, Any], queues: list[str]
) -> None:
    """Ingest head ``A`` into each of ``queues`` and wait until every one is admitted."""
    load = await open_pipeline(
        js, topology, load_process_machines("machines"), StaticConfigStore(config)
    )
    ids = [(await load.stages.ingest.ingest(queue, "A")).request_id for queue in queues]

    async def admitted() -> bool:
        states = [(await load.stages.lifecycle.requests.get(rid)).state for rid in ids]
        return states == ["processing"] * len(ids)

    await wait_for(admitted, "a head of every queue admitted", 60)

"""The service rides out a broker restart on the client's reconnects."""

from __future__ import annotations

import asyncio

import pytest
from test_service_support import running_service

from stovepipe_fsm.adapters.jetstream import NatsServer, Topology
from stovepipe_fsm.domain.errors import Retryable

#: Each test starts a broker of its own.
pytestmark = pytest.mark.nats

Q = "monorepo/main"
CONFIG = {"defaults": {"gate_wait_delay_ms": 100}, "queues": {Q: {}}}


async def test_service_keeps_working_across_a_broker_restart(tmp_path) -> None:
    async with NatsServer(tmp_path / "store") as server:
        topology = Topology.isolated("reconnect")
        async with running_service(
            server,
            topology,
            CONFIG,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
        ) as run:
            a = await run.ingest(Q, "A")
            await run.wait_state(a, "processing")
            await asyncio.to_thread(server.restart)
            b = await asyncio.wait_for(_ingest_when_back(run, "B"), 20)
            await run.pipeline.stages.record.complete(a, "succeeded")
            await run.wait_state(b, "processing")
            assert run.service.health.problems() == []
            assert (await run.request(b)).base_uri == "A"


async def _ingest_when_back(run, uri: str) -> str:  # type: ignore[no-untyped-def]
    while True:
        try:
            return await run.ingest(Q, uri)
        except Retryable:  # the client is still reconnecting
            await asyncio.sleep(0.2)

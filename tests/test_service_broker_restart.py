"""A broker restart in the middle of a burst of ingests loses nothing.

The service and the ingesting client ride out the restart on the client's reconnects
(file storage keeps streams and buckets); ingest is retried until the broker is back,
which is safe because every ingest write is repeatable. Afterwards every admitted build
is reported green and the final rows must account for every ingested head.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from nats.js import JetStreamContext
from test_service_scenarios import check_final, settle_everything
from test_service_support import Running, running_service

from stovepipe_fsm.adapters.jetstream import NatsServer, Topology
from stovepipe_fsm.apps.service.operators import status_document
from stovepipe_fsm.domain.errors import Retryable

#: Each test starts a broker of its own.
pytestmark = pytest.mark.nats

QUEUES = ("monorepo/main", "mobile/app", "infra/tools")
CONFIG = {
    "defaults": {"max_concurrent": 1, "gate_wait_delay_ms": 100, "max_attempts": 5},
    "queues": {q: {} for q in QUEUES},
}
RECONNECTING = {"max_reconnect_attempts": -1, "reconnect_time_wait": 0.2}
INGEST_DEADLINE_S = 30.0


@dataclass(frozen=True)
class Broker:
    """The two attributes the scenario helpers read (``js`` and ``topology``)."""

    js: JetStreamContext
    topology: Topology


async def _ingest_until_back(run: Running, queue: str, uri: str, ids: list[str]) -> None:
    """Retry one ingest until the broker answers: every write of ingest is repeatable,
    so an attempt cut off by the restart is finished (or found done) by the next one."""
    deadline = asyncio.get_running_loop().time() + INGEST_DEADLINE_S
    while True:
        try:
            ids.append(await run.ingest(queue, uri))
            return
        except Retryable:  # the broker is down or the client is still reconnecting
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _ingest(run: Running, ids: list[str], numbers: range) -> None:
    """Heads ``c<n>`` round-robin over the queues, so the outage hits several at once."""
    for n in numbers:
        await _ingest_until_back(run, QUEUES[n % len(QUEUES)], f"c{n:03d}", ids)
        await asyncio.sleep(0.005)


async def test_broker_restart_mid_burst_loses_nothing(tmp_path) -> None:
    async with NatsServer(tmp_path / "store") as server:
        topology = Topology.isolated("restart")
        reconnects = 0

        async def reconnected() -> None:
            nonlocal reconnects
            reconnects += 1

        async with running_service(
            server, topology, CONFIG, reconnected_cb=reconnected, **RECONNECTING
        ) as run:
            broker = Broker(run.service.js, topology)
            ids: list[str] = []
            await _ingest(run, ids, range(0, 12))
            first_pid = server.pid
            restart = asyncio.create_task(asyncio.to_thread(server.restart))
            # Ingesting on while the broker goes down and comes back: an ingest in flight
            # when it goes down loses its reply and is retried.
            await _ingest(run, ids, range(12, 30))
            await asyncio.wait_for(restart, 30)
            second_pid = server.pid
            await _ingest(run, ids, range(30, 42))
            doc = await settle_everything(broker, run.pipeline)
            assert run.service.health.problems() == []
            info = await broker.js.stream_info(topology.process_stream)
            events = list(run.events.seen)
            quiet = await status_document(broker.js, topology)

    assert second_pid not in (None, first_pid), "a new broker process served the rest of the burst"
    assert reconnects >= 1, "the service's client reconnected to the restarted broker"
    assert len(ids) == 42 == len(set(ids))
    # Every head ingested is in the store and settled (superseded or validated green),
    # no slot leaked, and the newest head of every queue was validated.
    check_final(doc, ids)
    assert quiet == doc  # nothing moved after the final document: a quiet moment
    assert info.state.messages == 0
    # The outage was ridden out by retries, not by failing requests closed.
    assert not [e for e in events if e[0] == "dead_letter"]

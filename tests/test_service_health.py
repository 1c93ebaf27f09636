"""``/healthz`` follows the broker's answers, ``/readyz`` the queue consumers.

The hung broker is a real nats-server stopped with SIGSTOP: its socket stays open, so
the client still counts as connected, and only a failed round trip can tell.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from nats_server import TOPOLOGY_STREAMS, account_limited_server, unique_tag
from test_service_support import FAST, running_service, wait_for

from stovepipe_fsm.adapters.jetstream import NatsServer, Topology
from stovepipe_fsm.adapters.jetstream.server import free_port
from stovepipe_fsm.apps.service.http import HttpEndpoint

#: Each test starts a broker of its own.
pytestmark = pytest.mark.nats

QUICK_HEALTH = dataclasses.replace(FAST, heartbeat_interval_s=0.5, health_window_s=2.0)
CONFIG = {"defaults": {"max_attempts": 3}, "queues": {"team/app": {}}}


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def get(port: int, path: str) -> tuple[int, str]:
    return await asyncio.to_thread(_get, port, path)


async def test_a_hung_broker_turns_healthz_unhealthy_though_connected(tmp_path: Path) -> None:
    async with NatsServer(tmp_path / "store") as server:
        topology = Topology.isolated("health")
        async with running_service(
            server,
            topology,
            CONFIG,
            options=QUICK_HEALTH,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
        ) as run:
            http = await HttpEndpoint(run.service, free_port()).start()
            try:
                assert await get(http.port, "/healthz") == (200, "ok\n")
                assert await get(http.port, "/readyz") == (200, "ready\n")
                assert server.pid is not None
                os.kill(server.pid, signal.SIGSTOP)
                try:
                    async def unhealthy() -> tuple[int, str] | None:
                        reply = await get(http.port, "/healthz")
                        return reply if reply[0] == 503 else None

                    _, body = await wait_for(unhealthy, "healthz 503", timeout=10.0)
                    # Unhealthy because no round trip came within the health window.
                    age = re.search(r"no JetStream round trip for ([0-9.]+) s", body)
                    assert age is not None, body
                    assert float(age.group(1)) >= QUICK_HEALTH.health_window_s  # shown to 0.1 s
                    assert run.nc.is_connected  # the socket alone says nothing
                    assert (await get(http.port, "/readyz"))[0] == 503
                finally:
                    os.kill(server.pid, signal.SIGCONT)

                async def healthy_again() -> bool:
                    return (await get(http.port, "/healthz"))[0] == 200

                await wait_for(healthy_again, "healthz 200 once the broker answers")
            finally:
                await http.close()


async def test_readyz_names_a_queue_without_a_consumer(tmp_path: Path) -> None:
    queues = {"a/one": {}, "a/two": {}}
    # The account lets each stream hold one consumer and itself no stream more than the
    # topology's: one queue is left without one.
    with account_limited_server(tmp_path, max_consumers=1, max_streams=TOPOLOGY_STREAMS) as server:
        topology = Topology.isolated(unique_tag())
        config = {"defaults": {"max_attempts": 3}, "queues": queues}
        async with running_service(server, topology, config) as run:
            http = await HttpEndpoint(run.service, free_port()).start()
            try:
                assert await get(http.port, "/healthz") == (200, "ok\n")
                status, body = await get(http.port, "/readyz")
                assert status == 503
                # Consumers open concurrently: which queue the limit leaves out varies.
                [left_out] = run.service.crew.queues.refused
                assert body.startswith(f"not ready\n- queue '{left_out}' has no consumer: ")
            finally:
                await http.close()

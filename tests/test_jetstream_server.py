"""The local nats-server process: start, readiness, stop, restart, clear failures."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest
from nats_server import connect

from stovepipe_fsm.adapters.jetstream import (
    NatsServer,
    NatsServerError,
    Topology,
    ensure_topology,
    find_nats_server_binary,
    open_kv_stores,
)
from stovepipe_fsm.domain.entities import Request

#: The broker process itself, started here without the shared fixture.
pytestmark = pytest.mark.nats


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_binary_comes_from_the_installed_package() -> None:
    binary = find_nats_server_binary()
    assert binary.name.startswith("nats-server")
    assert os.access(binary, os.X_OK)


async def test_server_starts_on_loopback_with_jetstream(tmp_path: Path) -> None:
    async with NatsServer(tmp_path / "store") as server:
        assert server.url == f"nats://127.0.0.1:{server.port}"
        assert server.running
        nc = await connect(server)
        try:
            info = await nc.jetstream().account_info()
            assert info.limits.max_streams == -1  # JetStream is enabled and unrestricted
        finally:
            await nc.close()
        assert (tmp_path / "store" / "jetstream").is_dir()
    assert not server.running
    assert not _port_open(server.port)


def test_sync_context_manager_stops_the_process(tmp_path: Path) -> None:
    with NatsServer(tmp_path) as server:
        pid = server.pid
        assert pid is not None and _port_open(server.port)
    assert not server.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_restart_keeps_port_and_store(tmp_path: Path) -> None:
    async with NatsServer(tmp_path) as server:
        port, url = server.port, server.url
        reconnected = asyncio.Event()

        async def on_reconnect() -> None:
            reconnected.set()

        nc = await connect(
            server,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.1,
            reconnected_cb=on_reconnect,
        )
        try:
            topology = Topology.isolated("restart")
            await ensure_topology(nc.jetstream(), topology)
            stores = await open_kv_stores(nc.jetstream(), topology)
            request = Request(
                id="request/monorepo/main/1", queue="monorepo/main", uri="c1", state="accepted"
            )
            await stores.requests.create(request)

            await asyncio.to_thread(server.restart)

            assert (server.port, server.url) == (port, url)
            await asyncio.wait_for(reconnected.wait(), timeout=10)
            assert await stores.requests.get(request.id) == request
            report = await ensure_topology(nc.jetstream(), topology)
            assert report.created_streams == () and report.created_buckets == ()
        finally:
            await nc.close()


def test_busy_port_fails_with_the_servers_own_explanation(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        server = NatsServer(tmp_path, port=port, startup_timeout=5)
        with pytest.raises(NatsServerError, match="address already in use"):
            server.start()
        assert not server.running


def test_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    server = NatsServer(tmp_path, binary=tmp_path / "no-such-nats-server")
    with pytest.raises(NatsServerError, match="cannot run"):
        server.start()


def test_bad_flag_reports_exit_and_log_tail(tmp_path: Path) -> None:
    server = NatsServer(tmp_path, extra_args=["--no-such-flag"], startup_timeout=5)
    with pytest.raises(NatsServerError, match="exited with code"):
        server.start()


def test_url_before_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(NatsServerError, match="not been started"):
        _ = NatsServer(tmp_path).url


def test_stop_is_idempotent_and_closes_the_port(tmp_path: Path) -> None:
    server = NatsServer(tmp_path).start()
    server.stop()
    server.stop()
    assert not server.running
    assert not _port_open(server.port)

"""Idle and slow HTTP clients cannot take the service's connections: past the cap a
connection is closed at once and ``/healthz`` still answers, a request head has a total
read deadline and a header cap, and refusals are logged once per interval.

A bounded load on loopback: a fixed number of connections, each held a fixed time.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from test_service_support import running_service

from stovepipe_fsm.adapters.jetstream import NatsServer, Topology
from stovepipe_fsm.adapters.jetstream.server import free_port
from stovepipe_fsm.apps.service.http import HttpEndpoint, HttpLimits

pytestmark = pytest.mark.nats

CONFIG = {"defaults": {"max_attempts": 3}, "queues": {"team/app": {}}}
CAP = 4
EXTRA = 20


async def _ask(port: int, head: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10.0)
    finally:
        writer.close()


async def _slowloris(port: int, stop: asyncio.Event) -> bytes:
    """Opens a connection, sends a request line and then a header line now and then,
    never the blank line; returns what the server sent before it closed (or b"")."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\n")
        for n in range(50):  # at most 50 rounds of 0.2 s
            if stop.is_set() or reader.at_eof():
                break
            writer.write(f"X-Idle-{n}: 1\r\n".encode())
            await writer.drain()
            with_data = asyncio.ensure_future(reader.read(1024))
            done, _ = await asyncio.wait({with_data}, timeout=0.2)
            if done:
                return with_data.result()
            with_data.cancel()
        return b""
    except (ConnectionError, OSError):
        return b""
    finally:
        writer.close()


async def test_slow_clients_past_the_cap_are_refused_and_healthz_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="stovepipe_fsm.service")
    limits = HttpLimits(max_connections=CAP, read_deadline_s=3.0, refusal_log_interval_s=600)
    async with (
        NatsServer(tmp_path / "store") as server,
        running_service(server, Topology.isolated("limits"), CONFIG) as run,
    ):
        http = await HttpEndpoint(run.service, free_port(), limits=limits).start()
        stop = asyncio.Event()
        try:
            # CAP slow clients take every place; give them time to be accepted.
            holders = [asyncio.ensure_future(_slowloris(http.port, stop)) for _ in range(CAP)]
            for _ in range(100):
                if http.open_connections == CAP:
                    break
                await asyncio.sleep(0.05)
            assert http.open_connections == CAP
            extras = await asyncio.gather(*(_slowloris(http.port, stop) for _ in range(EXTRA)))
            assert extras == [b""] * EXTRA  # closed unanswered
            assert http.refused == EXTRA
            refusals = [r for r in caplog.records if "at its cap" in r.getMessage()]
            assert len(refusals) == 1, [r.getMessage() for r in refusals]
            # The slow holders run out of their read deadline and are dropped;
            # then /healthz is served again.
            assert await asyncio.gather(*holders) == [b""] * CAP
            reply = await _ask(http.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert reply.startswith(b"HTTP/1.1 200 OK") and reply.endswith(b"ok\n")
        finally:
            stop.set()
            await http.close()


async def test_a_head_with_too_many_headers_is_refused(tmp_path: Path) -> None:
    limits = HttpLimits(max_headers=8)
    async with (
        NatsServer(tmp_path / "store") as server,
        running_service(server, Topology.isolated("headers"), CONFIG) as run,
    ):
        http = await HttpEndpoint(run.service, free_port(), limits=limits).start()
        try:
            many = b"".join(f"X-H{n}: 1\r\n".encode() for n in range(9))
            reply = await _ask(http.port, b"GET /healthz HTTP/1.1\r\n" + many + b"\r\n")
            assert reply.startswith(b"HTTP/1.1 431 ")
            few = b"".join(f"X-H{n}: 1\r\n".encode() for n in range(8))
            reply = await _ask(http.port, b"GET /healthz HTTP/1.1\r\n" + few + b"\r\n")
            assert reply.startswith(b"HTTP/1.1 200 OK")
        finally:
            await http.close()



def test_serve_takes_the_connection_cap_and_its_help_states_the_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from stovepipe_fsm.apps.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve", "--http-max-connections", "5"]).http_max_connections == 5
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--http-max-connections", "0"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--help"])
    assert f"(default {HttpLimits().max_connections})" in " ".join(capsys.readouterr().out.split())

"""Connection options: a fail-fast connect must fail, not retry for ever."""

from __future__ import annotations

import asyncio
import socket

import pytest
from nats.errors import NoServersError

from stovepipe_fsm.apps.service.connect import NatsOptions, connect


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_zero_reconnect_attempts_is_sent_as_one_attempt() -> None:
    assert NatsOptions(max_reconnect_attempts=0).kwargs()["max_reconnect_attempts"] == 1
    assert NatsOptions(max_reconnect_attempts=-1).kwargs()["max_reconnect_attempts"] == -1


async def test_fail_fast_connect_to_a_dead_address_gives_up() -> None:
    options = NatsOptions(
        url=f"nats://127.0.0.1:{closed_port()}", max_reconnect_attempts=0, connect_timeout_s=1
    )
    with pytest.raises(NoServersError):
        await asyncio.wait_for(connect(options), timeout=15)

"""Connection options: a fail-fast connect must fail, not retry for ever; the
connection's errors are said once, by whoever explains them."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest
from nats.errors import NoServersError

from stovepipe_fsm.apps.service.connect import ConnectionErrors, NatsOptions, connect
from stovepipe_fsm.apps.service.wakeups import refuses


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


async def test_an_error_no_listener_explains_is_logged_and_an_explained_one_is_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="stovepipe_fsm.service")
    errors = ConnectionErrors()
    heard: list[str] = []

    async def explains_refusals(exc: Exception) -> bool:
        heard.append(str(exc))
        return "violation" in str(exc)

    async def broken(exc: Exception) -> bool:
        raise RuntimeError("a defect in a listener")

    errors.listen(broken)
    errors.listen(explains_refusals)
    await errors.hear(RuntimeError("nats: permissions violation for subscription"))
    await errors.hear(RuntimeError("nats: slow consumer"))
    assert heard == ["nats: permissions violation for subscription", "nats: slow consumer"]
    logged = [r.getMessage() for r in caplog.records]
    assert [m for m in logged if m.startswith("nats: RuntimeError")] == [
        "nats: RuntimeError: nats: slow consumer"
    ]
    assert sum("error listener failed" in m for m in logged) == 2  # the defect is said

    errors.forget(explains_refusals)
    errors.forget(broken)
    await errors.hear(RuntimeError("nats: permissions violation for subscription"))
    assert len(heard) == 2
    assert logged != [r.getMessage() for r in caplog.records]  # now logged: nobody explains


def test_a_refusal_names_its_subject_whole() -> None:
    """The broker quotes the subject (the client lowers the case of the line)."""
    error = RuntimeError(
        'nats: permissions violation for subscription to "$kv.b-service.pause.>" (sid "6")'
    )
    assert refuses(error, "$KV.b-service.pause.>")
    assert not refuses(error, "pause.>")  # a subject the refused one merely contains
    assert not refuses(RuntimeError("nats: permissions violation for publish"), "x.>")

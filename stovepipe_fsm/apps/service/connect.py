"""How the service and the operator commands connect to NATS.

Reconnects are left to nats-py: the client buffers publishes and re-subscribes after a
broker restart or fail-over, and the consumer loops simply see a few failed fetches.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import nats
from nats.aio.client import Client

log = logging.getLogger("stovepipe_fsm.service")

DEFAULT_URL = "nats://127.0.0.1:4222"
URL_ENV = "STOVEPIPE_NATS_URL"


def default_url() -> str:
    return os.environ.get(URL_ENV) or DEFAULT_URL


@dataclass(frozen=True)
class NatsOptions:
    url: str = DEFAULT_URL
    creds: str | None = None
    user: str | None = None
    password: str | None = None
    token: str | None = None
    connect_timeout_s: float = 5.0
    #: -1: keep trying for ever (a service); operator commands pass a small number.
    #: 0 means "fail fast": nats-py reads 0 as unlimited (even for the first connect, and
    #: whatever allow_reconnect says), so it is sent as a single attempt instead.
    max_reconnect_attempts: int = -1
    reconnect_wait_s: float = 1.0

    def kwargs(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "servers": [self.url],
            "connect_timeout": self.connect_timeout_s,
            "max_reconnect_attempts": self.max_reconnect_attempts or 1,
            "reconnect_time_wait": self.reconnect_wait_s,
            # One log line per event instead of the client's default traceback dumps.
            "error_cb": _on_error,
            "disconnected_cb": _on_disconnected,
            "reconnected_cb": _on_reconnected,
        }
        if self.creds:
            options["user_credentials"] = self.creds
        if self.user:
            options["user"] = self.user
        if self.password:
            options["password"] = self.password
        if self.token:
            options["token"] = self.token
        return options


async def connect(options: NatsOptions) -> Client:
    return await nats.connect(**options.kwargs())


async def _on_error(exc: Exception) -> None:
    log.warning("nats: %s: %s", type(exc).__name__, exc)


async def _on_disconnected() -> None:
    log.info("nats: disconnected")


async def _on_reconnected() -> None:
    log.info("nats: reconnected")

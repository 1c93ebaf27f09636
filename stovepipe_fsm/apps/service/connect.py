"""How the service and the operator commands connect to NATS.

Reconnects are left to nats-py: the client buffers publishes and re-subscribes after a
broker restart or fail-over, and the consumer loops simply see a few failed fetches.

``url`` may name several seed servers of one cluster, comma-separated: the first
connection tries them in turn, so any one of them being down does not stop a command,
and the client learns the rest of the cluster from whichever seed answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import nats
from nats.aio.client import Client

from .secrets import redact

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
    #: Path of an nkey seed file (nats-py signs the server's nonce with it).
    nkey_seed: str | None = None
    #: TLS: a CA bundle to verify the server with, a client certificate and key for
    #: servers that require one, and the name to check the server certificate against.
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_hostname: str | None = None
    connect_timeout_s: float = 5.0
    #: Bound on establishing the first connection, retries included. nats-py waits for
    #: ever when a TLS handshake fails on the first connect; this turns that (and a
    #: broker that never comes up) into a clear error.
    first_connect_timeout_s: float = 20.0
    #: -1: keep trying for ever (a service); operator commands pass a small number.
    #: 0 means "fail fast": nats-py reads 0 as unlimited (even for the first connect, and
    #: whatever allow_reconnect says), so it is sent as a single attempt instead.
    max_reconnect_attempts: int = -1
    reconnect_wait_s: float = 1.0

    @property
    def servers(self) -> list[str]:
        """The seed URLs of ``url``; ``ValueError`` for an empty entry."""
        return seed_urls(self.url)

    def kwargs(self, errors: ConnectionErrors | None = None) -> dict[str, Any]:
        """The client's connect arguments; ``errors`` hears the connection's errors."""
        options: dict[str, Any] = {
            "servers": self.servers,
            "connect_timeout": self.connect_timeout_s,
            "max_reconnect_attempts": self.max_reconnect_attempts or 1,
            "reconnect_time_wait": self.reconnect_wait_s,
            # One log line per event instead of the client's default traceback dumps.
            "error_cb": errors.hear if errors is not None else _on_error,
            "disconnected_cb": _on_disconnected,
            "reconnected_cb": _on_reconnected,
        }
        given = {
            "user_credentials": self.creds,
            "user": self.user,
            "password": self.password,
            "token": self.token,
            "nkeys_seed": self.nkey_seed,
            "tls": self.tls_context(),
            "tls_hostname": self.tls_hostname,
        }
        options.update((name, value) for name, value in given.items() if value)
        return options

    def tls_context(self) -> ssl.SSLContext | None:
        """An SSL context when any TLS option is given; ``None`` leaves the client default.

        A ``tls://`` URL without options still uses TLS with the system's trust store.
        Unreadable files raise ``ValueError`` naming the option, before any connect.
        """
        if not (self.tls_ca or self.tls_cert or self.tls_key):
            return None
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        try:
            context = ssl.create_default_context(cafile=self.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--tls-ca {self.tls_ca}: {exc}") from None
        if self.tls_cert and self.tls_key:
            try:
                context.load_cert_chain(self.tls_cert, self.tls_key)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"--tls-cert/--tls-key {self.tls_cert}: {exc}") from None
        return context


def seed_urls(text: str) -> list[str]:
    """``nats://a:4222, nats://b:4222`` as a list; every entry must be non-empty."""
    urls = [part.strip() for part in text.split(",")]
    if not all(urls):
        raise ValueError(f"--nats {text!r}: a comma-separated list of server URLs, none empty")
    return urls


#: Hears one error of the connection; True when it explains it (and said so itself).
ErrorListener = Callable[[Exception], Awaitable[bool]]


class ConnectionErrors:
    """The connection's error callback, for the parts of a process that must react to
    what the broker says outside any call of theirs.

    The broker reports some refusals only on the connection: a subscription that a
    config reload no longer allows is removed by the broker and announced as an error
    line, which no subscribe call returns. Each error is offered to every listener, and
    logged here unless one of them explains it, so that an error is said once.
    """

    def __init__(self) -> None:
        self._listeners: list[ErrorListener] = []

    def listen(self, listener: ErrorListener) -> None:
        self._listeners.append(listener)

    def forget(self, listener: ErrorListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    async def hear(self, exc: Exception) -> None:
        """The callback given to the client (which takes only coroutine functions)."""
        explained = False
        for listener in tuple(self._listeners):
            try:
                explained = await listener(exc) or explained
            except Exception:  # a listener's defect must not hide the error
                log.exception("nats: error listener failed on %s", type(exc).__name__)
        if not explained:
            await _on_error(exc)


async def connect(options: NatsOptions, errors: ConnectionErrors | None = None) -> Client:
    """Connect, or raise ``ConnectionError`` within ``first_connect_timeout_s``;
    ``errors`` hears the connection's errors (by default they are logged)."""
    try:
        return await asyncio.wait_for(
            nats.connect(**options.kwargs(errors)), options.first_connect_timeout_s
        )
    except TimeoutError:
        raise ConnectionError(
            f"no connection to {redact(options.url)} within {options.first_connect_timeout_s:g} s "
            "(broker down, wrong address, or a TLS handshake the server refused)"
        ) from None


@contextlib.asynccontextmanager
async def connected(options: NatsOptions) -> AsyncIterator[Client]:
    """A connection for one operator command, closed when the command is done."""
    nc = await connect(options)
    try:
        yield nc
    finally:
        await nc.close()


async def _on_error(exc: Exception) -> None:
    log.warning("nats: %s: %s", type(exc).__name__, redact(str(exc)))


async def _on_disconnected() -> None:
    log.info("nats: disconnected")


async def _on_reconnected() -> None:
    log.info("nats: reconnected")

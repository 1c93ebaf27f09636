"""Pytest helpers for tests that need a real JetStream broker.

- ``nats_server`` (session): one ``nats-server -js`` on a free loopback port with a
  temporary store directory, stopped when the session ends.
- ``js_env`` (function): a connected client, its JetStream context and a :class:`Topology`
  whose every stream, subject and bucket name is unique to the test, created with
  ``ensure_topology`` and deleted afterwards, so tests share the broker but not state.

Tests that restart or kill a broker start their own :class:`NatsServer` instead of
touching the shared one.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from stovepipe_fsm.adapters.jetstream import NatsServer, Topology, ensure_topology

CONNECT_TIMEOUT_S = 5.0
CLEANUP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class JsEnv:
    server: NatsServer
    nc: Client
    js: JetStreamContext
    topology: Topology


#: Streams an isolated topology holds: its streams and its buckets' streams. An account
#: capped at this many has no room for a partition of the process stream.
TOPOLOGY_STREAMS = len(Topology().stream_names()) + len(Topology().bucket_names())


def unique_tag() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


async def connect(server: NatsServer, **options: Any) -> Client:
    """A client with bounded connect time (tests must never hang on a dead broker).

    At most one reconnect unless asked for, so a broken broker fails a test instead of
    stalling it. (In nats-py 2.16, ``max_reconnect_attempts=0`` means *unlimited* retries,
    even for the initial connect; 1 gives up with ``NoServersError``.)
    """
    options.setdefault("max_reconnect_attempts", 1)
    return await asyncio.wait_for(
        nats.connect(server.url, connect_timeout=CONNECT_TIMEOUT_S, **options),
        timeout=2 * CONNECT_TIMEOUT_S,
    )


async def close(nc: Client) -> None:
    """Close a client, bounded, tolerating a broker that is already gone.

    nats-py's close flushes the socket and raises ``ConnectionResetError`` when the
    broker died first, which is exactly what broker-loss tests arrange.
    """
    with contextlib.suppress(OSError):
        await asyncio.wait_for(nc.close(), timeout=CLEANUP_TIMEOUT_S)


async def delete_topology(js: JetStreamContext, topology: Topology) -> None:
    """Delete every stream and bucket of ``topology`` that exists (best effort, bounded)."""
    buckets = (*topology.bucket_names(), topology.deliveries_bucket)
    streams = (*topology.stream_names(), *(f"KV_{b}" for b in buckets))
    for stream in streams:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(stream)


def isolated_tag(server: NatsServer, letter: str) -> Iterator[str]:
    """A fresh topology tag for a fixture to yield, its streams and buckets deleted after
    (``yield from isolated_tag(nats_server, "c")``)."""
    value = f"{letter}{uuid.uuid4().hex[:10]}"
    yield value

    async def cleanup() -> None:
        nc = await connect(server)
        try:
            await delete_topology(nc.jetstream(), Topology.isolated(value))
        finally:
            await nc.close()

    asyncio.run(cleanup())


ANCHOR_STREAM = "STOVEPIPE_TEST_ANCHOR"


async def _create_anchor(server: NatsServer) -> None:
    nc = await connect(server)
    try:
        await nc.jetstream().add_stream(name=ANCHOR_STREAM, subjects=["stovepipe-test-anchor"])
    finally:
        await close(nc)


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    """The shared broker, with one stream that lives as long as the session.

    Why the anchor stream: when the last stream of an account is deleted, nats-server
    removes the account's store directory, and a stream created in that instant (the
    next test's setup) can fail with "error creating store for stream" (err_code 10049).
    One permanent stream keeps the directory in place.
    """
    # Outside pytest's retained temp trees: the store is removed when the session ends.
    store = Path(tempfile.mkdtemp(prefix="stovepipe-test-nats-"))
    try:
        with NatsServer(store) as server:
            # A thread of its own: this may run while a test's event loop is running.
            with ThreadPoolExecutor(max_workers=1) as pool:
                pool.submit(asyncio.run, _create_anchor(server)).result(
                    timeout=2 * CLEANUP_TIMEOUT_S
                )
            yield server
    finally:
        shutil.rmtree(store, ignore_errors=True)


@pytest.fixture
async def js_env(nats_server: NatsServer) -> AsyncIterator[JsEnv]:
    nc = await connect(nats_server)
    js = nc.jetstream()
    topology = Topology.isolated(unique_tag())
    try:
        await asyncio.wait_for(ensure_topology(js, topology), timeout=CLEANUP_TIMEOUT_S)
        yield JsEnv(server=nats_server, nc=nc, js=js, topology=topology)
    finally:
        try:
            if nc.is_connected:
                await asyncio.wait_for(delete_topology(js, topology), timeout=CLEANUP_TIMEOUT_S)
        finally:
            await close(nc)


def one_account_config(directory: Path, name: str, account: str, user: str) -> Path:
    """A server config, written to ``directory/name``, whose one account (``account``:
    the body of its block) has one user, used by every unauthenticated client (``user``:
    that user's entry, named "only")."""
    path = directory / name
    path.write_text(
        f"accounts {{\n  ONLY {{\n{account}    users [ {user} ]\n  }}\n}}\n"
        'no_auth_user: "only"\n',
        encoding="utf-8",
    )
    return path


def account_limited_config(
    directory: Path, max_consumers: int, max_streams: int | None = None
) -> Path:
    """A server config whose one account, used by every unauthenticated client, may hold
    at most ``max_consumers`` JetStream consumers on each of its streams (the broker
    applies the account's limit per stream), and at most ``max_streams`` streams."""
    streams = f", max_streams: {max_streams}" if max_streams is not None else ""
    account = f"    jetstream {{ max_consumers: {max_consumers}{streams} }}\n"
    return one_account_config(directory, "account-limited.conf", account, '{ user: "only" }')


def subscribe_denied_config(directory: Path, subjects: list[str]) -> Path:
    """A server config whose one user, used by every unauthenticated client, may do
    anything but subscribe to ``subjects``."""
    deny = ", ".join(f'"{subject}"' for subject in subjects)
    user = f'{{ user: "only", permissions: {{ subscribe: {{ deny: [{deny}] }} }} }}'
    return one_account_config(directory, "subscribe-denied.conf", "    jetstream: enabled\n", user)


@contextlib.contextmanager
def configured_server(directory: Path, config: Path) -> Iterator[NatsServer]:
    """A broker of its own, started on ``config``, its store under ``directory``."""
    with NatsServer(directory / "store", extra_args=("-c", str(config))) as server:
        yield server


def subscribe_denied_server(
    directory: Path, subjects: list[str]
) -> contextlib.AbstractContextManager[NatsServer]:
    """A broker of its own whose one user may not subscribe to ``subjects``."""
    return configured_server(directory, subscribe_denied_config(directory, subjects))


def account_limited_server(
    directory: Path, max_consumers: int, max_streams: int | None = None
) -> contextlib.AbstractContextManager[NatsServer]:
    """A broker of its own whose account caps each stream's consumers at
    ``max_consumers`` (and its streams at ``max_streams``)."""
    config = account_limited_config(directory, max_consumers, max_streams)
    return configured_server(directory, config)

"""Helpers shared by the service tests (no tests here): a running service on a test
topology, bounded waits, and readers for the build and dead-letter streams."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats_server import connect

from stovepipe_fsm.adapters.jetstream import NatsServer, Topology
from stovepipe_fsm.adapters.memory import MemorySourceControl, MemorySourceControlProvider
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.service.connect import ConnectionErrors
from stovepipe_fsm.apps.service.service_options import ServiceOptions
from stovepipe_fsm.apps.service.supervisor import Service
from stovepipe_fsm.domain.entities import Queue, Request
from stovepipe_fsm.domain.errors import NotFound
from stovepipe_fsm.process.catalog import ProcessMachines, load_process_machines

WAIT_S = 20.0
FAST = ServiceOptions(
    ack_wait_s=5.0,
    fetch_timeout_s=0.2,
    retry_base_s=0.05,
    retry_cap_s=0.2,
    discover_interval_s=0.2,
    shutdown_timeout_s=5.0,
)
LINEAR = {c: ([chr(ord(c) - 1)] if c > "A" else []) for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"}

_machines: ProcessMachines | None = None


def machines() -> ProcessMachines:
    global _machines
    if _machines is None:
        _machines = load_process_machines("machines")
    return _machines


async def wait_for(check: Callable[[], Awaitable[Any]], what: str, timeout: float = WAIT_S) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


@dataclass
class Events:
    """What the service's observer saw, in order."""

    seen: list[tuple[str, str, str, str]] = field(default_factory=list)

    def __call__(self, event: str, queue: str, request_id: str, detail: str) -> None:
        self.seen.append((event, queue, request_id, detail))

    def count(self, event: str, request_id: str | None = None) -> int:
        return sum(1 for e, _, r, _ in self.seen if e == event and (request_id in (None, r)))


@dataclass
class Running:
    service: Service
    events: Events
    nc: Client

    @property
    def pipeline(self) -> Any:
        return self.service.crew.pipeline

    async def ingest(self, queue: str, uri: str) -> str:
        return (await self.pipeline.stages.ingest.ingest(queue, uri)).request_id

    async def request(self, request_id: str) -> Request:
        return await self.pipeline.stages.lifecycle.requests.get(request_id)

    async def queue(self, name: str) -> Queue:
        return await self.pipeline.stages.lifecycle.queues.get(name)

    async def state(self, request_id: str) -> str:
        try:
            return (await self.request(request_id)).state
        except NotFound:
            return ""

    async def wait_state(self, request_id: str, state: str, timeout: float = WAIT_S) -> None:
        async def check() -> bool:
            return await self.state(request_id) == state

        await wait_for(check, f"{request_id} to become {state}", timeout)


def memory_provider(
    history: Mapping[str, list[str]] | None = None,
) -> tuple[MemorySourceControl, MemorySourceControlProvider]:
    graph = MemorySourceControl(history if history is not None else LINEAR)
    return graph, MemorySourceControlProvider(default=graph)


@contextlib.asynccontextmanager
async def running_service(
    server: NatsServer,
    topology: Topology,
    config: Mapping[str, Any],
    *,
    provider: Any = None,
    options: ServiceOptions = FAST,
    warmed: bool = True,
    policy: ProcessMachines | None = None,
    clock: Any = None,
    **connect_options: Any,
) -> AsyncIterator[Running]:
    """A started service (on ``policy``, the shipped machines by default; ``clock``: the
    replica's own clock, the system's by default); with ``warmed``, once every queue has
    its consumer too (start itself waits only for the queues that can have work)."""
    # Wired as the service command wires it: the connection's errors reach the service.
    errors = ConnectionErrors()
    nc = await connect(server, error_cb=errors.hear, **connect_options)
    events = Events()
    service = Service(
        nc,
        topology,
        policy if policy is not None else machines(),
        StaticConfigStore(config),
        source_control=provider if provider is not None else memory_provider()[1],
        clock=clock,
        options=options,
        observer=events,
        connection_errors=errors,
    )
    try:
        await asyncio.wait_for(service.start(), WAIT_S)
        if warmed and options.warm_up:
            await asyncio.wait_for(service.crew.queues.warmed(), WAIT_S)
        yield Running(service, events, nc)
    finally:
        try:
            await asyncio.wait_for(service.stop(), WAIT_S)
        finally:
            await asyncio.wait_for(nc.close(), WAIT_S)


def untimed(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Request rows as JSON without their times (``*_at_ms``)."""
    return [{k: v for k, v in r.items() if not k.endswith("_at_ms")} for r in requests]


async def stream_messages(
    js: JetStreamContext, stream: str, subject_prefix: str
) -> list[dict[str, Any]]:
    """Every message stored in ``stream`` under ``subject_prefix``, decoded as JSON."""
    info = await js.stream_info(stream)
    out: list[dict[str, Any]] = []
    if info.state.messages == 0:
        return out
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            raw = await js.get_msg(stream, seq)
        except nats.js.errors.NotFoundError:
            continue
        if raw.subject.startswith(subject_prefix):
            out.append(json.loads(raw.data or b"{}"))
    return out

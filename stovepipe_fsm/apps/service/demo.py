"""``stovepipe-fsm demo``: the seed's "Waiting for a slot" walkthrough, live on JetStream.

Everything is real except the build stage: an embedded ``nats-server``, a temporary git
repository with commits A..F (tagged, so the URIs read as letters), the service with its
per-queue consumer and NAK-with-delay holds, and a stand-in build runner that consumes
the build stream and reports each build green a little later. The script only ingests
heads at the moments the walkthrough does and prints what happens as it happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import nats.errors
from nats.js import api

from ...adapters.jetstream import NatsServer, Topology
from ...adapters.jetstream.codec import decode_request, decode_work
from ...process.roles import RequestRoles
from .connect import NatsOptions, connect
from .operators import render_status, status_document
from .policy import PolicyReloader
from .service_options import ServiceOptions
from .supervisor import Service

QUEUE = "monorepo/main"
COMMITS = "ABCDEF"
GATE_WAIT_MS = 300
BUILD_S = 2.0
STEP_TIMEOUT_S = 20.0

Print = Callable[[str], None]


def make_repository(path: Path, commits: str = COMMITS) -> Path:
    """A linear history with one commit per letter, each tagged with its letter."""
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "demo",
        "GIT_AUTHOR_EMAIL": "demo@example.invalid",
        "GIT_COMMITTER_NAME": "demo",
        "GIT_COMMITTER_EMAIL": "demo@example.invalid",
    }

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(path), *args], check=True, env=env, capture_output=True)

    path.mkdir(parents=True, exist_ok=True)
    git("init", "-q")
    for letter in commits:
        git("commit", "-q", "--allow-empty", "-m", letter)
        git("tag", letter)
    return path


def write_config(path: Path, repository: Path) -> Path:
    path.write_text(
        "defaults:\n"
        "  max_concurrent: 1\n"
        f"  gate_wait_delay_ms: {GATE_WAIT_MS}\n"
        "  max_attempts: 5\n"
        "queues:\n"
        f'  "{QUEUE}": {{repository: "{repository}"}}\n',
        encoding="utf-8",
    )
    return path


class Timeline:
    """Prints one line per event, stamped with seconds since the demo began."""

    def __init__(self, out: Print) -> None:
        self.out = out
        self.started = time.monotonic()
        self.uris: dict[str, str] = {}

    def line(self, text: str) -> None:
        self.out(f"  +{time.monotonic() - self.started:5.2f}s  {text}")

    def observe(self, event: str, queue: str, request_id: str, detail: str) -> None:
        if event in ("held", "retry", "dead_letter"):
            uri = self.uris.get(request_id, "?")
            self.line(f"{event:<12} {request_id} ({uri}) {detail}".rstrip())


async def _watch_requests(  # type: ignore[no-untyped-def]
    js, topology: Topology, roles: RequestRoles, timeline: Timeline, stop: asyncio.Event
):
    kv = await js.key_value(topology.requests_bucket)
    watcher = await kv.watchall()
    states: dict[str, str] = {}
    try:
        while not stop.is_set():
            try:
                entry = await watcher.updates(timeout=0.2)
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            if entry is None or not entry.value:
                continue
            request = decode_request(entry.value)
            timeline.uris[request.id] = request.uri
            if states.get(request.id) == request.state or request.state == roles.initial:
                continue  # the ingest line already said it
            states[request.id] = request.state
            extra = ""
            if request.state in roles.admitted_states:
                extra = f" build={request.build_strategy}"
                if request.base_uri:
                    extra += f" since {request.base_uri}"
            timeline.line(f"{request.state:<12} {request.id} ({request.uri}){extra}")
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()


async def _build_runner(service: Service, timeline: Timeline, stop: asyncio.Event):  # type: ignore[no-untyped-def]
    """Stand-in build stage: take each build message, report it green :data:`BUILD_S` later."""
    js, topology = service.js, service.topology
    config = api.ConsumerConfig(
        durable_name="demo-builder",
        ack_policy=api.AckPolicy.EXPLICIT,
        filter_subject=f"{topology.prefix}.build.*",
    )
    await js.add_consumer(topology.build_stream, config=config)
    sub = await js.pull_subscribe_bind(durable="demo-builder", stream=topology.build_stream)
    pending: set[asyncio.Task[None]] = set()

    async def finish(request_id: str) -> None:
        await asyncio.sleep(BUILD_S)
        pipeline = service.crew.pipeline
        green = pipeline.stages.services.roles.green_outcome.name
        await pipeline.stages.record.complete(request_id, green)
        timeline.line(f"{'build green':<12} {request_id} ({timeline.uris.get(request_id, '?')})")

    while not stop.is_set():
        try:
            msgs = await sub.fetch(1, timeout=0.2)
        except (nats.errors.TimeoutError, TimeoutError):
            continue
        for msg in msgs:
            work = decode_work(msg.data)
            await msg.ack()
            timeline.line(f"{'build start':<12} {work.request_id}")
            task = asyncio.ensure_future(finish(work.request_id))
            pending.add(task)
            task.add_done_callback(pending.discard)
    for task in pending:
        task.cancel()


async def run_demo(out: Print = print, *, machines_dir: str = "machines") -> int:
    with tempfile.TemporaryDirectory(prefix="stovepipe-demo-") as tmp:
        root = Path(tmp)
        repository = make_repository(root / "repo")
        config_path = write_config(root / "queues.yaml", repository)
        out(f"queue {QUEUE}: max_concurrent 1, gate_wait_delay_ms {GATE_WAIT_MS}; heads A..F")
        async with NatsServer(root / "nats") as server:
            nc = await connect(NatsOptions(url=server.url, max_reconnect_attempts=0))
            timeline = Timeline(out)
            topology = Topology()
            # As serve does: the reloader hashes the policy the demo runs (status shows it).
            reloader = PolicyReloader.open(machines_dir, config_path)
            machines = reloader.machines
            service = Service(
                nc,
                topology,
                machines,
                reloader.config,
                options=ServiceOptions(fetch_timeout_s=0.2, discover_interval_s=0.5),
                observer=timeline.observe,
                reloader=reloader,
            )
            stop = asyncio.Event()
            try:
                await service.start()
                helpers = [
                    asyncio.ensure_future(
                        _watch_requests(nc.jetstream(), topology, machines.roles, timeline, stop)
                    ),
                    asyncio.ensure_future(_build_runner(service, timeline, stop)),
                ]
                await asyncio.wait_for(_walkthrough(service, timeline), STEP_TIMEOUT_S * 3)
                stop.set()
                await asyncio.wait(helpers, timeout=STEP_TIMEOUT_S)
                doc = await status_document(nc.jetstream(), topology)
            finally:
                stop.set()
                await service.stop()
                await nc.close()
        out("")
        out(render_status(doc))
    return 0


async def _walkthrough(service: Service, timeline: Timeline) -> None:
    pipeline = service.crew.pipeline
    ingest, requests = pipeline.stages.ingest, pipeline.stages.lifecycle.requests
    roles = pipeline.stages.services.roles
    ids: dict[str, str] = {}

    async def put(uri: str) -> None:
        ids[uri] = (await ingest.ingest(QUEUE, uri)).request_id
        timeline.uris[ids[uri]] = uri
        timeline.line(f"{'ingest':<12} {ids[uri]} ({uri})")

    async def until(what: str, check: Callable[[], object]) -> None:
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while not await check():  # type: ignore[misc]
            if time.monotonic() > deadline:
                raise TimeoutError(f"demo step timed out waiting for {what}")
            await asyncio.sleep(0.02)

    async def in_states(uris: str, states: frozenset[str]) -> bool:
        return all([(await requests.get(ids[uri])).state in states for uri in uris])

    admitted, superseded = roles.admitted_states, roles.superseded_states
    green = roles.green_outcome.states
    await put("A")
    await until("A admitted", lambda: in_states("A", admitted))
    for uri in "BCD":
        await put(uri)
    await until("B and C superseded", lambda: in_states("BC", superseded))
    for uri in "EF":
        await put(uri)
    await until("D and E superseded", lambda: in_states("DE", superseded))
    await until("F admitted", lambda: in_states("F", admitted))
    await until("F green", lambda: in_states("F", green))

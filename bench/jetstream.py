"""The process stage on a real broker: throughput, latency, and the cost over a raw floor.

Run from the repository root: ``python -m bench.jetstream`` (``--quick`` for a short run).

It starts one ``nats-server`` on loopback in a temporary directory (stopped at the end),
gives every scenario its own :meth:`Topology.isolated` names on that server, and prints:

1. **heads/s through ingest -> process, with coalescing**: the real :class:`Service` (one
   consumer per queue, ``max_concurrent`` 1), a build stand-in that reports every build
   green through :class:`Record` as soon as it is published (so queues keep moving), and
   heads ingested as fast as the ingest path allows, one queue and then 100 queues. The
   clock stops when every head is acked by its queue (superseded, admitted or terminal);
   afterwards the bench checks that no request is left ``accepted`` and no process
   message is left in the stream.
2. **ingest -> admit latency**: one head at a time on an idle queue (gate open), from the
   ``ingest`` call to the controller's ``publish_build`` call (the request is durably
   ``processing`` and its start announced by then).
3. **our decision rate against a raw floor**: the shipped consumer step
   (``ProcessConsumer.poll_once``: fetch(1), decode, controller, ack, attempts ledger)
   timed per decision on the admit and the supersede path, against a loop written here
   that does only the broker operations the controller's decision needs - the same KV
   gets and compare-and-set writes and the same stream publishes, no decoding, no
   machine - on the same server with the same stream and bucket shapes. A second floor
   adds the two messages our runtime sends besides the decision (the in-progress signal
   before the ancestry check and the attempts-ledger purge), to split "extra round trips"
   from "Python time". A third, **minimal**, does the fewest round trips that keep the
   same guarantees (request and queue row read side by side): the target's reference.
   A fourth, **minimal+json**, is minimal plus the least any implementation does with
   the bytes: it parses the rows it reads, makes the checks the decision rests on, and
   serialises the rows and the start event it writes (stdlib ``json``, plain dicts).
   Broker operations are counted per decision for all of them.
4. **ingest against a raw floor**: single-head ingest against a raw nats-py loop of the
   same minimal sequence, and the batch path (``Ingest.ingest_many``) against 32 such
   loops in flight. ``--sections`` picks the parts to run.

Source control is in memory (every head on one linear history), so git is never in the
loop. Everything, the load included, runs in this one process and event loop: the
figures are for one Python process sharing one core with its own load generator.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import logging
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext, api

from stovepipe_fsm.adapters.jetstream import NatsServer, Topology, ensure_topology
from stovepipe_fsm.adapters.jetstream.codec import (
    UriEntry,
    WorkMessage,
    decode_work,
    encode_queue,
    encode_request,
    encode_uri_entry,
    encode_work,
)
from stovepipe_fsm.adapters.jetstream.consumer import DEFAULT_ACK_WAIT_S, ProcessConsumer
from stovepipe_fsm.adapters.jetstream.names import queue_key, request_key, uri_key
from stovepipe_fsm.adapters.jetstream.publisher import MSG_ID_HEADER
from stovepipe_fsm.adapters.jetstream.shared_inbox import SharedInbox
from stovepipe_fsm.adapters.memory import MemorySourceControl, MemorySourceControlProvider
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.service.broker_pipeline import Pipeline, open_pipeline
from stovepipe_fsm.apps.service.keepalive import KeptAlive
from stovepipe_fsm.apps.service.service_options import ServiceOptions
from stovepipe_fsm.apps.service.supervisor import Service
from stovepipe_fsm.domain.entities import Queue, QueueConfig, Request
from stovepipe_fsm.domain.errors import Retryable, VersionMismatch
from stovepipe_fsm.domain.ids import format_request_id
from stovepipe_fsm.domain.trail_record import INGESTED, TrailRecord, detail
from stovepipe_fsm.pipeline.ingest import Head
from stovepipe_fsm.process.catalog import ProcessMachines, load_process_machines

DECISION_TARGET = 0.9  # ours over the minimal raw decision
INGEST_TARGET = 0.7  # ours over the raw single-ingest loop
BATCH_TARGET = 0.5  # our batch over the raw pipelined loops
GATE_WAIT_MS = 10
HISTORY = 12_000  # commits on the one linear history every head is taken from
STEP_TIMEOUT_S = 60.0  # the longest any one scenario may take before the bench gives up
FETCH_TIMEOUT_S = 0.5


def sha(n: int) -> str:
    """The ``n``-th commit of the linear history, spelled like a full git id."""
    return f"{n:040x}"


def linear_history(length: int = HISTORY) -> MemorySourceControlProvider:
    graph = MemorySourceControl()
    graph.add_commit(sha(0))
    for n in range(1, length):
        graph.add_commit(sha(n), (sha(n - 1),))
    return MemorySourceControlProvider(default=graph)


def bench_config() -> StaticConfigStore:
    return StaticConfigStore(
        QueueConfig.of(max_concurrent=1, gate_wait_delay_ms=GATE_WAIT_MS, max_attempts=5)
    )


# --- counting broker operations ------------------------------------------------------


class OpCounter:
    """Counts what a connection sends, by kind, while ``enabled``.

    nats-py sends every request (KV get, KV write, stream publish, pull request) through
    ``Client.request``/``publish``, and every ack through ``publish``; wrapping those two
    on the instance sees all of it without touching the library.
    """

    def __init__(self, nc: Client) -> None:
        self.counts: Counter[str] = Counter()
        self.enabled = False
        request, publish = nc.request, nc.publish

        async def counted_request(subject: str, *args: Any, **kwargs: Any) -> Any:
            if self.enabled:
                self.counts[_kind(subject, kwargs.get("headers"))] += 1
            return await request(subject, *args, **kwargs)

        async def counted_publish(subject: str, *args: Any, **kwargs: Any) -> None:
            if self.enabled:
                payload = args[0] if args else kwargs.get("payload", b"")
                kind = _ack_kind(subject, payload)
                if kind:  # a request's own publish is counted as the request
                    self.counts[kind] += 1
            await publish(subject, *args, **kwargs)

        nc.request = counted_request  # type: ignore[method-assign]
        nc.publish = counted_publish  # type: ignore[method-assign]

    def per(self, decisions: int) -> dict[str, float]:
        return {k: round(v / decisions, 2) for k, v in sorted(self.counts.items())}


def _kind(subject: str, headers: dict[str, str] | None) -> str:
    if subject.startswith("$JS.API.STREAM.MSG.GET.") or subject.startswith("$JS.API.DIRECT."):
        return "kv_get"
    if subject.startswith("$KV."):
        if headers and headers.get("KV-Operation") == "PURGE":
            return "kv_purge"
        return "kv_write"
    if subject.startswith("$JS.API."):
        return "api_other"
    return "stream_publish"


def _ack_kind(subject: str, payload: bytes) -> str:
    if subject.startswith("$JS.API.CONSUMER.MSG.NEXT."):
        return "pull_request"
    if subject.startswith("$JS.ACK."):
        return {b"": "ack", b"+WPI": "in_progress"}.get(bytes(payload or b""), "nak_or_term")
    return ""


# --- a rig: one isolated topology, the service side and the load side ----------------


@dataclass
class Rig:
    """One scenario's topology with a service connection and a load-side pipeline.

    The load side (ingest, the build stand-in) has its own connection, as the upstream
    stage and the build stage would; it shares the event loop with the service.
    """

    url: str
    tag: str
    machines: ProcessMachines
    topology: Topology = field(init=False)
    service_nc: Client = field(init=False)
    load_nc: Client = field(init=False)
    load: Pipeline = field(init=False)
    source_control: MemorySourceControlProvider = field(init=False)
    #: The service's one wildcard inbox its consumers fetch through.
    inbox: SharedInbox = field(init=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def open(self) -> None:
        self.topology = Topology.isolated(self.tag)
        self.service_nc = await nats.connect(self.url, max_reconnect_attempts=1)
        self.load_nc = await nats.connect(self.url, max_reconnect_attempts=1)
        self.source_control = linear_history()
        self.inbox = SharedInbox(self.service_nc)
        await self.inbox.open()
        self.load = await open_pipeline(
            self.load_nc.jetstream(),
            self.topology,
            self.machines,
            bench_config(),
            source_control=self.source_control,
        )

    async def close(self) -> None:
        self.stop.set()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5.0)
        with contextlib.suppress(Exception):
            await self.inbox.close()
        for nc in (self.service_nc, self.load_nc):
            with contextlib.suppress(Exception):
                await nc.close()

    def spawn(self, coro: Awaitable[None]) -> None:
        self._tasks.append(asyncio.ensure_future(coro))

    async def start_builder(self, on_green: Callable[[str], None]) -> None:
        """Stand-in build stage: every build message is reported green at once."""
        js, topology = self.load_nc.jetstream(), self.topology
        config = api.ConsumerConfig(
            durable_name="bench-builder",
            ack_policy=api.AckPolicy.EXPLICIT,
            filter_subject=f"{topology.prefix}.build.*",
            max_ack_pending=10_000,
        )
        await js.add_consumer(topology.build_stream, config=config)
        sub = await js.pull_subscribe_bind(durable="bench-builder", stream=topology.build_stream)
        self.spawn(self._build_loop(sub, on_green))

    async def _build_loop(
        self, sub: JetStreamContext.PullSubscription, on_green: Callable[[str], None]
    ) -> None:
        pending: set[asyncio.Task[None]] = set()

        async def green(request_id: str) -> None:
            for _ in range(5):  # a bounded retry of a lost compare-and-set race
                try:
                    await self.load.stages.record.complete(request_id, "succeeded")
                    break
                except (Retryable, VersionMismatch):
                    await asyncio.sleep(0.005)
            on_green(request_id)

        while not self.stop.is_set():
            try:
                msgs = await sub.fetch(64, timeout=0.2)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            for msg in msgs:
                await msg.ack()
                task = asyncio.ensure_future(green(decode_work(msg.data).request_id))
                pending.add(task)
                task.add_done_callback(pending.discard)
        if pending:
            await asyncio.wait(pending, timeout=5.0)

    async def ingest(self, queue: str, uri: str) -> str:
        return (await self.load.stages.ingest.ingest(queue, uri)).request_id

    async def start_service(self, queues: list[str], observer: Any) -> Service:
        service = Service(
            self.service_nc,
            self.topology,
            self.machines,
            bench_config(),
            source_control=self.source_control,
            options=ServiceOptions(
                fetch_timeout_s=FETCH_TIMEOUT_S, discover_interval_s=60.0, shutdown_timeout_s=5.0
            ),
            observer=observer,
        )
        await service.start()
        for queue in queues:
            await service.crew.queues.add_queue(queue)
        return service

    async def leftovers(self, request_ids: list[str]) -> tuple[Counter[str], int]:
        """Request states and messages left in the process stream (untimed check)."""
        states: Counter[str] = Counter()
        requests = self.load.stages.lifecycle.requests
        for request_id in request_ids:
            states[(await requests.get(request_id)).state] += 1
        deadline = time.monotonic() + 5.0
        while True:
            info = await self.load_nc.jetstream().stream_info(self.topology.process_stream)
            if info.state.messages == 0 or time.monotonic() > deadline:
                return states, info.state.messages
            await asyncio.sleep(0.05)


async def wait_until(check: Callable[[], bool], what: str, timeout: float = STEP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench gave up waiting for {what}")
        await asyncio.sleep(0.002)


# --- 1. throughput -------------------------------------------------------------------


@dataclass
class Throughput:
    label: str
    heads: int
    queues: int
    ingest_s: float
    settled_s: float
    admitted: int
    superseded: int
    left_in_stream: int

    @property
    def heads_per_s(self) -> float:
        return self.heads / self.settled_s


async def throughput(
    url: str, machines: ProcessMachines, queues: int, per_queue: int
) -> Throughput:
    """Ingest ``per_queue`` heads on each of ``queues`` queues; time until all are decided."""
    rig = Rig(url, f"tput{queues}", machines)
    await rig.open()
    names = [f"bench/q{i:03d}" for i in range(queues)]
    acked: set[str] = set()

    def observe(event: str, queue: str, request_id: str, detail: str) -> None:
        if event == "acked":
            acked.add(request_id)

    service = await rig.start_service(names, observe)
    await rig.start_builder(lambda request_id: None)
    ids: list[str] = []
    try:
        started = time.perf_counter()

        async def feed(queue: str) -> None:
            for n in range(1, per_queue + 1):
                ids.append(await rig.ingest(queue, sha(n)))

        await asyncio.wait_for(asyncio.gather(*(feed(q) for q in names)), STEP_TIMEOUT_S)
        ingested = time.perf_counter()
        await wait_until(lambda: len(acked) >= len(ids), "every head decided")
        settled = time.perf_counter()
        states, left = await rig.leftovers(ids)
    finally:
        await service.stop()
        await rig.close()
    if states.get("accepted"):
        sys.exit(f"bench: {states['accepted']} requests left accepted after the run")
    return Throughput(
        label=f"{queues} queue{'s' if queues > 1 else ''} x {per_queue} heads",
        heads=len(ids),
        queues=queues,
        ingest_s=ingested - started,
        settled_s=settled - started,
        admitted=len(ids) - states["superseded"],
        superseded=states["superseded"],
        left_in_stream=left,
    )


# --- 2. latency ----------------------------------------------------------------------


class StampingPublisher:
    """Delegates to the service's publisher; notes when each build is handed off."""

    def __init__(self, inner: Any, on_build: Callable[[str], None]) -> None:
        self._inner = inner
        self._on_build = on_build

    async def publish_process(self, queue: str, request_id: str, partition: int = 0) -> None:
        await self._inner.publish_process(queue, request_id, partition)

    async def publish_hook(self, event: Any) -> None:
        await self._inner.publish_hook(event)

    async def publish_build(self, queue: str, request_id: str) -> None:
        self._on_build(request_id)
        await self._inner.publish_build(queue, request_id)


@dataclass
class Latency:
    samples: list[float]  # milliseconds
    ingest_ms: list[float]

    def pct(self, q: float, values: list[float] | None = None) -> float:
        ordered = sorted(self.samples if values is None else values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(url: str, machines: ProcessMachines, samples: int) -> Latency:
    rig = Rig(url, "latency", machines)
    await rig.open()
    queue = "bench/latency"
    admitted: dict[str, float] = {}
    green: set[str] = set()
    service = await rig.start_service([queue], lambda *args: None)
    controller = service.crew.pipeline.stages.controller
    stamping = StampingPublisher(
        controller.services.publisher,
        lambda request_id: admitted.setdefault(request_id, time.perf_counter()),
    )
    controller.services = replace(controller.services, publisher=stamping)
    await rig.start_builder(green.add)
    result = Latency([], [])
    try:
        for n in range(1, samples + 1):
            started = time.perf_counter()
            request_id = await rig.ingest(queue, sha(n))
            result.ingest_ms.append((time.perf_counter() - started) * 1000.0)
            await wait_until(lambda rid=request_id: rid in green, f"{request_id} green", 10.0)
            result.samples.append((admitted[request_id] - started) * 1000.0)
    finally:
        await service.stop()
        await rig.close()
    return result


# --- 3. decision rate: ours and the floor --------------------------------------------


@dataclass
class Rate:
    label: str
    decisions: int
    seconds: float
    ops: dict[str, float]
    #: Processor time of the bench's own process in the timed spans (the broker runs in
    #: another process): the Python side of a decision, apart from waiting on the broker.
    cpu_seconds: float = 0.0

    @property
    def per_s(self) -> float:
        return self.decisions / self.seconds

    @property
    def cpu_us(self) -> float:
        """Processor microseconds per decision on the bench's side."""
        return self.cpu_seconds / self.decisions * 1e6


class Spans:
    """Wall and processor time summed over timed spans, the setup between them left out."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self._wall = self._cpu = 0.0

    def start(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def stop(self) -> None:
        self.seconds += time.perf_counter() - self._wall
        self.cpu_seconds += time.process_time() - self._cpu

    def rate(self, label: str, decisions: int, ops: dict[str, float]) -> Rate:
        return Rate(label, decisions, self.seconds, ops, self.cpu_seconds)


async def ours_admit(rig: Rig, counter: OpCounter, n: int, offset: int) -> Rate:
    """``n`` admits through the shipped consumer step; ingest and green untimed."""
    queue = f"bench/admit{offset}"
    consumer = await _consumer(rig, queue)
    spans = Spans()
    record = rig.load.stages.record
    try:
        for i in range(n + 1):
            request_id = await rig.ingest(queue, sha(offset + i + 1))
            counter.enabled = i > 0  # the first admit has no last green: not the path
            if i > 0:
                spans.start()
            settled = await consumer.poll_once()
            if i > 0:
                spans.stop()
            counter.enabled = False
            assert settled, "the head was not delivered"
            await record.complete(request_id, "succeeded")
    finally:
        await consumer.close()
    return spans.rate("ours", n, counter.per(n))


async def ours_supersede(rig: Rig, counter: OpCounter, n: int, offset: int) -> Rate:
    """``n`` supersedes: a backlog of ``n + 1`` heads drained by the shipped consumer."""
    queue = f"bench/supersede{offset}"
    for i in range(n + 1):
        await rig.ingest(queue, sha(offset + i + 1))
    consumer = await _consumer(rig, queue)
    spans = Spans()
    try:
        counter.enabled = True
        spans.start()
        for _ in range(n):
            assert await consumer.poll_once(), "a head was not delivered"
        spans.stop()
        counter.enabled = False
        assert await consumer.poll_once()  # the newest head: admitted, not timed
    finally:
        await consumer.close()
    return spans.rate("ours", n, counter.per(n))


async def _consumer(rig: Rig, queue: str) -> ProcessConsumer:
    """The service's consumer for ``queue``, on the service connection, driven by hand:
    built as the service builds it (fetching through the shared inbox, its deliveries'
    ack deadlines kept ahead by the heartbeat)."""
    js = rig.service_nc.jetstream()
    pipeline = await open_pipeline(
        js, rig.topology, rig.machines, bench_config(), source_control=rig.source_control
    )
    consumer = ProcessConsumer(
        js,
        rig.topology,
        queue,
        handler=KeptAlive(pipeline.stages.controller, DEFAULT_ACK_WAIT_S),
        inbox=rig.inbox,
        config=bench_config(),
        ledger=pipeline.ledger,
        terminations=pipeline.terminations,
        fetch_timeout_s=FETCH_TIMEOUT_S,
    )
    await consumer.open()
    return consumer


def _json_bytes(value: dict[str, Any]) -> bytes:
    """Compact JSON with sorted keys, as the stage writes its values."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


class Floor:
    """The broker operations of one decision, with nothing else around them.

    It runs on its own isolated topology (same stream and bucket shapes as ours) and
    stores values of the size ours stores, but never decodes them: it knows the answer.
    """

    def __init__(self, rig: Rig, queue: str, extras: bool) -> None:
        self.rig = rig
        self.queue = queue
        self.extras = extras
        self.js = rig.service_nc.jetstream()
        self.topology = rig.topology
        self.qkey = queue_key(queue)
        row = Queue(queue, last_green_uri=sha(1), latest_request_id=format_request_id(queue, 1))
        self.row = row
        self.queue_value = encode_queue(row)
        self.held_value = encode_queue(row.with_holder(format_request_id(queue, 1)))

    async def open(self, durable: str) -> None:
        t = self.topology
        self.requests = await self.js.key_value(t.requests_bucket)
        self.queues = await self.js.key_value(t.queues_bucket)
        self.attempts = await self.js.key_value(t.attempts_bucket)
        await self.queues.create(self.qkey, self.queue_value)
        config = api.ConsumerConfig(
            durable_name=durable,
            filter_subject=t.process_subject(self.queue),
            ack_policy=api.AckPolicy.EXPLICIT,
            max_ack_pending=1,
            max_deliver=-1,
            ack_wait=30.0,
        )
        await self.js.add_consumer(t.process_stream, config=config)
        self.sub = await self.js.pull_subscribe_bind(durable=durable, stream=t.process_stream)

    async def stage(self, i: int) -> str:
        """Untimed setup of one decision: the request row and its process message.

        Rows are written the way ours are (create, conditional update), because nats-py
        pays for parsing the headers such a write leaves on every later read of the row.
        """
        request_id = format_request_id(self.queue, i)
        request = Request(id=request_id, queue=self.queue, uri=sha(i), state="accepted")
        await self.requests.create(request_key(request_id), encode_request(request))
        await self.js.publish(
            self.topology.process_subject(self.queue),
            json.dumps({"queue": self.queue, "request_id": request_id}).encode(),
            stream=self.topology.process_stream,
            headers={MSG_ID_HEADER: request_id},
        )
        return request_id

    async def free_slot(self, latest: str = "") -> None:
        """Untimed: what a green leaves on the queue row, written as a conditional update
        (with ``latest``, the row stamps that request as the newest head)."""
        value = self.queue_value
        if latest:
            value = encode_queue(replace(self.row, latest_request_id=latest))
        entry = await self.queues.get(self.qkey)
        await self.queues.update(self.qkey, value, last=entry.revision)

    async def admit(self, request_id: str) -> None:
        qkey, rkey = self.qkey, request_key(request_id)
        msg = (await self.sub.fetch(1, timeout=FETCH_TIMEOUT_S))[0]
        entry = await self.requests.get(rkey)  # load request
        await self.queues.get(qkey)  # load queue
        if self.extras:
            await msg.in_progress()  # before the ancestry check
        held = await self.queues.get(qkey)  # claim slot: read, then conditional write
        await self.queues.update(qkey, self.held_value, last=held.revision)
        entry = await self.requests.get(rkey)  # mark processing: read, conditional write
        await self.requests.update(rkey, entry.value or b"", last=entry.revision)
        await self._start_and_build(request_id, entry.value or b"", msg.data)
        await msg.ack()
        if self.extras:
            await self.attempts.purge(f"process.{msg.metadata.sequence.stream}")

    async def _start_and_build(self, request_id: str, row: bytes, work: bytes) -> None:
        """The start event, then the build message (each deduplicated by its id)."""
        js, t = self.js, self.topology
        await js.publish(
            t.hook_subject("validation.repository.started"),
            row,
            stream=t.hooks_stream,
            headers={MSG_ID_HEADER: f"started-{request_id}"},
        )
        await js.publish(
            t.build_subject(self.queue),
            work,
            stream=t.build_stream,
            headers={MSG_ID_HEADER: request_id},
        )

    async def admit_minimal(self, request_id: str) -> None:
        """The fewest round trips an admit needs for the same guarantees.

        Request and queue row read side by side; the slot claim before the request's
        admit write (a processing request always holds a slot), each a compare-and-set on
        the revision just read; the start event before the build; the trail note; ack.
        """
        qkey, rkey = self.qkey, request_key(request_id)
        msg = (await self.sub.fetch(1, timeout=FETCH_TIMEOUT_S))[0]
        entry, held = await asyncio.gather(self.requests.get(rkey), self.queues.get(qkey))
        await self.queues.update(qkey, self.held_value, last=held.revision)
        await self.requests.update(rkey, entry.value or b"", last=entry.revision)
        await self._start_and_build(request_id, entry.value or b"", msg.data)
        await self._note(request_id, "admitted")
        await msg.ack()

    async def admit_decoding(self, request_id: str) -> None:
        """:meth:`admit_minimal` plus the codec work of a real decision: both rows
        parsed, the admit checked on them (accepted, the newest head, a slot free), the
        claimed queue row, the processing request and the start event serialised."""
        qkey, rkey = self.qkey, request_key(request_id)
        msg = (await self.sub.fetch(1, timeout=FETCH_TIMEOUT_S))[0]
        work = json.loads(msg.data)
        entry, held = await asyncio.gather(self.requests.get(rkey), self.queues.get(qkey))
        request, queue = json.loads(entry.value or b""), json.loads(held.value or b"")
        admissible = (
            request["state"] == "accepted"
            and queue["latest_request_id"] == work["request_id"]
            and len(queue["slot_holders"]) < 1
        )
        assert admissible, "the floor's rows admit every head"
        queue["slot_holders"] = [request_id]
        queue["version"] += 1
        await self.queues.update(qkey, _json_bytes(queue), last=held.revision)
        request.update(
            state="processing",
            build_strategy="incremental",
            base_uri=queue["last_green_uri"],
            version=request["version"] + 1,
        )
        await self.requests.update(rkey, _json_bytes(request), last=entry.revision)
        event = {
            "id": f"started-{request_id}",
            "type": "validation.repository.started",
            "payload": {"queue": self.queue, "request_id": request_id},
            "timestamp_ms": 0,
        }
        await self._start_and_build(request_id, _json_bytes(event), msg.data)
        await self._note(request_id, "admitted")
        await msg.ack()

    async def supersede_decoding(self, request_id: str) -> None:
        """:meth:`supersede_minimal` plus the codec work of a real decision: both rows
        parsed, a newer head found on the queue row, the superseded request serialised."""
        qkey, rkey = self.qkey, request_key(request_id)
        msg = (await self.sub.fetch(1, timeout=FETCH_TIMEOUT_S))[0]
        work = json.loads(msg.data)
        entry, held = await asyncio.gather(self.requests.get(rkey), self.queues.get(qkey))
        request, queue = json.loads(entry.value or b""), json.loads(held.value or b"")
        latest = queue["latest_request_id"]
        newer = int(latest.rpartition("/")[2]) > int(work["request_id"].rpartition("/")[2])
        assert newer and request["state"] == "accepted", "the floor's rows supersede"
        request.update(state="superseded", superseded_by=latest, version=request["version"] + 1)
        await self.requests.update(rkey, _json_bytes(request), last=entry.revision)
        await self._note(request_id, "superseded")
        await msg.ack()

    async def supersede_minimal(self, request_id: str) -> None:
        """The fewest round trips a supersede needs: request and queue row side by side,
        the request's conditional write, the trail note, ack."""
        qkey, rkey = self.qkey, request_key(request_id)
        msg = (await self.sub.fetch(1, timeout=FETCH_TIMEOUT_S))[0]
        entry, _ = await asyncio.gather(self.requests.get(rkey), self.queues.get(qkey))
        await self.requests.update(rkey, entry.value or b"", last=entry.revision)
        await self._note(request_id, "superseded")
        await msg.ack()

    async def _note(self, request_id: str, kind: str) -> None:
        record = TrailRecord(kind, self.queue, request_id, 1, detail=detail(by="x" * 40))
        payload = _json_bytes(record.as_json())
        await self.js.publish(
            self.topology.trail_subject(request_id, kind),
            payload,
            stream=self.topology.trail_stream,
            headers={MSG_ID_HEADER: record.key},
        )

    async def supersede(self, request_id: str) -> None:
        qkey, rkey = self.qkey, request_key(request_id)
        msg = (await self.sub.fetch(1, timeout=FETCH_TIMEOUT_S))[0]
        await self.requests.get(rkey)  # load request
        await self.queues.get(qkey)  # load queue
        entry = await self.requests.get(rkey)  # mark superseded: read, conditional write
        await self.requests.update(rkey, entry.value or b"", last=entry.revision)
        await self.queues.get(qkey)  # the slot check of every terminal write
        await msg.ack()
        if self.extras:
            await self.attempts.purge(f"process.{msg.metadata.sequence.stream}")


MINIMAL, DECODING = "minimal", "minimal+json"
_TAGS = {"": "", MINIMAL: "m", DECODING: "j"}  # each variant's own queue and consumer


async def floor_admit(
    rig: Rig, counter: OpCounter, n: int, offset: int, extras: bool, minimal: str = ""
) -> Rate:
    tag = _TAGS[minimal]
    floor = Floor(rig, f"floor/admit{offset}{tag}", extras)
    await floor.open(f"floor-admit-{offset}{tag}")
    decide = {"": floor.admit, MINIMAL: floor.admit_minimal, DECODING: floor.admit_decoding}[
        minimal
    ]
    spans = Spans()
    for i in range(1, n + 1):
        request_id = await floor.stage(i)
        await floor.free_slot(latest=request_id if minimal == DECODING else "")
        counter.enabled = True
        spans.start()
        await decide(request_id)
        spans.stop()
        counter.enabled = False
    label = minimal or ("floor+runtime" if extras else "floor")
    return spans.rate(label, n, counter.per(n))


async def floor_supersede(
    rig: Rig, counter: OpCounter, n: int, offset: int, extras: bool, minimal: str = ""
) -> Rate:
    tag = _TAGS[minimal]
    floor = Floor(rig, f"floor/supersede{offset}{tag}", extras)
    await floor.open(f"floor-supersede-{offset}{tag}")
    decide = {
        "": floor.supersede,
        MINIMAL: floor.supersede_minimal,
        DECODING: floor.supersede_decoding,
    }[minimal]
    ids = [await floor.stage(i) for i in range(1, n + 1)]
    if minimal == DECODING:
        await floor.free_slot(latest=format_request_id(floor.queue, n + 1))
    spans = Spans()
    counter.enabled = True
    spans.start()
    for request_id in ids:
        await decide(request_id)
    spans.stop()
    counter.enabled = False
    label = minimal or ("floor+runtime" if extras else "floor")
    return spans.rate(label, n, counter.per(n))


@dataclass
class PathResult:
    path: str
    rounds: dict[str, list[Rate]]

    def best(self, label: str) -> Rate:
        return max(self.rounds[label], key=lambda r: r.per_s)

    def paired(self, label: str) -> float:
        """Median over rounds of ours/label, rounds run back to back."""
        return statistics.median(self.per_round(label))

    def per_round(self, label: str) -> list[float]:
        """ours/label of each round: their spread says what one ratio is worth."""
        pairs = zip(self.rounds["ours"], self.rounds[label], strict=True)
        return [o.per_s / f.per_s for o, f in pairs]


async def decision_rates(
    url: str, machines: ProcessMachines, n: int, rounds: int
) -> list[PathResult]:
    """Ours, floor, floor+runtime, minimal and minimal+json, interleaved round by round on
    each path; every other round runs them in the reverse order, so that no variant
    always runs first on a fresh server or last on a grown one."""
    rig = Rig(url, "rates", machines)
    await rig.open()
    await ensure_topology(rig.service_nc.jetstream(), rig.topology)
    counter = OpCounter(rig.service_nc)
    results = [PathResult("admit", {}), PathResult("supersede", {})]
    try:
        for r in range(rounds):
            offset = r * (n + 2) * 2
            runs: list[tuple[PathResult, str, Awaitable[Rate]]] = [
                (results[0], "ours", ours_admit(rig, counter, n, offset)),
                (results[0], "floor", floor_admit(rig, counter, n, offset, False)),
                (results[0], "floor+runtime", floor_admit(rig, counter, n, offset + 1, True)),
                (results[0], MINIMAL, floor_admit(rig, counter, n, offset, False, MINIMAL)),
                (results[0], DECODING, floor_admit(rig, counter, n, offset, False, DECODING)),
                (results[1], "ours", ours_supersede(rig, counter, n, offset + n + 2)),
                (results[1], "floor", floor_supersede(rig, counter, n, offset, False)),
                (results[1], "floor+runtime", floor_supersede(rig, counter, n, offset + 1, True)),
                (results[1], MINIMAL, floor_supersede(rig, counter, n, offset, False, MINIMAL)),
                (
                    results[1],
                    DECODING,
                    floor_supersede(rig, counter, n, offset, False, DECODING),
                ),
            ]
            if r % 2:
                runs.reverse()
            for result, label, run in runs:
                counter.counts.clear()
                rate = await asyncio.wait_for(run, STEP_TIMEOUT_S)
                result.rounds.setdefault(label, []).append(rate)
    finally:
        await rig.close()
    return results


# --- 4. ingest: ours against a raw loop of the same minimal sequence ------------------

INGEST_WINDOW = 32  # heads in flight on the raw pipelined floor


@dataclass
class IngestRates:
    single_ours: Rate
    single_floor: Rate
    batch_ours: Rate
    batch_floor: Rate


class IngestFloor:
    """The broker operations of one ingest of a new head, raw, with nothing around them.

    The minimal sequence that keeps ingest's guarantees: mint from the queue's counter (a
    conditional write on the revision this loop wrote last) beside the queue-row read;
    claim (queue, uri) with a create; create the request, move latest forward on the row's
    revision and publish the trail's ingested record side by side; publish the process
    message. Values are encoded the way ours are; nothing is decoded.
    """

    def __init__(self, rig: Rig) -> None:
        self.js = rig.load_nc.jetstream()
        self.topology = rig.topology

    async def open(self) -> None:
        t = self.topology
        self.counters = await self.js.key_value(t.counters_bucket)
        self.uris = await self.js.key_value(t.uris_bucket)
        self.requests = await self.js.key_value(t.requests_bucket)
        self.queues = await self.js.key_value(t.queues_bucket)
        self.counter_revision: dict[str, int] = {}
        self.counter_value: dict[str, int] = {}

    async def prepare(self, queue: str) -> None:
        """Untimed: the queue's counter and row exist, as after its first head."""
        key = queue_key(queue)
        self.counter_revision[queue] = await self.counters.create(key, b"0")
        self.counter_value[queue] = 0
        await self.queues.create(key, encode_queue(Queue(queue)))

    async def ingest(self, queue: str, uri: str) -> None:
        t, key = self.topology, queue_key(queue)
        value = self.counter_value[queue] + 1
        revision, row = await asyncio.gather(
            self.counters.update(
                key, str(value).encode(), last=self.counter_revision[queue]
            ),
            self.queues.get(key),
        )
        self.counter_value[queue], self.counter_revision[queue] = value, revision
        request_id = format_request_id(queue, value)
        await self.uris.create(
            uri_key(queue, uri), encode_uri_entry(UriEntry(queue, uri, request_id))
        )
        request = Request(id=request_id, queue=queue, uri=uri, state="accepted")
        latest = encode_queue(Queue(queue, latest_request_id=request_id))
        await asyncio.gather(
            self.requests.create(request_key(request_id), encode_request(request)),
            self.queues.update(key, latest, last=row.revision),
            self._note(queue, request_id, uri),
        )
        await self.js.publish(
            t.process_subject(queue),
            encode_work(WorkMessage(queue=queue, request_id=request_id)),
            stream=t.process_stream,
            headers={MSG_ID_HEADER: request_id},
        )

    async def _note(self, queue: str, request_id: str, uri: str) -> None:
        record = TrailRecord(INGESTED, queue, request_id, 1, detail=detail(uri=uri))
        payload = _json_bytes(record.as_json())
        await self.js.publish(
            self.topology.trail_subject(request_id, INGESTED),
            payload,
            stream=self.topology.trail_stream,
            headers={MSG_ID_HEADER: record.key},
        )


async def ingest_rates(url: str, machines: ProcessMachines, n: int, queues: int) -> IngestRates:
    """Single-head ingest and the batch path, each beside its raw floor, in one run."""
    rig = Rig(url, "ingest", machines)
    await rig.open()
    await ensure_topology(rig.load_nc.jetstream(), rig.topology)
    counter = OpCounter(rig.load_nc)
    ingest = rig.load.stages.ingest
    floor = IngestFloor(rig)
    await floor.open()
    try:
        # single, one head after another on one queue (the first head of each untimed)
        await ingest.ingest("ingest/ours", sha(0))
        counter.enabled = True
        started = time.perf_counter()
        for i in range(1, n + 1):
            await ingest.ingest("ingest/ours", sha(i))
        single_ours = Rate("ours", n, time.perf_counter() - started, counter.per(n))
        counter.enabled = False
        counter.counts.clear()
        await floor.prepare("ingest/floor")
        counter.enabled = True
        started = time.perf_counter()
        for i in range(1, n + 1):
            await floor.ingest("ingest/floor", sha(i))
        single_floor = Rate("floor", n, time.perf_counter() - started, counter.per(n))
        counter.enabled = False
        counter.counts.clear()
        # batch: n heads over ``queues`` queues in one call, against 32 raw loops
        names = [f"ingest/batch{i:02d}" for i in range(queues)]
        heads = [Head(names[i % queues], sha(n + i)) for i in range(n)]
        for name in names:
            await ingest.ingest(name, sha(0))
        counter.enabled = True
        started = time.perf_counter()
        await ingest.ingest_many(heads)
        batch_ours = Rate("ours", n, time.perf_counter() - started, counter.per(n))
        counter.enabled = False
        counter.counts.clear()
        lanes = [f"ingest/lane{i:02d}" for i in range(INGEST_WINDOW)]
        for lane in lanes:
            await floor.prepare(lane)

        async def lane_loop(lane: int) -> None:
            for i in range(lane, n, INGEST_WINDOW):
                await floor.ingest(lanes[lane], sha(n + i))

        counter.enabled = True
        started = time.perf_counter()
        await asyncio.gather(*(lane_loop(i) for i in range(INGEST_WINDOW)))
        batch_floor = Rate("floor", n, time.perf_counter() - started, counter.per(n))
        counter.enabled = False
    finally:
        await rig.close()
    return IngestRates(single_ours, single_floor, batch_ours, batch_floor)


# --- report --------------------------------------------------------------------------


def report_ingest(rates: IngestRates) -> dict[str, Any]:
    print("\n4. ingest of new heads against a raw nats-py loop of the same minimal sequence")
    print(f"   {'path':<8} {'ours/s':>8} {'floor/s':>8} {'ours/floor':>11} {'target':>7}")
    summary: dict[str, Any] = {}
    for path, ours, floor, target in (
        ("single", rates.single_ours, rates.single_floor, INGEST_TARGET),
        ("batch", rates.batch_ours, rates.batch_floor, BATCH_TARGET),
    ):
        ratio = ours.per_s / floor.per_s
        print(
            f"   {path:<8} {ours.per_s:>8,.0f} {floor.per_s:>8,.0f} {ratio:>11.2f} {target:>7.1f}"
        )
        summary[path] = {
            "ours_per_s": round(ours.per_s),
            "floor_per_s": round(floor.per_s),
            "ours_over_floor": round(ratio, 3),
            "target": target,
            "ops_ours": ours.ops,
            "ops_floor": floor.ops,
        }
    print("\n   broker operations per head (counted on the connection):")
    for path, ours, floor in (
        ("single", rates.single_ours, rates.single_floor),
        ("batch", rates.batch_ours, rates.batch_floor),
    ):
        for label, rate in (("ours", ours), ("floor", floor)):
            ops = ", ".join(f"{k} {v:g}" for k, v in rate.ops.items())
            print(f"   {path:<8} {label:<6} {ops}")
    return summary


def report(
    tputs: list[Throughput],
    lat: Latency | None,
    paths: list[PathResult],
    ingest: IngestRates | None,
    elapsed: float,
) -> dict[str, Any]:
    print(
        f"\n1. heads/s, ingest -> process with coalescing (max_concurrent 1, "
        f"gate_wait_delay_ms {GATE_WAIT_MS}, builds green at once, in-memory ancestry)"
    )
    print(
        f"   {'workload':<22} {'heads':>6} {'ingest s':>9} {'settled s':>10} {'heads/s':>8} "
        f"{'ingest/s':>9} {'admitted':>9} {'superseded':>11}"
    )
    for t in tputs:
        print(
            f"   {t.label:<22} {t.heads:>6} {t.ingest_s:>9.2f} {t.settled_s:>10.2f} "
            f"{t.heads_per_s:>8,.0f} {t.heads / t.ingest_s:>9,.0f} {t.admitted:>9} "
            f"{t.superseded:>11}"
        )
    if lat is not None:
        print(f"\n2. ingest -> admit latency, idle queue, gate open ({len(lat.samples)} samples)")
        print(
            f"   ingest call -> publish_build: p50 {lat.pct(0.5):.2f}  p99 {lat.pct(0.99):.2f}  "
            f"max {max(lat.samples):.2f} ms"
        )
        print(
            f"   of which the ingest call:     p50 {lat.pct(0.5, lat.ingest_ms):.2f}  "
            f"p99 {lat.pct(0.99, lat.ingest_ms):.2f} ms"
        )
    summary: dict[str, Any] = {}
    if paths:
        summary = report_decisions(paths)
    ingest_summary = report_ingest(ingest) if ingest is not None else {}
    print(f"\nwhole run {elapsed:.0f} s (shared machine)")
    return {
        "throughput": [
            {
                "workload": t.label,
                "heads": t.heads,
                "heads_per_s": round(t.heads_per_s),
                "ingest_per_s": round(t.heads / t.ingest_s),
                "admitted": t.admitted,
                "superseded": t.superseded,
                "left_in_process_stream": t.left_in_stream,
            }
            for t in tputs
        ],
        "latency_ms": {}
        if lat is None
        else {
            "samples": len(lat.samples),
            "p50": round(lat.pct(0.5), 3),
            "p99": round(lat.pct(0.99), 3),
            "ingest_p50": round(lat.pct(0.5, lat.ingest_ms), 3),
        },
        "decisions": summary,
        "ingest": ingest_summary,
        "seconds": round(elapsed, 1),
    }


def report_decisions(paths: list[PathResult]) -> dict[str, Any]:
    print("\n3. decisions/s of one queue's consumer step against raw floors (best round)")
    print(
        f"   {'path':<10} {'ours/s':>8} {'min/s':>8} {'ours/min':>9} {'paired':>7} "
        f"{'min+json/s':>11} {'ours/min+json':>14} {'paired':>7} "
        f"{'floor/s':>8} {'ours/floor':>11} {'fl+rt/s':>8} {'ours/fl+rt':>11}"
    )
    summary: dict[str, Any] = {}
    for p in paths:
        ours, floor, extra = p.best("ours"), p.best("floor"), p.best("floor+runtime")
        minimal, decoding = p.best(MINIMAL), p.best(DECODING)
        ratio = ours.per_s / minimal.per_s
        print(
            f"   {p.path:<10} {ours.per_s:>8,.0f} {minimal.per_s:>8,.0f} {ratio:>9.2f} "
            f"{p.paired(MINIMAL):>7.2f} {decoding.per_s:>11,.0f} "
            f"{ours.per_s / decoding.per_s:>14.2f} {p.paired(DECODING):>7.2f} "
            f"{floor.per_s:>8,.0f} {ours.per_s / floor.per_s:>11.2f} "
            f"{extra.per_s:>8,.0f} {ours.per_s / extra.per_s:>11.2f}"
        )
        summary[p.path] = {
            "ours_per_s": round(ours.per_s),
            "minimal_per_s": round(minimal.per_s),
            "ours_over_minimal": round(ratio, 3),
            "ours_over_minimal_paired_median": round(p.paired(MINIMAL), 3),
            "minimal_json_per_s": round(decoding.per_s),
            "ours_over_minimal_json": round(ours.per_s / decoding.per_s, 3),
            "ours_over_minimal_json_paired_median": round(p.paired(DECODING), 3),
            "floor_per_s": round(floor.per_s),
            "floor_runtime_per_s": round(extra.per_s),
            "ours_over_floor": round(ours.per_s / floor.per_s, 3),
            "ours_over_floor_runtime": round(ours.per_s / extra.per_s, 3),
            "ops_ours": ours.ops,
            "ops_minimal": minimal.ops,
        }
    print("\n   ours over each floor, round by round (lowest - highest, median):")
    for p in paths:
        spreads = []
        for label in (MINIMAL, DECODING):
            ratios = p.per_round(label)
            spreads.append(
                f"/{label} {min(ratios):.2f} - {max(ratios):.2f} ({statistics.median(ratios):.2f})"
            )
            summary[p.path][f"ours_over_{label.replace('+', '_')}_per_round"] = [
                round(r, 3) for r in ratios
            ]
        print(f"   {p.path:<10} " + "   ".join(spreads))
    print(
        "\n   processor time per decision on the bench's side (best round's; the broker "
        "is another process):"
    )
    for p in paths:
        for label in ("ours", MINIMAL, DECODING):
            rate = p.best(label)
            print(
                f"   {p.path:<10} {label:<13} {rate.cpu_us:>6,.0f} µs CPU of "
                f"{1e6 / rate.per_s:>6,.0f} µs wall"
            )
            summary[p.path][f"cpu_us_{label.replace('+', '_')}"] = round(rate.cpu_us)
    print("\n   broker operations per decision (counted on the connection):")
    for p in paths:
        for label in ("ours", MINIMAL, DECODING, "floor", "floor+runtime"):
            ops = ", ".join(f"{k} {v:g}" for k, v in p.best(label).ops.items())
            print(f"   {p.path:<10} {label:<14} {ops}")
    worst = min(s["ours_over_minimal"] for s in summary.values())
    verdict = "meets" if worst >= DECISION_TARGET else "BELOW"
    print(f"\n   ours/minimal: worst {worst:.2f} ({verdict} the {DECISION_TARGET} target)")
    return summary


async def run(args: argparse.Namespace) -> dict[str, Any]:
    machines = load_process_machines(Path(args.machines))
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stovepipe-bench-") as tmp:
        async with NatsServer(Path(tmp) / "nats") as server:
            versions = f"python {sys.version.split()[0]}, "
            versions += f"nats-py {importlib.metadata.version('nats-py')}"
            print(f"{versions}, nats-server on {server.url} (file storage, temporary directory)")
            sections = set(args.sections)
            tputs, lat, paths, ingest = [], None, [], None
            if "1" in sections:
                tputs = [
                    await throughput(server.url, machines, 1, args.heads),
                    await throughput(server.url, machines, args.queues, args.per_queue),
                ]
            if "2" in sections:
                lat = await latency(server.url, machines, args.samples)
            if "3" in sections:
                paths = await decision_rates(server.url, machines, args.decisions, args.rounds)
            if "4" in sections:
                ingest = await ingest_rates(
                    server.url, machines, args.ingest_heads, args.batch_queues
                )
    return report(tputs, lat, paths, ingest, time.perf_counter() - began)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.jetstream", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--machines", default="machines", help="machine directory to load")
    parser.add_argument("--heads", type=int, default=2000, help="heads on the one-queue run")
    parser.add_argument("--queues", type=int, default=100, help="queues on the many-queue run")
    parser.add_argument("--per-queue", type=int, default=20, help="heads per queue there")
    parser.add_argument("--samples", type=int, default=300, help="latency samples")
    parser.add_argument("--decisions", type=int, default=300, help="decisions per rate round")
    parser.add_argument("--rounds", type=int, default=3, help="rate rounds (interleaved)")
    parser.add_argument("--ingest-heads", type=int, default=1000, help="heads per ingest run")
    parser.add_argument("--batch-queues", type=int, default=10, help="queues of the batch run")
    parser.add_argument("--sections", default="1234", help="sections to run, e.g. 34")
    parser.add_argument("--quick", action="store_true", help="a fifth of the work, 2 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.heads, args.per_queue, args.samples = 400, 4, 60
        args.decisions, args.rounds, args.ingest_heads = 100, 2, 200
    logging.basicConfig(level=logging.ERROR)
    summary = asyncio.run(run(args))
    print(json.dumps(summary, sort_keys=True, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The service on a 3-node JetStream cluster, with nodes and replicas killed under load.

- A burst of heads over several queues, ``--replicas 3``, two service replicas: once a
  quarter of the heads is in, the node leading the process stream is killed (SIGKILL)
  and restarted, at half of them the node leading the queue bucket. Every head is
  accounted for (none lost, none failed closed), no queue is left wedged, the in-flight
  counts match the processing requests, two replicas never exceed ``max_concurrent``
  (checked before and after each kill, on every queue while it holds slots), and after
  each kill heads ingested since are decided.
- A replica killed with a message in hand: the heartbeat held the message past the ack
  wait while the replica lived (the broker redelivered nothing); once it is gone, the
  broker redelivers it and the other replica admits the head.

The figures (heads, kills, stalls) are printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client
from nats_cluster import NatsCluster, leader_of
from test_service_support import Events, memory_provider, wait_for

from stovepipe_fsm.adapters.jetstream import Topology
from stovepipe_fsm.adapters.memory import MemorySourceControl, MemorySourceControlProvider
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.service.broker_pipeline import Pipeline, open_pipeline
from stovepipe_fsm.apps.service.operators import status_document
from stovepipe_fsm.apps.service.service_options import ServiceOptions
from stovepipe_fsm.apps.service.supervisor import Service
from stovepipe_fsm.domain.errors import StovepipeError
from stovepipe_fsm.process.catalog import ProcessMachines, load_process_machines

MAX_CONCURRENT = {"monorepo/main": 2, "mobile/app": 1, "infra/tools": 1, "web/site": 2}
CONFIG = {
    "defaults": {"max_concurrent": 1, "gate_wait_delay_ms": 200},
    "queues": {queue: {"max_concurrent": n} for queue, n in MAX_CONCURRENT.items()},
}
#: The service's own defaults (ack wait, retry backoff), with quicker polling of the
#: queues bucket and a quicker fetch so that a test does not wait on idle timeouts.
OPTIONS = ServiceOptions(fetch_timeout_s=0.5, discover_interval_s=0.5, shutdown_timeout_s=5.0)
HEADS = 48
DOWN_FOR_S = 4.0


def _machines() -> ProcessMachines:
    return load_process_machines("machines")


@dataclass
class Replica:
    service: Service
    events: Events
    nc: Client


@contextlib.asynccontextmanager
async def _replica(
    cluster: NatsCluster,
    topology: Topology,
    *,
    provider: Any = None,
    options: ServiceOptions = OPTIONS,
    observer: Any = None,
) -> Any:
    nc = await cluster.connect()
    events = observer or Events()
    service = Service(
        nc,
        topology,
        _machines(),
        StaticConfigStore(CONFIG),
        source_control=provider or MemorySourceControlProvider(),
        options=options,
        observer=events,
    )
    try:
        await asyncio.wait_for(service.start(), 60)
        yield Replica(service, events, nc)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(service.stop(), 30)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 10)


@dataclass
class Timeline:
    """When each request was settled by a process decision (admitted or superseded)."""

    decided: list[tuple[float, str]] = field(default_factory=list)
    dead_letters: int = 0

    def __call__(self, event: str, queue: str, request_id: str, detail: str) -> None:
        if event == "acked":
            self.decided.append((time.monotonic(), request_id))
        elif event == "dead_letter":
            self.dead_letters += 1


async def _retrying(what: str, call: Any, deadline_s: float = 60.0) -> Any:
    """``call()`` until the cluster answers: every operator write is repeatable."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return await call()
        except (StovepipeError, TimeoutError) as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: no answer within {deadline_s}s: {exc}") from exc
            await asyncio.sleep(0.2)


async def test_a_burst_rides_out_killed_stream_and_bucket_leaders(
    nats_cluster: NatsCluster,
) -> None:
    machines = _machines()
    green = machines.roles.green_outcome.name
    admitted_states = machines.roles.admitted_states
    topology = Topology.isolated("chaos", replicas=3)
    timeline = Timeline()
    operator = await nats_cluster.connect()
    pipeline: Pipeline = await open_pipeline(
        operator.jetstream(), topology, machines, StaticConfigStore(CONFIG)
    )
    ingested: list[str] = []
    ingested_at: dict[str, float] = {}
    over_limit: list[str] = []
    samples = 0
    #: (when, queue, in flight) of every look at a queue row by the slot watch.
    slot_looks: list[tuple[float, str, int]] = []
    stop_builds = asyncio.Event()

    async def ingest() -> None:
        queues = list(MAX_CONCURRENT)
        for n in range(HEADS):
            queue, uri = queues[n % len(queues)], f"c{n:04d}"
            result = await _retrying(
                f"ingest {uri}", lambda q=queue, u=uri: pipeline.stages.ingest.ingest(q, u)
            )
            ingested.append(result.request_id)
            ingested_at.setdefault(result.request_id, time.monotonic())
            await asyncio.sleep(0.1)

    async def ingested_at_least(count: int) -> bool:
        return len(ingested) >= count

    async def build_farm() -> None:
        """Report admitted builds green, and check the limits on every look.

        Like a reporter on the outcomes stream (redelivered until recorded), a report
        is repeated until ``complete`` returns: one cut short after the request's write
        and before the queue row's leaves the request ended but still a slot holder,
        and only the repeat (or the queue's next gate check) frees that slot."""
        nonlocal samples
        unconfirmed: set[str] = set()
        while not stop_builds.is_set():
            try:
                doc = await status_document(operator.jetstream(), topology)
            except (StovepipeError, TimeoutError):
                await asyncio.sleep(0.2)
                continue
            samples += 1
            for q in doc["queues"]:
                limit = MAX_CONCURRENT[q["name"]]
                processing = [
                    r["id"]
                    for r in doc["requests"]
                    if r["queue"] == q["name"] and r["state"] in admitted_states
                ]
                if q["in_flight_count"] > limit or len(processing) > limit:
                    over_limit.append(f"{q['name']}: {q['in_flight_count']} {processing}")
                unconfirmed.update(processing)
            for request_id in sorted(unconfirmed):
                with contextlib.suppress(StovepipeError, TimeoutError):
                    await pipeline.stages.record.complete(request_id, green)
                    unconfirmed.discard(request_id)
            await asyncio.sleep(0.3)

    async def slot_watch() -> None:
        """The queue rows, often: no replica may hold more slots than max_concurrent."""
        nonlocal samples
        while not stop_builds.is_set():
            for name, limit in MAX_CONCURRENT.items():
                with contextlib.suppress(StovepipeError, TimeoutError):
                    row = await pipeline.stages.lifecycle.queues.get(name)
                    samples += 1
                    slot_looks.append((time.monotonic(), name, row.in_flight_count))
                    if row.in_flight_count > limit:
                        over_limit.append(f"{name}: {row.slot_holders}")
            await asyncio.sleep(0.05)

    kills: list[tuple[str, str, float, float]] = []  # (what, node, killed at, stall)

    async def kill_leader_of(what: str, stream: str) -> None:
        js = operator.jetstream(timeout=2.0)
        node = await leader_of(js, stream)
        killed_at = time.monotonic()
        nats_cluster.kill(node)
        await asyncio.sleep(DOWN_FOR_S)
        await nats_cluster.restart(node)

        def resumed() -> float | None:
            after = [t for t, _ in timeline.decided if t > killed_at]
            return (after[0] - killed_at) if after else None

        async def decided_since() -> float | None:
            return resumed()

        stall = await wait_for(decided_since, f"a decision after killing {node}", timeout=60)
        kills.append((what, node, killed_at, stall))
        # Let the restarted node catch up before the next kill.
        await wait_for(lambda: _all_current(js, stream), f"{stream} replicas current", 60)

    async with (
        _replica(nats_cluster, topology, observer=_Both(timeline)),
        _replica(nats_cluster, topology, observer=_Both(timeline)),
    ):
        started = time.monotonic()
        tasks = [asyncio.ensure_future(t) for t in (ingest(), build_farm(), slot_watch())]
        try:
            await wait_for(lambda: ingested_at_least(HEADS // 4), "a quarter ingested", 60)
            await kill_leader_of("process stream", topology.process_stream)
            await wait_for(lambda: ingested_at_least(HEADS // 2), "half ingested", 60)
            await kill_leader_of("queue bucket", f"KV_{topology.queues_bucket}")
            await asyncio.wait_for(tasks[0], 120)
            ingest_stopped_at = time.monotonic()
            try:
                doc = await wait_for(
                    lambda: _all_settled(operator, topology, ingested),
                    "every head settled",
                    timeout=120,
                )
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}\n{await _unsettled(operator, topology, ingested)}"
                ) from None
        finally:
            tasks[0].cancel()
            stop_builds.set()
            for task in tasks:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 60)
        elapsed = time.monotonic() - started
        info = await operator.jetstream().stream_info(topology.process_stream)
        replicas = info.config.num_replicas
        bucket = await operator.jetstream().stream_info(f"KV_{topology.queues_bucket}")
    await operator.close()

    # The longest wait for a decision while heads kept arriving.
    decided = sorted(t for t, _ in timeline.decided if t <= ingest_stopped_at)
    longest = max(b - a for a, b in itertools.pairwise([started, *decided, ingest_stopped_at]))
    states = Counter(r["state"] for r in doc["requests"])
    wedged = [q["name"] for q in doc["queues"] if not _validated_latest(doc, q, green)]
    lost = len(set(ingested)) - len(doc["requests"]) + sum(
        n for s, n in states.items() if s not in {green, *machines.roles.superseded_states}
    )
    print(
        f"\ncluster chaos: {len(ingested)} heads over {len(MAX_CONCURRENT)} queues in "
        f"{elapsed:.1f}s, replicas {replicas}, 2 service replicas; kills: "
        + "; ".join(f"{what} leader {node}: resumed in {s:.2f}s" for what, node, _, s in kills)
        + f"; longest stall {longest:.2f}s; lost {lost}; wedged "
        f"{len(wedged)}; dead letters {timeline.dead_letters}; states {dict(states)}; "
        f"limit samples {samples}, over the limit {len(over_limit)}"
    )
    assert replicas == 3 and bucket.config.num_replicas == 3
    assert len(kills) == 2
    assert len(ingested) == len(set(ingested)) == HEADS
    assert lost == 0 and timeline.dead_letters == 0
    assert sorted(r["id"] for r in doc["requests"]) == sorted(ingested)
    assert wedged == []
    assert all(q["in_flight_count"] == 0 for q in doc["queues"])
    assert info.state.messages == 0  # nothing left unconsumed on any queue
    assert over_limit == []
    # The limits were looked at while slots were held, on every queue, and on both sides
    # of each kill; after each kill, heads ingested since were decided.
    assert {name for _, name, held in slot_looks if held} == set(MAX_CONCURRENT)
    decided_at = {request_id: t for t, request_id in timeline.decided}
    for what, node, killed_at, stall in kills:
        assert any(t < killed_at for t, _, _ in slot_looks), f"{what}: no look before"
        assert any(t > killed_at + stall for t, _, _ in slot_looks), f"{what}: no look after"
        since = [r for r, t in ingested_at.items() if t > killed_at]
        assert since and all(decided_at.get(r, 0.0) > killed_at for r in since), (
            f"{what} leader {node}: heads ingested after the kill not decided"
        )


class _Both:
    """The replica's own event list and the shared timeline, from one observer."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.events = Events()

    def __call__(self, event: str, queue: str, request_id: str, detail: str) -> None:
        self.events(event, queue, request_id, detail)
        self.timeline(event, queue, request_id, detail)


async def _all_current(js: Any, stream: str) -> bool:
    try:
        info = await js.stream_info(stream)
    except Exception:
        return False
    cluster = info.cluster
    if cluster is None or not cluster.leader:
        return False
    peers = cluster.replicas or []
    return len(peers) == 2 and all(p.current for p in peers)


async def _all_settled(nc: Client, topology: Topology, ingested: list[str]) -> dict | None:
    try:
        doc = await status_document(nc.jetstream(), topology)
    except (StovepipeError, TimeoutError):
        return None
    if len(doc["requests"]) < len(set(ingested)):
        return None
    machines = _machines()
    done = {machines.roles.green_outcome.name, *machines.roles.superseded_states}
    if any(r["state"] not in done for r in doc["requests"]):
        return None
    if any(q["in_flight_count"] for q in doc["queues"]):
        return None
    return doc


async def _unsettled(nc: Client, topology: Topology, ingested: list[str]) -> str:
    """What a failed wait left behind: the heads not settled, the queue rows, and what
    each process consumer still holds (for a report, never for a verdict)."""
    js = nc.jetstream(timeout=5.0)
    lines: list[str] = []
    try:
        doc = await status_document(js, topology)
    except Exception as exc:
        return f"status unreadable: {type(exc).__name__}: {exc}"
    machines = _machines()
    done = {machines.roles.green_outcome.name, *machines.roles.superseded_states}
    seen = {r["id"] for r in doc["requests"]}
    lines.append(f"ingested but no row: {sorted(set(ingested) - seen)}")
    lines += [
        f"unsettled {r['id']}: {r['state']}" for r in doc["requests"] if r["state"] not in done
    ]
    lines += [
        f"queue {q['name']}: in flight {q['in_flight_count']}, latest {q['latest_request_id']}"
        for q in doc["queues"]
    ]
    state = {r["id"]: r["state"] for r in doc["requests"]}
    holders = {q: [f"{h} ({state.get(h)})" for h in hs] for q, hs in doc["slot_holders"].items()}
    lines.append(f"slot holders: {holders}")
    try:
        info = await js.stream_info(topology.process_stream)
        lines.append(f"process stream: {info.state.messages} message(s)")
        for consumer in await js.consumers_info(topology.process_stream):
            lines.append(
                f"consumer {consumer.name}: pending {consumer.num_pending}, ack pending "
                f"{consumer.num_ack_pending}, redelivered {consumer.num_redelivered}, "
                f"waiting pulls {consumer.num_waiting}"
            )
    except Exception as exc:
        lines.append(f"process stream unreadable: {type(exc).__name__}: {exc}")
    return "\n".join(lines)


def _validated_latest(doc: dict, queue: dict, green: str) -> bool:
    latest = [r for r in doc["requests"] if r["id"] == queue["latest_request_id"]]
    return bool(latest) and latest[0]["state"] == green


# -- a replica dies with a message in hand ------------------------------------------------


class Hanging(MemorySourceControl):
    """Ancestry that never answers: the replica asking is stuck mid-step."""

    def __init__(self, stuck: asyncio.Event) -> None:
        super().__init__({})
        self.stuck = stuck

    async def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        self.stuck.set()
        await asyncio.Event().wait()
        return False


async def test_a_replica_killed_with_a_message_in_hand_hands_over_by_redelivery(
    nats_cluster: NatsCluster,
) -> None:
    ack_wait = 2.0
    options = ServiceOptions(
        ack_wait_s=ack_wait, fetch_timeout_s=0.5, discover_interval_s=0.5, shutdown_timeout_s=0.0
    )
    topology = Topology.isolated("handoff", replicas=3)
    queue = "mobile/app"
    green = _machines().roles.green_outcome.name
    stuck = asyncio.Event()
    async with _replica(
        nats_cluster,
        topology,
        provider=MemorySourceControlProvider(default=Hanging(stuck)),
        options=options,
    ) as doomed:
        pipeline = doomed.service.crew.pipeline
        first = (await pipeline.stages.ingest.ingest(queue, "A")).request_id
        await wait_for(lambda: _admitted(pipeline, first), "A admitted")
        await pipeline.stages.record.complete(first, green)  # last green: the next head asks git
        second = (await pipeline.stages.ingest.ingest(queue, "B")).request_id
        await asyncio.wait_for(stuck.wait(), 20)
        async with _replica(
            nats_cluster, topology, provider=memory_provider()[1], options=options
        ) as heir:
            # The doomed replica's heartbeat holds the message well past the ack wait.
            await asyncio.sleep(2.5 * ack_wait)
            assert await heir.service.crew.pipeline.stages.lifecycle.requests.get(second)
            assert not await _admitted(heir.service.crew.pipeline, second)
            consumer = (topology.process_stream, topology.process_consumer_name(queue))
            js = heir.nc.jetstream()
            held = await js.consumer_info(*consumer)
            assert held.num_redelivered == 0 and held.num_ack_pending == 1
            # The replica dies: its connection goes without an ack, a NAK or a goodbye.
            killed_at = time.monotonic()
            await doomed.nc.close()
            await wait_for(
                lambda: _admitted(heir.service.crew.pipeline, second),
                "B admitted by the other replica",
                timeout=30,
            )
            handover = time.monotonic() - killed_at
            # Handed over by the broker: the message the dead replica held (the last the
            # consumer had delivered), delivered again.
            after = (await js.consumer_info(*consumer)).delivered
            assert after.stream_seq == held.delivered.stream_seq
            assert after.consumer_seq > held.delivered.consumer_seq
    print(f"\nreplica kill: {queue} resumed {handover:.2f}s after the kill (ack wait {ack_wait}s)")


async def _admitted(pipeline: Any, request_id: str) -> bool:
    try:
        request = await pipeline.stages.lifecycle.requests.get(request_id)
        return request.state in _machines().roles.admitted_states
    except StovepipeError:
        return False

"""The service: the process stage wired on JetStream, one consumer per queue.

This is :class:`~stovepipe_fsm.simulation.world.World` with real adapters: KV stores,
the JetStream publisher, the file config store (hot reload), git ancestry per queue's
``repository`` and the system clock. It runs

- one :class:`ProcessConsumer` per queue: every queue ``config.configured_queues()``
  names, plus every queue ingest creates later (a new queue gets its consumer without a
  restart). An idle consumer is parked on one long pull request (consumer.py), so idle
  queues cost next to nothing. Start waits only for the queues that can have work: the
  consumers that exist already (listed, then bound with no request each) and the queues
  with messages waiting; the consumers still missing (a first start, new configured
  queues) are created behind it, many at a time (:meth:`Service.warmed`), and a publish
  to one of those queues creates its consumer at once;
- one plain subscription on the process subjects (:meth:`Service._on_publish`): a
  publish for a queue without a consumer starts one at once, and a publish that a parked
  request should have answered but did not renews that request. A second one on the
  broker's leader-election advisories renews every parked request when a stream or
  consumer leader changes, and so does a reconnect (the heartbeat sees it): pull
  requests live only in the broker's memory. A third on the service bucket's pause keys
  takes a ``pause`` or ``resume`` up as it is written (the pauses are also read once a
  second). A user not allowed one of the three is refused it by the broker: the service
  logs that, shows it in ``/metrics``, and goes on with the backstop (:mod:`.subscriptions`);
- one :class:`DeadLetterConsumer` that fails dead-lettered requests closed;
- one :class:`OutcomeConsumer` that records build outcomes from the outcome stream with
  the policy in force (``complete`` and build farms only publish them);
- each discovery round (a safety net behind the publish subscription: one listing of
  the queues bucket's subjects, one request whatever the number of queues), a sweep of
  the process subjects no queue row stands for (:mod:`.orphans`): their messages are
  dead-lettered instead of sitting there for ever. One round runs at a time, whether
  the loop, a publish of an unknown queue or a reconnect started it;
- a heartbeat: one JetStream request a second, so ``healthy`` means the broker answers,
  not merely that a socket is open;
- with a :class:`~.policy.PolicyReloader`, a watch on the policy: a new machines
  version that passes its checks is swapped in between deliveries (every consumer
  reaches the stages through :attr:`Pipeline.stages`, one reference), and the policy
  hash is logged and written to the service bucket on start and on every reload.

Stopping is graceful: runners finish (or hand back) the message in hand, then the
subscriptions are drained. Nothing here holds state a replica could lose: all of it is in
JetStream, so any number of replicas may run against the same broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.kv import KeyValue

from ...adapters.git import GitSourceControlProvider
from ...adapters.jetstream import Topology, ensure_topology, open_kv_stores
from ...adapters.jetstream.attempts import AttemptsLedger
from ...adapters.jetstream.consumer import (
    DEFAULT_ACK_WAIT_S,
    DEFAULT_FETCH_TIMEOUT_S,
    DeadLetterConsumer,
    Observer,
    ProcessConsumer,
)
from ...adapters.jetstream.dead_letter import DeadLetter
from ...adapters.jetstream.durable_consumer import (
    ConsumerLimitReached,
    delete_durable,
    existing_consumers,
)
from ...adapters.jetstream.errors import translated
from ...adapters.jetstream.names import InvalidToken, decode_queue_token
from ...adapters.jetstream.outcome_consumer import OutcomeConsumer
from ...adapters.jetstream.partitions import NoPartitionRoom, room_for_refused, waiting_subjects
from ...adapters.jetstream.policy_record import (
    read_queue_parameters,
    stored_parameters,
    write_policy_record,
    write_queue_parameters,
)
from ...adapters.jetstream.prune import PruneReport, prune_terminal_requests
from ...adapters.jetstream.publisher import JetStreamPublisher
from ...adapters.jetstream.shared_inbox import SharedInbox
from ...adapters.jetstream.terminations import TerminationLedger
from ...adapters.jetstream.trail import JetStreamTrail
from ...adapters.memory import SystemClock
from ...domain.errors import NotFound
from ...domain.settle import DEFAULT_RETRY_BASE_S, DEFAULT_RETRY_CAP_S, Attempt
from ...pipeline.dlq import DeadLetterReconciler
from ...pipeline.ingest import Ingest
from ...pipeline.record import Record
from ...pipeline.wiring import Ports, Stages, build_stages
from ...ports.clock import Clock
from ...ports.config import ConfigStore
from ...ports.source_control import SourceControlProvider
from ...process.catalog import ProcessMachines
from ...process.controller import ProcessController
from ...process.lifecycle import RequestLifecycle
from ...process.metrics import Metrics
from .connect import ConnectionErrors
from .keepalive import KeptAlive
from .orphans import dead_letter_orphans, orphan_subjects
from .pauses import PausableConfig, pause_write_subjects, read_pauses
from .placement import Placement
from .policy import PolicyReloader, policy_record
from .subscriptions import Wake, WakeSubscriptions

log = logging.getLogger("stovepipe_fsm.service")

#: Moves of one queue to another partition in one opening of its consumer: each move
#: goes to a partition with room, which replicas opening other queues may fill first.
MOVES = 3

#: After a pause write is announced, the pauses are read at once and, while the read
#: finds nothing new (the write not stored yet), again after these pauses.
PAUSE_WRITE_RETRIES_S = (0.0, 0.05, 0.2, 0.5)


@dataclass(frozen=True)
class ServiceOptions:
    #: How long a message in hand may go without a sign of life before the broker hands
    #: it to another replica; :class:`~.keepalive.KeptAlive` keeps long steps inside it.
    ack_wait_s: float = DEFAULT_ACK_WAIT_S
    fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S
    retry_base_s: float = DEFAULT_RETRY_BASE_S
    retry_cap_s: float = DEFAULT_RETRY_CAP_S
    #: How often the queues bucket is listed for queues that ingest created (a publish
    #: for a new queue starts its consumer at once; this catches what a disconnect hid).
    discover_interval_s: float = 30.0
    #: How many consumers are created or bound at once on start and discovery.
    open_concurrency: int = 64
    #: Create the consumers of queues without work behind start (``False``: only when a
    #: queue's first message is published, or discovery finds one waiting) ...
    warm_up: bool = True
    #: ... this many at a time: few, so that the broker, which creates consumers one after
    #: the other, still answers the heartbeat and the queues with work meanwhile.
    warm_up_concurrency: int = 8
    #: How long a stop waits for in-hand messages before handing them back.
    shutdown_timeout_s: float = 10.0
    #: How often the machines directory and the config file are checked for edits.
    policy_check_interval_s: float = 1.0
    #: How often the queues refused a consumer (at the account's JetStream limit) are
    #: tried again, when the process stream has room by then; and the plain
    #: subscriptions the broker refused.
    refused_retry_s: float = 60.0
    #: How often a JetStream round trip proves the broker answers (``/healthz``) ...
    heartbeat_interval_s: float = 1.0
    #: ... and how old the last successful one may be before the service is unhealthy.
    health_window_s: float = 5.0
    #: Terminal requests older than this are pruned (with their uri-index entries);
    #: ``None`` keeps them for ever.
    prune_older_than_s: float | None = None
    #: How often the prune runs when ``prune_older_than_s`` is set.
    prune_interval_s: float = 3600.0


def config_repositories(config: ConfigStore) -> GitSourceControlProvider:
    """Ancestry from each queue's ``repository`` setting, re-read on every lookup."""
    return GitSourceControlProvider(lambda queue: config.get(queue).repository)


@dataclass
class Pipeline:
    """The stages on one broker, shared by the service and operator commands.

    ``stages`` is the one reference through which the consumers reach the controller
    and the reconciler: :meth:`swap` replaces it whole, so a delivery runs on the stages
    it started with and the next one on the new stages, never on half of each.
    """

    js: JetStreamContext
    topology: Topology
    stages: Stages
    ledger: AttemptsLedger
    terminations: TerminationLedger
    ports: Ports | None = None
    metrics: Metrics | None = None

    def swap(self, machines: ProcessMachines) -> None:
        """Build the stages on ``machines`` (same ports) and put them in force."""
        assert self.ports is not None, "a pipeline opened by open_pipeline"
        self.stages = build_stages(machines, self.ports, metrics=self.metrics)

    async def handle(self, delivery: Any) -> Attempt:
        """A delivery, run by the controller in force when it starts: what it decided."""
        return await self.stages.controller.handle(delivery)

    async def record_outcome(self, request_id: str, outcome: str) -> object:
        """A build outcome, recorded by the stages in force."""
        return await self.stages.record.complete(request_id, outcome)

    async def reconcile(self, letter: DeadLetter) -> object:
        """A dead letter, reconciled by the stages in force."""
        return await self.stages.reconciler.reconcile(
            letter.request_id, error=letter.error, attempts=letter.attempts
        )

    @property
    def controller(self) -> ProcessController:
        return self.stages.controller

    @property
    def ingest(self) -> Ingest:
        return self.stages.ingest

    @property
    def record(self) -> Record:
        return self.stages.record

    @property
    def reconciler(self) -> DeadLetterReconciler:
        return self.stages.reconciler

    @property
    def lifecycle(self) -> RequestLifecycle:
        return self.stages.lifecycle


async def open_pipeline(
    js: JetStreamContext,
    topology: Topology,
    machines: ProcessMachines,
    config: ConfigStore,
    *,
    source_control: SourceControlProvider | None = None,
    clock: Clock | None = None,
    metrics: Metrics | None = None,
    policy_hash: Callable[[], str] = lambda: "",
) -> Pipeline:
    """Create the topology if missing, open the stores and wire every app on them.

    ``policy_hash`` is read for every trail record: the hash of the policy in force.
    """
    await ensure_topology(js, topology)
    stores = await open_kv_stores(js, topology)
    ports = Ports(
        requests=stores.requests,
        queues=stores.queues,
        uri_index=stores.uris,
        counter=stores.counters,
        config=config,
        source_control=source_control or config_repositories(config),
        publisher=JetStreamPublisher(js, topology),
        clock=clock or SystemClock(),
        trail=JetStreamTrail(js, topology),
        policy_hash=policy_hash,
    )
    with translated(f"open bucket {topology.attempts_bucket}"):
        attempts_kv = await js.key_value(topology.attempts_bucket)
    return Pipeline(
        js=js,
        topology=topology,
        stages=build_stages(machines, ports, metrics=metrics),
        ledger=AttemptsLedger(attempts_kv),
        terminations=TerminationLedger(attempts_kv),
        ports=ports,
        metrics=metrics,
    )


async def known_queues(js: JetStreamContext, topology: Topology) -> list[str]:
    """Every queue with a row in the queues bucket (ingest creates the row, nothing deletes
    it): the bucket stream's subjects, listed in one request rather than one message per
    key, so a discovery round costs the same at 10 queues as at 10,000."""
    head = f"$KV.{topology.queues_bucket}."
    with translated(f"list {topology.queues_bucket}"):
        info = await js.stream_info(f"KV_{topology.queues_bucket}", subjects_filter=f"{head}>")
    keys = [subject[len(head) :] for subject in info.state.subjects or {}]
    queues = []
    for key in keys:
        try:
            queues.append(decode_queue_token(key))
        except InvalidToken:
            log.warning("queues bucket holds a key that is no queue: %r", key)
    return sorted(queues)


class Service:
    """Runs the process stage against one JetStream until stopped."""

    def __init__(
        self,
        nc: Client,
        topology: Topology,
        machines: ProcessMachines,
        config: ConfigStore,
        *,
        source_control: SourceControlProvider | None = None,
        clock: Clock | None = None,
        options: ServiceOptions | None = None,
        observer: Observer | None = None,
        reloader: PolicyReloader | None = None,
        connection_errors: ConnectionErrors | None = None,
    ) -> None:
        self.nc = nc
        #: The connection's error callback, where it is this process's: a subscription
        #: the broker takes away later (a config reload) is then seen as it happens.
        self.connection_errors = connection_errors
        self.js = nc.jetstream()
        self.topology = topology
        self.machines = machines
        #: The config the stages read: the policy's, with operator pauses applied.
        self.config = PausableConfig(config, machines.parameters)
        self.source_control = source_control
        self.clock = clock
        self.options = options or ServiceOptions()
        self.metrics = Metrics()
        self.events: Counter[tuple[str, str]] = Counter()
        #: Dead letters this replica wrote, by reason (:func:`dead_letter_reason`).
        self.dead_letter_reasons: Counter[str] = Counter()
        self._external_observer = observer
        self.pipeline: Pipeline | None = None
        self.consumers: dict[str, ProcessConsumer] = {}
        self._opening: set[str] = set()  # queues whose consumer add_queue is opening
        #: Short tasks (a queue seen in a publish, a discovery after a reconnect), apart
        #: from the long-running ones in ``_tasks`` whose end the health check reports.
        self._chores: dict[str, asyncio.Task[None]] = {}
        self._wakes = WakeSubscriptions(nc, self._make_wakes(), self.options.refused_retry_s)
        self._reconnects = 0
        #: Pause keys written since start, as the service bucket's subjects announced them,
        #: and one refresh at a time (a refresh that read before a write never lands after
        #: one that read after it).
        self._pause_writes = 0
        self._pauses_read = asyncio.Lock()
        #: Consumers listed on start, by durable name: the partitions each is on, with
        #: its config there (taken as their queues open). Usually one partition; more
        #: when replicas raced as the queue moved (:meth:`_open_queue`).
        self._listed: dict[str, dict[int, ConsumerConfig]] = {}
        #: Which partition of the process stream each queue is on (set on start).
        self._placement: Placement | None = None
        #: One discovery round at a time: the loop's, and one a publish of an unknown
        #: queue or a reconnect starts, would otherwise list and act side by side (two
        #: dead-letterings of one orphan, two moves of one stray message).
        self._discovering = asyncio.Lock()
        #: The parameters in the service bucket, by queue, as last read or written.
        self._recorded: dict[str, dict[str, object]] = {}
        self._service_kv: KeyValue | None = None
        #: The one subscription every queue's pull requests are answered on.
        self._inbox: SharedInbox | None = None
        self.refused: dict[str, str] = {}  # queue -> why no consumer could be created
        #: When the refused queues may next be tried again (``time.monotonic``).
        self._refused_retry_at = 0.0
        #: Set once every queue known on start (and at each discovery since) has its
        #: consumer, or was refused one.
        self._warmed = asyncio.Event()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stop = asyncio.Event()
        self._dead_letters: DeadLetterConsumer | None = None
        self._outcomes: OutcomeConsumer | None = None
        self.reloader = reloader
        self.replica = f"{socket.gethostname()}:{os.getpid()}"
        self.started = False
        self._reloading = asyncio.Lock()  # one policy check at a time, in its thread
        #: ``time.monotonic()`` of the last JetStream round trip that succeeded.
        self.last_round_trip: float | None = None

    @property
    def policy_hash(self) -> str:
        """The hash of the policy in force; empty when the service was not given paths."""
        return self.reloader.hash if self.reloader is not None else ""

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        self.pipeline = await open_pipeline(
            self.js,
            self.topology,
            self.machines,
            self.config,
            source_control=self.source_control,
            clock=self.clock,
            metrics=self.metrics,
            policy_hash=lambda: self.policy_hash,
        )
        pipeline = self.pipeline
        if self.reloader is not None:
            log.info("policy %s in force", self.reloader.hash)
        # Before any consumer runs: operator commands (ingest) read the policy in force here.
        await self._record_policy()
        self._dead_letters = DeadLetterConsumer(
            self.js,
            self.topology,
            pipeline.reconcile,
            terminations=pipeline.terminations,
            observer=self._observe,
            fetch_timeout_s=self.options.fetch_timeout_s,
            ack_wait_s=self.options.ack_wait_s,
        )
        await self._dead_letters.open()
        self._spawn("dead-letters", self._dead_letters.run(self._stop))
        self._outcomes = OutcomeConsumer(
            self.js,
            self.topology,
            pipeline.record_outcome,
            observer=self._observe,
            ack_wait_s=self.options.ack_wait_s,
            fetch_timeout_s=self.options.fetch_timeout_s,
            retry_base_s=self.options.retry_base_s,
            retry_cap_s=self.options.retry_cap_s,
        )
        await self._outcomes.open()
        self._spawn("outcomes", self._outcomes.run(self._stop))
        await self.refresh_pauses()
        self._spawn("pauses", self._pause_loop())
        self._reconnects = self.nc.stats.get("reconnects", 0)
        if self.connection_errors is not None:
            self.connection_errors.listen(self._wakes.on_error)
        await self._wakes.subscribe()
        self._inbox = SharedInbox(self.nc)
        await self._inbox.open()
        # Two listings instead of two round trips per queue: the consumers that exist
        # (bound without asking about each one) and the parameters status shows (only
        # the ones that changed are written).
        assert pipeline.ports is not None
        self._placement = Placement(self.js, self.topology, pipeline.ports.queues)
        for partition in await self._placement.refresh():
            stream = self.topology.process_stream_of(partition)
            for durable, cfg in (await existing_consumers(self.js, stream)).items():
                self._listed.setdefault(durable, {})[partition] = cfg
        self._recorded = await self._read_recorded_parameters()
        # Waits only for the consumers that exist and the queues with work waiting; the
        # rest are created behind start (a first start on 10,000 queues would otherwise
        # wait minutes for the broker to create consumers of queues with nothing to do).
        # One listing of each serves the binding and the first discovery round.
        async with self._discovering:
            subjects, known = await self._listings()
            name = self.topology.process_consumer_name
            await self.add_queues(
                q for q in (*self.config.configured_queues(), *known) if name(q) in self._listed
            )
            await self._discover_from(subjects, known)
        self._listed = {}  # a later queue asks the broker: the listing may be stale by then
        self._spawn("discover", self._discover_loop())
        self.last_round_trip = time.monotonic()  # start() itself just talked to JetStream
        self._spawn("heartbeat", self._heartbeat_loop())
        if self.options.prune_older_than_s is not None:
            self._spawn("prune", self._prune_loop(self.options.prune_older_than_s))
        if self.reloader is not None:
            self._spawn("policy", self._policy_loop())
        self.started = True
        log.info(
            "service started with %d queue consumer(s)%s",
            len(self.consumers),
            "" if self._warmed.is_set() else "; creating the others behind it",
        )

    async def add_queue(self, queue: str) -> bool:
        """Start the queue's consumer unless it runs already; ``True`` if started now.

        A queue the stream has no consumer left for is refused with one error line (and
        counted in ``refused``), not retried every discovery round; the other queues are
        unaffected. Refused queues are tried again every ``refused_retry_s`` once the
        stream has room (:meth:`_retry_refused`), and at a restart.
        """
        if (
            queue in self.consumers
            or queue in self._opening
            or queue in self.refused
            or self._stop.is_set()
        ):
            return False
        assert self.pipeline is not None, "start() first"
        self._opening.add(queue)
        try:
            return await self._open_queue(queue)
        finally:
            self._opening.discard(queue)

    async def add_queues(
        self, queues: Iterable[str], *, concurrency: int | None = None
    ) -> list[str]:
        """:meth:`add_queue` for each of ``queues``, ``open_concurrency`` at a time (one at
        a time, 10,000 queues take tens of seconds of round trips); those started now."""
        gate = asyncio.Semaphore(concurrency or self.options.open_concurrency)

        async def add(queue: str) -> bool:
            async with gate:
                return await self.add_queue(queue)

        todo = [q for q in dict.fromkeys(queues) if q not in self.consumers]
        results = await asyncio.gather(*(add(queue) for queue in todo))
        return [queue for queue, started in zip(todo, results, strict=True) if started]

    def _consumer(self, queue: str, partition: int) -> ProcessConsumer:
        assert self.pipeline is not None, "start() first"
        return ProcessConsumer(
            self.js,
            self.topology,
            queue,
            handler=KeptAlive(self.pipeline, self.options.ack_wait_s),
            config=self.config,
            ledger=self.pipeline.ledger,
            terminations=self.pipeline.terminations,
            observer=self._observe,
            ack_wait_s=self.options.ack_wait_s,
            fetch_timeout_s=self.options.fetch_timeout_s,
            retry_base_s=self.options.retry_base_s,
            retry_cap_s=self.options.retry_cap_s,
            inbox=self._inbox,
            partition=partition,
            still_here=self._still_here,
        )

    async def _open_queue(self, queue: str) -> bool:
        """Open the queue's consumer on the partition its row names; a partition that
        refuses it for its consumer limit has the queue moved to one with room
        (:mod:`.placement`), at most :data:`MOVES` times in a row.

        A consumer listed on start is bound where it was listed, without reading the
        row. Listed on several partitions (a replica created it on one just as another
        moved the queue), the row decides, and the durables elsewhere are deleted: they
        would hold a seat where no head of the queue is published."""
        assert self._placement is not None, "start() first"
        listed = self._listed.pop(self.topology.process_consumer_name(queue), {})
        if len(listed) == 1:
            partition = next(iter(listed))
        else:
            partition = await self._placement.partition_of(queue)
        left: list[int] = []  # partitions the queue moved off, where heads may wait
        for attempt in range(MOVES + 1):
            consumer = self._consumer(queue, partition)
            try:
                await consumer.open(listed.get(partition))
                break
            except ConsumerLimitReached as exc:
                why = str(exc)
                if attempt < MOVES:
                    try:
                        left.append(partition)
                        partition = await self._placement.move(queue, partition)
                        continue
                    except NoPartitionRoom as no_room:
                        why = f"{why}; {no_room}"
                self.refused[queue] = why
                now = time.monotonic()
                if self._refused_retry_at <= now:
                    self._refused_retry_at = now + self.options.refused_retry_s
                log.error("queue not served: %s", why, extra={"queue": queue})
                return False
        self.consumers[queue] = consumer
        await self._record_parameters(queue)
        self._spawn(f"queue:{queue}", consumer.run(self._stop, watch_stop=False))
        where = f" on partition {partition}" if partition else ""
        log.info("consumer started%s", where, extra={"queue": queue})
        stale = [other for other in listed if other != partition]
        for other in stale:
            await self._delete_stale(queue, other)
        if left or stale:
            self._spawn_once(f"gather:{queue}", self._gather(queue, [*left, *stale]))
        return True

    async def _delete_stale(self, queue: str, partition: int) -> None:
        """Delete the queue's durable on ``partition``, which its row does not name."""
        stream = self.topology.process_stream_of(partition)
        if await delete_durable(self.js, stream, self.topology.process_consumer_name(queue)):
            log.warning(
                "deleted the queue's consumer on partition %d (%s): its row names another",
                partition,
                stream,
                extra={"queue": queue},
            )

    async def _gather(self, queue: str, sources: Iterable[int]) -> None:
        """Move the queue's messages that wait on the partitions ``sources`` to its row's,
        when that is another (published just as the queue moved: :meth:`Placement.gather`);
        a consumer of the queue on another partition than the row's follows the row
        (:meth:`_rehome`)."""
        assert self._placement is not None, "start() first"
        try:
            gathered = await self._placement.gather(queue, sources)
        except Exception as exc:  # the next discovery round finds them again
            log.warning("waiting messages not moved: %s: %s", type(exc).__name__, exc)
            return
        consumer = self.consumers.get(queue)
        if consumer is None:
            return
        if consumer.partition != gathered.partition:
            await self._rehome(consumer)
        elif gathered.moved:
            consumer.nudge()

    async def _still_here(self, consumer: ProcessConsumer) -> bool:
        """Whether the queue of ``consumer``, whose durable is gone, still lives on its
        partition (:attr:`ProcessConsumer.still_here`); if not, the loop is retired now
        and the queue opened where its row says."""
        assert self._placement is not None, "start() first"
        if await self._placement.named(consumer.queue) == consumer.partition:
            return True
        consumer.retire()
        self._spawn_once(f"rehome:{consumer.queue}", self._rehome_quietly(consumer))
        return False

    async def _rehome_quietly(self, stale: ProcessConsumer) -> None:
        try:
            await self._rehome(stale)
        except Exception as exc:  # the queue's next head or the next discovery round
            log.warning("consumer not re-opened: %s: %s", type(exc).__name__, exc)

    async def _rehome(self, stale: ProcessConsumer) -> None:
        """Open the queue of ``stale`` where its row says: ``stale`` is on a partition
        the row no longer names, as when this replica opened it there just as another
        replica, refused there, moved the queue. No head of the queue is published
        there any more, so the loop ends after its message in hand, its durable there
        is deleted (it holds a seat of that partition), the queue is opened on the
        row's partition, and what still waits on the old one is gathered to it."""
        queue = stale.queue
        if self.consumers.get(queue) is not stale or queue in self._opening:
            return
        loop = self._tasks.get(f"queue:{queue}")
        self._opening.add(queue)
        try:
            del self.consumers[queue]
            stale.retire()
            log.warning(
                "consumer on partition %d, which the queue's row no longer names: "
                "opening it where the row says",
                stale.partition,
                extra={"queue": queue},
            )
            if loop is not None and loop is not asyncio.current_task():
                await asyncio.wait({loop}, timeout=self.options.ack_wait_s)
            if self._stop.is_set():
                return  # the next start, or the queue's next head there, follows the row
            await self._delete_stale(queue, stale.partition)
            opened = await self._open_queue(queue)
        finally:
            self._opening.discard(queue)
        if opened:
            await self._gather(queue, [stale.partition])

    async def discover(self) -> list[str]:
        """Start the consumers of queues with messages waiting, dead-letter the messages of
        process subjects that no queue row stands for (:mod:`.orphans`), and have every
        other queue of the queues bucket and the config get its consumer behind it
        (:meth:`warmed`). Returns the queues started now, for waiting messages."""
        async with self._discovering:
            return await self._discover_from(*await self._listings())

    async def _listings(self) -> tuple[dict[str, int], list[str]]:
        """The process subjects of every partition, then the queues bucket's rows, in that
        order: a queue row always exists before its first message, so a subject whose
        queue has no row in the listing read after it is an orphan."""
        assert self._placement is not None, "start() first"
        known = await self._placement.refresh()
        subjects = await waiting_subjects(self.js, self.topology, known)
        return subjects, await known_queues(self.js, self.topology)

    async def _discover_from(self, subjects: dict[str, int], known: list[str]) -> list[str]:
        """:meth:`discover` on listings read by :meth:`_listings`."""
        assert self.pipeline is not None, "start() first"
        await self._retry_refused()
        await self._wakes.retry_refused()
        rows = set(known)
        waiting = []
        for queue, partition in self._addresses(subjects):
            consumer = self.consumers.get(queue)
            if consumer is None:
                if queue in rows:
                    waiting.append(queue)
            elif consumer.partition != partition:
                self._spawn_once(f"gather:{queue}", self._gather(queue, [partition]))
        started = await self.add_queues(waiting)
        served = {*known, *self.consumers}
        orphans = orphan_subjects(self.topology, subjects, served)
        if orphans:
            await dead_letter_orphans(
                self.js, self.topology, self.pipeline.terminations, orphans, self._observe
            )
        rest = [
            q
            for q in dict.fromkeys((*self.config.configured_queues(), *known))
            if q not in self.consumers and q not in self.refused
        ]
        if not rest:
            self._warmed.set()
        elif self.options.warm_up:
            self._warmed.clear()
            self._spawn_once("warm-up", self._warm_up(rest))
        return started

    async def _retry_refused(self) -> None:
        """Try the refused queues again, at most every ``refused_retry_s`` and only when
        the account's limits leave room (an operator raised them, or consumers were
        deleted): a few reads per retry, not a create per queue. A queue refused again
        waits for the next retry."""
        if not self.refused or time.monotonic() < self._refused_retry_at:
            return
        self._refused_retry_at = time.monotonic() + self.options.refused_retry_s
        try:
            room = await room_for_refused(self.js, self.topology)
        except Exception as exc:  # the discovery round goes on; the next retry reads again
            log.warning("refused queues not retried: %s: %s", type(exc).__name__, exc)
            return
        if not room:
            return
        queues = sorted(self.refused)
        log.info("the process streams have room: retrying %d refused queue(s)", len(queues))
        for queue in queues:
            del self.refused[queue]
        await self.add_queues(queues)

    def _addresses(self, subjects: Iterable[str]) -> list[tuple[str, int]]:
        """The queue and partition of process subjects (orphan subjects, which decode to
        none, left out)."""
        out = []
        for subject in subjects:
            try:
                out.append(self.topology.process_address(subject))
            except ValueError:
                continue
        return out

    async def _warm_up(self, queues: list[str]) -> None:
        """Create the consumers of ``queues`` (queues without work when they were listed),
        ``warm_up_concurrency`` at a time, so that their first head finds one ready."""
        began = time.monotonic()
        try:
            started = await self.add_queues(
                queues, concurrency=self.options.warm_up_concurrency
            )
        except Exception as exc:  # the next discovery round tries again
            log.warning("consumers not created: %s: %s", type(exc).__name__, exc)
            return
        if started:
            log.info(
                "created %d consumer(s) of queues without work in %.1f s",
                len(started),
                time.monotonic() - began,
            )
        if all(q in self.consumers or q in self.refused for q in queues):
            self._warmed.set()

    async def warmed(self) -> None:
        """Wait until every queue known at the last discovery has a consumer (or was
        refused one): start returns before the consumers of queues without work exist."""
        await self._warmed.wait()

    async def stop(self) -> None:
        """Let runners settle the message in hand, then hand back whatever is left."""
        self._stop.set()
        for loop in self._loops():
            loop.wake()  # queue loops do not watch the stop event themselves
        if self.connection_errors is not None:
            self.connection_errors.forget(self._wakes.on_error)
        await self._wakes.close()
        tasks = [*self._tasks.values(), *self._chores.values()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.options.shutdown_timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=self.options.shutdown_timeout_s)
        for consumer in self.consumers.values():
            await consumer.close()
        if self._inbox is not None:
            with contextlib.suppress(Exception):
                await self._inbox.close()
        if self._dead_letters is not None:
            await self._dead_letters.close()
        if self._outcomes is not None:
            await self._outcomes.close()
        log.info("service stopped")

    async def run(self, stop: asyncio.Event) -> None:
        """Start, serve until ``stop`` is set, stop gracefully."""
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    @property
    def healthy(self) -> bool:
        """Running, and the broker answered a JetStream request within the health window.

        A connected socket is not enough: a hung broker keeps the connection open while
        answering nothing, so only a recent round trip counts.
        """
        return not self.health_problems()

    def health_problems(self) -> list[str]:
        """Why the service is not healthy; empty when it is."""
        if not self.started:
            return ["not started"]
        problems = []
        if self._stop.is_set():
            problems.append("stopping")
        if not self.nc.is_connected:
            problems.append("not connected to NATS")
        if self.last_round_trip is not None:
            age = time.monotonic() - self.last_round_trip
            if age > self.options.health_window_s:
                problems.append(f"no JetStream round trip for {age:.1f} s")
        problems += [f"{name} stopped" for name, task in self._tasks.items() if task.done()]
        return problems

    def readiness_problems(self) -> list[str]:
        """Why the service is not ready: unhealthy, or a queue was refused a consumer.
        (Consumers still being created behind start do not count: a head for such a queue
        creates its consumer at once.)"""
        problems = self.health_problems()
        for queue, why in sorted(self.refused.items()):
            problems.append(f"queue {queue!r} has no consumer: {why}")
        return problems

    @property
    def ready(self) -> bool:
        """Healthy, and no queue the service knows was refused a consumer."""
        return not self.readiness_problems()

    # -- internals --------------------------------------------------------------------

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks[name] = task

    async def _heartbeat_loop(self) -> None:
        """Prove the broker answers: one JetStream request per interval, timed out at the
        interval, so a hung broker ages ``last_round_trip`` as wall time passes."""
        interval = self.options.heartbeat_interval_s
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self.js.account_info(), timeout=interval)
                self.last_round_trip = time.monotonic()
                await self._after_reconnect()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the health check reports the age; log for the why
                log.warning("broker round trip failed: %s: %s", type(exc).__name__, exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), interval)

    @property
    def refused_subscriptions(self) -> dict[str, str]:
        """The plain subscriptions the broker refused (by name, :meth:`wakes`): why."""
        return self._wakes.refused

    def wakes(self) -> tuple[Wake, ...]:
        """The plain subscriptions (see the module docstring), each with its backstop."""
        return tuple(self._wakes.wakes.values())

    def _make_wakes(self) -> tuple[Wake, ...]:
        return (
            Wake(
                "publish",
                self.topology.process_subjects_filter(),
                self._on_publish,
                "a new queue gets its consumer at the next discovery round, and a parked "
                "pull request the broker dropped is renewed as it expires",
            ),
            Wake(
                "leader",
                "$JS.EVENT.ADVISORY.*.LEADER_ELECTED.>",
                self._on_leader,
                "after a leader change, parked pull requests are renewed as they expire",
            ),
            Wake(
                "pause",
                pause_write_subjects(self.topology),
                self._on_pause_write,
                "a pause or resume is taken up at the once-a-second read",
            ),
        )

    async def _on_publish(self, msg: Any) -> None:
        try:
            queue, partition = self.topology.process_address(msg.subject)
        except ValueError:
            return  # an orphan subject: discovery dead-letters it
        consumer = self.consumers.get(queue)
        if consumer is not None:
            if consumer.partition == partition:
                consumer.nudge()
            else:  # published as the queue moved: bring it to the consumer
                self._spawn_once(f"gather:{queue}", self._gather(queue, [partition]))
        elif queue not in self._opening and queue not in self.refused:
            self._spawn_once(f"add:{queue}", self._add_if_ingested(queue))

    async def _on_leader(self, msg: Any) -> None:
        """``$JS.EVENT.ADVISORY.{STREAM,CONSUMER}.LEADER_ELECTED.<stream>[.<consumer>]``:
        the pull requests the old leader held are gone; renew those of that stream."""
        tokens = msg.subject.split(".")
        if len(tokens) < 6:
            return
        stream = tokens[5]
        durable = tokens[6] if len(tokens) > 6 else ""
        for loop in self._loops():
            if loop.stream == stream and (not durable or loop.durable == durable):
                loop.wake()

    def _loops(self) -> list[Any]:
        extra = [loop for loop in (self._dead_letters, self._outcomes) if loop is not None]
        return [*self.consumers.values(), *extra]

    async def _after_reconnect(self) -> None:
        """After a reconnect, parked pull requests may be gone with the old connection or
        server: renew them all, and look for queues whose publish went by meanwhile."""
        reconnects = self.nc.stats.get("reconnects", 0)
        if reconnects == self._reconnects:
            return
        self._reconnects = reconnects
        log.info("reconnected: renewing %d parked pull request(s)", len(self._loops()))
        for loop in self._loops():
            loop.wake()
        self._spawn_once("discover-now", self._discover_quietly())

    async def _add_quietly(self, queue: str) -> None:
        try:
            await self.add_queue(queue)
        except Exception as exc:  # discovery retries it
            log.warning("consumer not started: %s: %s", type(exc).__name__, exc)

    async def _add_if_ingested(self, queue: str) -> None:
        """A publish for a queue not served yet: start its consumer if ingest made its row
        (ingest writes the row before it publishes); else the subject is an orphan, and a
        discovery round now dead-letters it. A flood of forged subjects therefore costs a
        row read each and one discovery at a time, never a consumer each."""
        assert self.pipeline is not None and self.pipeline.ports is not None
        try:
            await self.pipeline.ports.queues.get(queue)
        except NotFound:
            self._spawn_once("discover-now", self._discover_quietly())
            return
        except Exception as exc:  # discovery retries it
            log.warning("consumer not started: %s: %s", type(exc).__name__, exc)
            return
        await self._add_quietly(queue)

    async def _discover_quietly(self) -> None:
        try:
            await self.discover()
        except Exception as exc:  # the next round retries
            log.warning("queue discovery failed: %s: %s", type(exc).__name__, exc)

    def _spawn_once(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        """A short task, unless one of that name is still running (then ``coro`` is
        dropped)."""
        running = self._chores.get(name)
        if running is not None and not running.done():
            coro.close()
            return
        if self._stop.is_set():
            coro.close()
            return
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._chores[name] = task
        task.add_done_callback(lambda done: self._forget_chore(name, done))

    def _forget_chore(self, name: str, task: asyncio.Task[None]) -> None:
        if self._chores.get(name) is task:
            del self._chores[name]

    async def _discover_loop(self) -> None:
        await self._every(self.options.discover_interval_s, self.discover, "queue discovery")

    async def reload_policy(self) -> bool:
        """Take up an edit of the policy now; True when a new policy is in force."""
        assert self.reloader is not None and self.pipeline is not None, "start() first"
        # Reading and validating files is blocking work of unbounded size in principle:
        # a worker thread does it (one check at a time), the loop keeps serving queues.
        async with self._reloading:
            change = await asyncio.to_thread(self.reloader.check)
        if change is None:
            return False
        if change.machines is not None:
            self.pipeline.swap(change.machines)
            self.machines = change.machines
            self.config.declared = change.machines.parameters
        await self._record_policy()
        await self._record_all_parameters()
        return True

    async def _record_all_parameters(self) -> None:
        gate = asyncio.Semaphore(self.options.open_concurrency)

        async def record(queue: str) -> None:
            async with gate:
                await self._record_parameters(queue)

        await asyncio.gather(*(record(queue) for queue in sorted(self.consumers)))

    async def _read_recorded_parameters(self) -> dict[str, dict[str, object]]:
        try:
            return await read_queue_parameters(self.js, self.topology)
        except Exception as exc:  # every queue's parameters are then written again
            log.warning("queue parameters not read: %s: %s", type(exc).__name__, exc)
            return {}

    async def _record_parameters(self, queue: str) -> None:
        """What ``status`` shows as the queue's effective parameters (best effort); not
        written again when the bucket holds them already."""
        try:
            config = self.config.get(queue)
            values: dict[str, object] = dict(self.machines.parameter_defaults)
            values.update(dict(config.parameters))
            values["max_attempts"] = config.max_attempts
            stored = stored_parameters(values)
            if self._recorded.get(queue) == stored:
                return
            if self._service_kv is None:
                with translated(f"open bucket {self.topology.service_bucket}"):
                    self._service_kv = await self.js.key_value(self.topology.service_bucket)
            await write_queue_parameters(
                self.js, self.topology, queue, values, kv=self._service_kv
            )
            self._recorded[queue] = stored
        except Exception as exc:  # status shows the previous values until the next write
            log.warning(
                "queue parameters not recorded: %s: %s",
                type(exc).__name__,
                exc,
                extra={"queue": queue},
            )

    async def refresh_pauses(self) -> bool:
        """Take up the operator pauses in the broker now; True when they changed."""
        async with self._pauses_read:
            pauses = tuple(await read_pauses(self.js, self.topology))
            if pauses == self.config.pauses:
                return False
            self.config.pauses = pauses
            log.info("operator pauses in force: %s", [p.pattern for p in pauses] or "none")
            await self._record_all_parameters()
            return True

    async def _on_pause_write(self, msg: Any) -> None:
        """A ``pause``/``resume`` wrote a pause key: take the pauses up now rather than
        at the next once-a-second read, which stays as the backstop."""
        self._pause_writes += 1
        self._spawn_once("pauses-now", self._take_up_pause_writes())

    async def _take_up_pause_writes(self) -> None:
        """Read the pauses until every announced write has been looked for.

        The announcement can reach this subscription before the bucket's stream has
        stored the write (on a cluster, before the stream's leader commits it), so a read
        that finds nothing new is tried again a little later, a few times; the
        once-a-second read catches anything later still.
        """
        seen = -1
        while seen != self._pause_writes and not self._stop.is_set():
            seen = self._pause_writes
            for pause_s in PAUSE_WRITE_RETRIES_S:
                await asyncio.sleep(pause_s)
                try:
                    if await self.refresh_pauses():
                        break
                except Exception as exc:  # the backstop read tries again
                    log.warning("pause check failed: %s: %s", type(exc).__name__, exc)
                    return

    async def _pause_loop(self) -> None:
        await self._every(self.options.policy_check_interval_s, self.refresh_pauses, "pause")

    async def _policy_loop(self) -> None:
        await self._every(self.options.policy_check_interval_s, self.reload_policy, "policy")

    async def _every(
        self, interval_s: float, check: Callable[[], Awaitable[object]], what: str
    ) -> None:
        """Run ``check`` every ``interval_s`` until stopped; a failed round is logged and
        the next one tried (the broker may be reconnecting)."""
        while not self._stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), interval_s)
            if self._stop.is_set():
                return
            try:
                await check()
            except Exception as exc:
                log.warning("%s check failed: %s: %s", what, type(exc).__name__, exc)

    async def prune(self, older_than_s: float) -> PruneReport:
        """Remove terminal requests older than ``older_than_s``; terminal is what the
        request machine in force declares."""
        report = await prune_terminal_requests(
            self.js, self.topology, self.machines.request.terminal, older_than_s
        )
        if report.pruned:
            log.info("pruned %d terminal request(s)", len(report.pruned))
        return report

    async def _prune_loop(self, older_than_s: float) -> None:
        while not self._stop.is_set():
            try:
                await self.prune(older_than_s)
            except Exception as exc:  # the broker may be reconnecting; try next round
                log.warning("prune failed: %s: %s", type(exc).__name__, exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.options.prune_interval_s)

    async def _record_policy(self) -> None:
        now_ms = int(time.time() * 1000)
        record = policy_record(self.machines, self.policy_hash, self.replica, now_ms)
        try:
            await write_policy_record(self.js, self.topology, record)
        except Exception as exc:  # status shows an older hash until the next write
            log.warning("policy record not written: %s: %s", type(exc).__name__, exc)

    def _observe(self, event: str, queue: str, request_id: str, detail: str) -> None:
        self.events[(event, queue)] += 1
        reason = dead_letter_reason(event, detail)
        if reason:
            self.dead_letter_reasons[reason] += 1
        if self._external_observer is not None:
            self._external_observer(event, queue, request_id, detail)


def dead_letter_reason(event: str, detail: str) -> str:
    """Why a runtime event dead-lettered a message, in a few words ("" if it did not)."""
    if event == "orphan":
        return "orphan"
    if event == "outcome_refused":
        return "outcome_refused"
    if event != "dead_letter":
        return ""
    if detail.startswith("gave up after"):
        return "gave_up"
    if detail.startswith("undecodable"):
        return "undecodable"
    return "non_retryable"


__all__ = [
    "Pipeline",
    "Service",
    "ServiceOptions",
    "config_repositories",
    "known_queues",
    "open_pipeline",
]

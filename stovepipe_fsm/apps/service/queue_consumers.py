"""One consumer per queue, on the partition of the process stream its row names.

Every consumer fetches its pull requests through one shared inbox, and an idle one is
parked on one long pull request (consumer.py), so idle queues cost next to nothing.
A queue whose partition refuses it a consumer (the account's consumer limit) is moved
to one with room (:mod:`.placement`), at most :data:`MOVES` times in a row, else refused
and tried again every ``refused_retry_s`` once the streams have room. A consumer left on
a partition its row no longer names (another replica moved the queue meanwhile) follows
the row, and the messages published just as the queue moved are gathered to it.

The consumers listed on start are bound without a round trip each; the consumers of
queues without work are created behind start, a few at a time (:meth:`warmed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import KW_ONLY, InitVar, dataclass, field

from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig

from ...adapters.jetstream import Topology
from ...adapters.jetstream.consumer import Observer, ProcessConsumer
from ...adapters.jetstream.durable_consumer import (
    ConsumerLimitReached,
    delete_durable,
    existing_consumers,
)
from ...adapters.jetstream.partitions import NoPartitionRoom, room_for_refused
from ...adapters.jetstream.shared_inbox import SharedInbox
from ...ports.config import ConfigStore
from ...ports.stores import QueueStore
from .broker_pipeline import Pipeline
from .keepalive import KeptAlive
from .placement import Placement
from .service_options import ServiceOptions
from .tasks import ServiceTasks

log = logging.getLogger("stovepipe_fsm.service")

#: Moves of one queue to another partition in one opening of its consumer: each move
#: goes to a partition with room, which replicas opening other queues may fill first.
MOVES = 3


@dataclass(eq=False)
class QueueConsumers:
    """The queue consumers of one service, where they live, and the queues refused one."""

    js: JetStreamContext
    topology: Topology
    pipeline: Pipeline
    config: ConfigStore
    tasks: ServiceTasks
    #: The one subscription every queue's pull requests are answered on.
    inbox: SharedInbox
    _: KW_ONLY
    options: ServiceOptions
    observe: Observer
    #: The queue rows, which name each queue's partition.
    rows: InitVar[QueueStore]
    #: Told of every queue whose consumer started.
    opened: Callable[[str], Awaitable[None]]
    consumers: dict[str, ProcessConsumer] = field(init=False, default_factory=dict)
    #: queue -> why no consumer could be created
    refused: dict[str, str] = field(init=False, default_factory=dict)
    #: The queues whose consumer add_queue is opening.
    _opening: set[str] = field(init=False, default_factory=set)
    #: When the refused queues may next be tried again (``time.monotonic``).
    _refused_retry_at: float = field(init=False, default=0.0)
    #: Consumers listed on start, by durable name: the partitions each is on, with
    #: its config there (taken as their queues open). Usually one partition; more
    #: when replicas raced as the queue moved (:meth:`_open_queue`).
    _listed: dict[str, dict[int, ConsumerConfig]] = field(init=False, default_factory=dict)
    #: Set once every queue known at the last :meth:`expect` has its consumer, or was
    #: refused one.
    _warmed: asyncio.Event = field(init=False, default_factory=asyncio.Event)

    def __post_init__(self, rows: QueueStore) -> None:
        #: Which partition of the process stream each queue is on.
        self.placement = Placement(self.js, self.topology, rows)

    async def open(self) -> None:
        """Open the shared inbox and list the consumers that exist on every partition
        (bound later without asking about each one)."""
        await self.inbox.open()
        for partition in await self.placement.refresh():
            stream = self.topology.process_stream_of(partition)
            for durable, cfg in (await existing_consumers(self.js, stream)).items():
                self._listed.setdefault(durable, {})[partition] = cfg

    async def bind_listed(self, queues: Iterable[str]) -> None:
        """Start the consumers of ``queues`` that were listed on :meth:`open`; a later
        queue asks the broker (the listing may be stale by then)."""
        name = self.topology.process_consumer_name
        await self.add_queues(q for q in queues if name(q) in self._listed)
        self._listed = {}

    def busy(self, queue: str) -> bool:
        """Whether the queue's consumer is being opened, or was refused."""
        return queue in self._opening or queue in self.refused

    async def add_queue(self, queue: str) -> bool:
        """Start the queue's consumer unless it runs already; ``True`` if started now.

        A queue the stream has no consumer left for is refused with one error line (and
        counted in ``refused``), not retried every discovery round; the other queues are
        unaffected. Refused queues are tried again every ``refused_retry_s`` once the
        stream has room (:meth:`retry_refused`), and at a restart.
        """
        if queue in self.consumers or self.busy(queue) or self.tasks.stopping:
            return False
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
        return ProcessConsumer(
            self.js,
            self.topology,
            queue,
            handler=KeptAlive(self.pipeline, self.options.ack_wait_s),
            config=self.config,
            ledger=self.pipeline.ledger,
            terminations=self.pipeline.terminations,
            observer=self.observe,
            ack_wait_s=self.options.ack_wait_s,
            fetch_timeout_s=self.options.fetch_timeout_s,
            retry_base_s=self.options.retry_base_s,
            retry_cap_s=self.options.retry_cap_s,
            inbox=self.inbox,
            partition=partition,
            still_here=self._still_here,
            on_retry=self.pipeline.note_retry,
        )

    async def _open_queue(self, queue: str) -> bool:
        """Open the queue's consumer on the partition its row names; a partition that
        refuses it for its consumer limit has the queue moved to one with room
        (:mod:`.placement`), at most :data:`MOVES` times in a row.

        A consumer listed on start is bound where it was listed, without reading the
        row. Listed on several partitions (a replica created it on one just as another
        moved the queue), the row decides, and the durables elsewhere are deleted: they
        would hold a seat where no head of the queue is published."""
        listed = self._listed.pop(self.topology.process_consumer_name(queue), {})
        if len(listed) == 1:
            partition = next(iter(listed))
        else:
            partition = await self.placement.partition_of(queue)
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
                        partition = await self.placement.move(queue, partition)
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
        await self.opened(queue)
        self.tasks.spawn(
            f"queue:{queue}", consumer.run(self.tasks.stop_requested, watch_stop=False)
        )
        where = f" on partition {partition}" if partition else ""
        log.info("consumer started%s", where, extra={"queue": queue})
        stale = [other for other in listed if other != partition]
        for other in stale:
            await self._delete_stale(queue, other)
        if left or stale:
            self.gather_soon(queue, [*left, *stale])
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

    def gather_soon(self, queue: str, sources: Iterable[int]) -> None:
        """:meth:`_gather` in a task of its own (one per queue at a time)."""
        self.tasks.spawn_once(f"gather:{queue}", self._gather(queue, sources))

    async def _gather(self, queue: str, sources: Iterable[int]) -> None:
        """Move the queue's messages that wait on the partitions ``sources`` to its row's,
        when that is another (published just as the queue moved: :meth:`Placement.gather`);
        a consumer of the queue on another partition than the row's follows the row
        (:meth:`_rehome`)."""
        try:
            gathered = await self.placement.gather(queue, sources)
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
        if await self.placement.named(consumer.queue) == consumer.partition:
            return True
        consumer.retire()
        self.tasks.spawn_once(f"rehome:{consumer.queue}", self._rehome_quietly(consumer))
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
        loop = self.tasks.loop(f"queue:{queue}")
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
            if self.tasks.stopping:
                return  # the next start, or the queue's next head there, follows the row
            await self._delete_stale(queue, stale.partition)
            opened = await self._open_queue(queue)
        finally:
            self._opening.discard(queue)
        if opened:
            await self._gather(queue, [stale.partition])

    async def retry_refused(self) -> None:
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

    def expect(self, queues: Iterable[str]) -> None:
        """Have every one of ``queues`` (every queue known now) get its consumer behind
        the caller, ``warm_up_concurrency`` at a time, so that a first head finds one
        ready; :meth:`warmed` waits for them."""
        rest = [
            q for q in dict.fromkeys(queues) if q not in self.consumers and q not in self.refused
        ]
        if not rest:
            self._warmed.set()
        elif self.options.warm_up:
            self._warmed.clear()
            self.tasks.spawn_once("warm-up", self._warm_up(rest))

    async def _warm_up(self, queues: list[str]) -> None:
        began = time.monotonic()
        try:
            started = await self.add_queues(queues, concurrency=self.options.warm_up_concurrency)
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

    @property
    def all_warm(self) -> bool:
        return self._warmed.is_set()

    async def warmed(self) -> None:
        """Wait until every queue known at the last discovery has a consumer (or was
        refused one): start returns before the consumers of queues without work exist."""
        await self._warmed.wait()

    async def close(self) -> None:
        """Close every consumer and the shared inbox (their loops ended first)."""
        for consumer in self.consumers.values():
            await consumer.close()
        with contextlib.suppress(Exception):
            await self.inbox.close()

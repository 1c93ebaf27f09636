"""Which partition of the process stream each queue's consumer lives on, and moving a
queue to another partition when its stream refuses it a consumer.

The queue's row is the truth (``Queue.partition``): ingest publishes where the row says,
and the service opens the queue's consumer there. The row changes once, by
compare-and-set, from the partition that refused the queue to the lowest other one with
room (created when none has any); several replicas refused at once agree on the row's
new value, whichever wrote it. Where to move is decided from consumer counts read at
most every :data:`FRESH_S` and counted down by this replica's own moves, so a start
moving thousands of queues reads each partition about once; a partition overbooked by
another replica meanwhile refuses, and the queue moves on. Messages that a publish put
on another partition than the row's (it read the row just before the move) are gathered
to the row's partition (:meth:`Placement.gather`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from nats.js import JetStreamContext

from ...adapters.jetstream.partitions import (
    AccountLimits,
    account_limits,
    consumer_count,
    create_partition,
    move_waiting,
    partitions,
)
from ...adapters.jetstream.topology import MAX_PARTITIONS, Topology
from ...domain.entities import Queue, evolve
from ...domain.errors import AlreadyExists, NotFound
from ...ports.stores import QueueStore
from ...process.lifecycle import update_queue

log = logging.getLogger("stovepipe_fsm.service")

#: How long what a replica read about the partitions (the account's limits, a
#: partition's consumer count) is used before it is read again: long enough that a
#: start moving thousands of queues reads each partition about once, short enough that
#: room made by an operator (or by deleted consumers) is used soon after.
FRESH_S = 10.0
#: Reads of a listed partition whose stream is not found yet, and the pause before the
#: n-th (n times this): a partition just created by another replica.
LISTED_ATTEMPTS = 3
LISTED_PAUSE_S = 0.2


@dataclass
class _Seats:
    """Consumers a partition can still take, as read at ``read_at`` and counted down by
    this replica's own moves since."""

    left: int
    read_at: float


@dataclass(eq=False)
class Placement:
    """The service's view of the partitions, and the moves it makes."""

    js: JetStreamContext
    topology: Topology
    queues: QueueStore
    #: The partitions whose stream existed at the last :meth:`refresh` (0 always).
    known: list[int] = field(init=False, default_factory=lambda: [0])
    #: One choice of a target at a time in this replica, so that queues refused side
    #: by side each take a seat the one before left, and one creation of a partition.
    _choosing: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)
    _limits: tuple[AccountLimits, float] | None = field(init=False, default=None)
    _seats: dict[int, _Seats] = field(init=False, default_factory=dict)

    @property
    def spread(self) -> bool:
        """Whether any partition besides the process stream itself exists."""
        return len(self.known) > 1

    async def refresh(self) -> list[int]:
        self.known = sorted({0, *await partitions(self.js, self.topology)})
        return self.known

    async def partition_of(self, queue: str) -> int:
        """The partition ``queue``'s row names (0 for a queue without a row)."""
        if not self.spread:
            return 0  # no row can name another: a move creates its partition first
        return await self.named(queue)

    async def move(self, queue: str, source: int) -> int:
        """Move ``queue`` off ``source``, whose stream refused its consumer, to a partition
        with room; the partition the row names afterwards. A row another replica moved
        already is left as it is. A queue without a row (configured, nothing ingested
        yet) gets one naming the new partition, so its first head is published there.

        A queue another replica moved already (its row read before a target is chosen,
        and again before a partition is created for it) is given none: replicas refused
        side by side would otherwise create partitions no queue moves to."""
        async with self._choosing:
            target = await self._target(queue, source)
        if target is None:
            return await self.named(queue, source)
        moved = False

        def off_source(row: Queue) -> Queue:
            nonlocal moved
            moved = row.partition == source  # else another replica moved it already
            return evolve(row, partition=target) if moved else row

        try:
            row = await update_queue(self.queues, queue, off_source)
        except NotFound:
            try:
                await self.queues.create(Queue(name=queue, partition=target))
                row, moved = Queue(name=queue, partition=target), True
            except AlreadyExists:  # ingest created it meanwhile
                row = await update_queue(self.queues, queue, off_source)
        if not moved:
            return row.partition
        # One line per queue at info: past the limit every new queue moves, and the
        # warning worth reading is the partition's creation (partitions.py).
        log.info(
            "queue moved from partition %d to %d (%s): %s refused its consumer, holding as "
            "many as the account's JetStream consumer limit lets a stream hold",
            source,
            target,
            self.topology.process_stream_of(target),
            self.topology.process_stream_of(source),
            extra={"queue": queue},
        )
        return target

    async def named(self, queue: str, default: int = 0) -> int:
        """The partition ``queue``'s row names, read now whatever this replica knows of
        the partitions; ``default`` when it has no row."""
        try:
            return (await self.queues.get(queue)).partition
        except NotFound:
            return default

    async def _target(self, queue: str, source: int) -> int | None:
        """The lowest partition other than ``source`` with a seat left, taking it; the
        next partition, created, when none has one. ``source`` just refused a consumer,
        so it has none. ``None`` when ``queue``'s row no longer names ``source``."""
        if await self.named(queue, source) != source:
            return None
        now = time.monotonic()
        self._seats[source] = _Seats(0, now)
        limits = await self._account(now)
        for fresh in (False, True):
            if fresh:
                await self.refresh()  # another replica may have created partitions
            for partition in self.known:
                if partition == source:
                    continue
                seats = self._seats.get(partition)
                # A count read again now would lag this replica's own creations still
                # in flight: a partition counted down to no seat keeps none until then.
                if seats is None or now - seats.read_at >= FRESH_S:
                    count = await self._count(partition)
                    if count is None:
                        continue  # deleted since it was listed
                    seats = self._seats[partition] = _Seats(room(limits, count), now)
                if seats.left > 0:
                    seats.left -= 1
                    return partition
        if await self.named(queue, source) != source:
            return None  # moved while this replica read the partitions
        partition = next(p for p in range(1, MAX_PARTITIONS + 1) if p not in self.known)
        await create_partition(self.js, self.topology, partition, limits)
        self.known = sorted({*self.known, partition})
        count = await consumer_count(self.js, self.topology, partition) or 0
        self._seats[partition] = _Seats(room(limits, count) - 1, now)
        return partition

    async def _count(self, partition: int) -> int | None:
        """The consumers of a listed partition; ``None`` when its stream is gone. A
        stream another replica is creating is listed before its info answers on every
        node of a cluster: it is asked again a few times, or this replica would skip
        it and create another partition for nothing."""
        for attempt in range(1, LISTED_ATTEMPTS + 1):
            count = await consumer_count(self.js, self.topology, partition)
            if count is not None or attempt == LISTED_ATTEMPTS:
                return count
            await asyncio.sleep(LISTED_PAUSE_S * attempt)
        raise AssertionError("unreachable: the last attempt returns")

    async def _account(self, now: float) -> AccountLimits:
        if self._limits is None or now - self._limits[1] >= FRESH_S:
            self._limits = (await account_limits(self.js), now)
        return self._limits[0]

    async def gather(self, queue: str, sources: Iterable[int]) -> Gathered:
        """Move ``queue``'s messages waiting on the partitions ``sources`` (where a
        listing or a publish showed them, or where the queue was just moved from) to the
        one its row names: that partition, and how many were moved.

        Always toward the row, never toward a consumer: a replica whose consumer of the
        queue is on another partition (it opened it there just as another replica moved
        the queue) would otherwise pull the messages back, and the two would move them
        to and fro. Such a consumer follows the row instead (the service re-opens it
        there). A source this replica has not seen yet is a partition another replica
        created: the partitions are read again first, or the row would not be read."""
        sources = sorted(set(sources))
        if not set(sources) <= set(self.known):
            await self.refresh()
        partition = await self.partition_of(queue)
        moved = 0
        for other in sources:
            if other != partition:
                moved += await move_waiting(self.js, self.topology, queue, other, partition)
        return Gathered(partition, moved)


@dataclass(frozen=True)
class Gathered:
    """Where :meth:`Placement.gather` brought a queue's messages, and how many."""

    partition: int
    moved: int


def room(limits: AccountLimits, consumers: int) -> int:
    """Consumers a stream holding ``consumers`` can still take under ``limits``."""
    if limits.max_consumers <= 0:
        return 1 << 30  # no account limit: the stream's own is raised as it is reached
    return max(0, limits.max_consumers - consumers)

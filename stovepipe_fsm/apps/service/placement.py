"""Which partition of the process stream each queue's consumer lives on, and moving a
queue to another partition when its stream refuses it a consumer.

The queue's row is the truth (``Queue.partition``): ingest publishes where the row says,
and the service opens the queue's consumer there. The row changes once, by
compare-and-set, from the partition that refused the queue to the one
:func:`partition_with_room` picks; several replicas refused at once agree on the row's
new value, whichever wrote it. Messages that a publish put on another partition than the
row's (it read the row just before the move) are gathered to the row's partition
(:meth:`Placement.gather`).
"""

from __future__ import annotations

import asyncio
import logging

from nats.js import JetStreamContext

from ...adapters.jetstream.partitions import move_waiting, partition_with_room, partitions
from ...adapters.jetstream.topology import Topology
from ...domain.entities import Queue, evolve
from ...domain.errors import AlreadyExists, NotFound, Retryable, VersionMismatch
from ...ports.stores import QueueStore

log = logging.getLogger("stovepipe_fsm.service")

#: Compare-and-set tries of one move before giving up for this round (a busy queue's row
#: is written by every decision).
MOVE_CAS_ATTEMPTS = 20


class Placement:
    """The service's view of the partitions, and the moves it makes."""

    def __init__(self, js: JetStreamContext, topology: Topology, queues: QueueStore) -> None:
        self.js = js
        self.topology = topology
        self.queues = queues
        #: The partitions whose stream existed at the last :meth:`refresh` (0 always).
        self.known: list[int] = [0]
        #: One move at a time in this replica: queues opened side by side that are refused
        #: together would otherwise each read the partitions and race to create the same
        #: one; in turn, each sees the room the one before took.
        self._moving = asyncio.Lock()

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
        try:
            return (await self.queues.get(queue)).partition
        except NotFound:
            return 0

    async def move(self, queue: str, source: int) -> int:
        """Move ``queue`` off ``source``, whose stream refused its consumer, to a partition
        with room; the partition the row names afterwards. A row another replica moved
        already is left as it is. A queue without a row (configured, nothing ingested
        yet) gets one naming the new partition, so its first head is published there."""
        async with self._moving:
            return await self._move(queue, source)

    async def _move(self, queue: str, source: int) -> int:
        target = await partition_with_room(self.js, self.topology, leave=source)
        if target not in self.known:
            self.known = sorted({*self.known, target})
        for _ in range(MOVE_CAS_ATTEMPTS):
            try:
                row = await self.queues.get(queue)
            except NotFound:
                try:
                    await self.queues.create(Queue(name=queue, partition=target))
                except AlreadyExists:
                    continue
                break
            if row.partition != source:
                return row.partition
            try:
                await self.queues.update(
                    evolve(row, partition=target), row.version, row.version + 1
                )
            except VersionMismatch:
                continue
            break
        else:
            raise Retryable(f"queue {queue!r}: row contended; not moved to partition {target}")
        log.warning(
            "queue moved from partition %d to %d (%s): %s refused its consumer, holding as "
            "many as the account's JetStream consumer limit lets a stream hold",
            source,
            target,
            self.topology.process_stream_of(target),
            self.topology.process_stream_of(source),
            extra={"queue": queue},
        )
        return target

    async def gather(self, queue: str, partition: int) -> int:
        """Move ``queue``'s messages waiting on any other known partition to
        ``partition``; how many were moved."""
        moved = 0
        for other in self.known:
            if other != partition:
                moved += await move_waiting(self.js, self.topology, queue, other, partition)
        return moved

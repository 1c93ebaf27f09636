"""Finding the queues a service must serve, and the messages no queue will ever take.

A publish for a queue without a consumer starts one at once (:meth:`Discovery.published`).
Behind that, a discovery round every ``discover_interval_s`` lists the process subjects
with messages waiting and the queues bucket's rows (one request each, whatever the
number of queues): a queue with work and no consumer gets one, every other queue known
gets one behind the round (:meth:`.QueueConsumers.expect`), and the messages of process
subjects that no queue row stands for are dead-lettered instead of sitting there for
ever. One round runs at a time, whether the loop, a publish of an unknown queue or a
reconnect started it.

Orphans: ingest creates a queue's row before it publishes the queue's first message, so
a message on a process subject whose queue has no row (published by hand or by a broken
producer, or on a token that decodes to no queue name) has no consumer and never will.
It gets the treatment of a poison message: a termination mark, a bounded dead-letter
record, then its deletion from the stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import KW_ONLY, dataclass, field

from nats.js import JetStreamContext

from ...adapters.jetstream import Topology
from ...adapters.jetstream.consumer import Observer
from ...adapters.jetstream.dead_letter import DeadLetter, publish_dead_letter
from ...adapters.jetstream.errors import translated
from ...adapters.jetstream.names import InvalidToken, decode_queue_token
from ...adapters.jetstream.partitions import delete_stored, stored_messages, waiting_subjects
from ...adapters.jetstream.terminations import TerminationLedger, TerminationMark
from ...domain.bounded_text import clip
from ...domain.errors import NotFound
from ...ports.config import ConfigStore
from ...ports.stores import QueueStore
from .queue_consumers import QueueConsumers
from .tasks import ServiceTasks

log = logging.getLogger("stovepipe_fsm.service")

#: The most messages of one subject dead-lettered per round: a flood is worked off over
#: several rounds instead of stalling discovery.
MAX_PER_SUBJECT = 100


def orphan_subjects(
    topology: Topology, subjects: dict[str, int], served: Collection[str]
) -> dict[str, str]:
    """``{subject: queue}`` of the subjects no consumer serves; the queue is the decoded
    name, or the raw token when it decodes to none."""
    head = _head(topology)
    out = {}
    for subject in subjects:
        try:
            queue = topology.queue_of_process_subject(subject)
        except ValueError:
            out[subject] = subject[len(head) :] if subject.startswith(head) else subject
            continue
        if queue not in served:
            out[subject] = queue
    return out


async def dead_letter_orphans(
    js: JetStreamContext,
    topology: Topology,
    terminations: TerminationLedger,
    orphans: dict[str, str],
    observe: Observer,
) -> int:
    """Dead-letter the messages of ``orphans`` (at most :data:`MAX_PER_SUBJECT` each);
    how many were."""
    done = 0
    for subject, queue in sorted(orphans.items()):
        stream = topology.process_stream_of_subject(subject)
        async for raw in stored_messages(js, stream, subject, MAX_PER_SUBJECT):
            seq = int(raw.seq or 0)
            reason = f"no queue row for {clip(queue, 200)!r}: no consumer serves its subject"
            letter = DeadLetter.bounded(queue, "", reason, 0, seq)
            await terminations.mark(seq, TerminationMark(letter.queue, ""))
            token = subject[len(_head(topology)) :]
            dlq_subject = f"{topology.prefix}.dlq.process.{token}"
            await publish_dead_letter(js, topology, letter, subject=dlq_subject)
            if not await delete_stored(js, stream, seq):
                # Two discovery rounds at once (the loop's and one a reconnect or a
                # publish started): the other deleted it, after the same mark and the
                # same dead letter (its msg id dedupes), and counted it.
                continue
            observe("orphan", queue, "", reason)
            log.error("orphan dead-lettered: %s", reason, extra={"queue": clip(queue, 200)})
            done += 1
    return done


def _head(topology: Topology) -> str:
    return f"{topology.prefix}.process."


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


@dataclass(eq=False)
class Discovery:
    """The discovery rounds of one service, and the queues a publish names."""

    js: JetStreamContext
    topology: Topology
    queues: QueueConsumers
    config: ConfigStore
    tasks: ServiceTasks
    _: KW_ONLY
    rows: QueueStore
    terminations: TerminationLedger
    observe: Observer
    interval_s: float
    #: One discovery round at a time: the loop's, and one a publish of an unknown
    #: queue or a reconnect starts, would otherwise list and act side by side (two
    #: dead-letterings of one orphan, two moves of one stray message).
    _discovering: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)

    async def start(self) -> None:
        """The first round, which also binds the consumers listed on start; then a round
        every interval.

        Start waits only for the consumers that exist and the queues with work waiting;
        the rest are created behind it (a first start on 10,000 queues would otherwise
        wait minutes for the broker to create consumers of queues with nothing to do).
        One listing of each serves the binding and the first round."""
        async with self._discovering:
            subjects, known = await self._listings()
            await self.queues.bind_listed((*self.config.configured_queues(), *known))
            await self._discover_from(subjects, known)
        self.tasks.spawn(
            "discover", self.tasks.every(self.interval_s, self.discover, "queue discovery")
        )

    async def discover(self) -> list[str]:
        """Start the consumers of queues with messages waiting, dead-letter the messages of
        process subjects that no queue row stands for (orphans), and have every
        other queue of the queues bucket and the config get its consumer behind it.
        Returns the queues started now, for waiting messages."""
        async with self._discovering:
            return await self._discover_from(*await self._listings())

    def discover_soon(self) -> None:
        """A round now, in a task of its own, unless one is already asked for."""
        self.tasks.spawn_once("discover-now", self._discover_quietly())

    async def _listings(self) -> tuple[dict[str, int], list[str]]:
        """The process subjects of every partition, then the queues bucket's rows, in that
        order: a queue row always exists before its first message, so a subject whose
        queue has no row in the listing read after it is an orphan."""
        known = await self.queues.placement.refresh()
        subjects = await waiting_subjects(self.js, self.topology, known)
        return subjects, await known_queues(self.js, self.topology)

    async def _discover_from(self, subjects: dict[str, int], known: list[str]) -> list[str]:
        """:meth:`discover` on listings read by :meth:`_listings`."""
        await self.queues.retry_refused()
        rows = set(known)
        waiting = []
        for subject in subjects:
            try:
                queue, partition = self.topology.process_address(subject)
            except ValueError:
                continue  # an orphan subject, which decodes to no queue
            consumer = self.queues.consumers.get(queue)
            if consumer is None:
                if queue in rows:
                    waiting.append(queue)
            elif consumer.partition != partition:
                self.queues.gather_soon(queue, [partition])
        started = await self.queues.add_queues(waiting)
        served = {*known, *self.queues.consumers}
        orphans = orphan_subjects(self.topology, subjects, served)
        if orphans:
            await dead_letter_orphans(
                self.js, self.topology, self.terminations, orphans, self.observe
            )
        self.queues.expect((*self.config.configured_queues(), *known))
        return started

    def published(self, queue: str) -> None:
        """A publish for ``queue``, which has no consumer: one is started, if ingest made
        its row (:meth:`_add_if_ingested`)."""
        if not self.queues.busy(queue):
            self.tasks.spawn_once(f"add:{queue}", self._add_if_ingested(queue))

    async def _add_if_ingested(self, queue: str) -> None:
        """A publish for a queue not served yet: start its consumer if ingest made its row
        (ingest writes the row before it publishes); else the subject is an orphan, and a
        discovery round now dead-letters it. A flood of forged subjects therefore costs a
        row read each and one discovery at a time, never a consumer each."""
        try:
            await self.rows.get(queue)
        except NotFound:
            self.discover_soon()
            return
        except Exception as exc:  # discovery retries it
            log.warning("consumer not started: %s: %s", type(exc).__name__, exc)
            return
        try:
            await self.queues.add_queue(queue)
        except Exception as exc:  # discovery retries it
            log.warning("consumer not started: %s: %s", type(exc).__name__, exc)

    async def _discover_quietly(self) -> None:
        try:
            await self.discover()
        except Exception as exc:  # the next round retries
            log.warning("queue discovery failed: %s: %s", type(exc).__name__, exc)

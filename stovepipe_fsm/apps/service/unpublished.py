"""Heads accepted with no process message: published again, so none waits for ever.

Ingest writes a head's rows, then publishes its process message (persist before
publish). An ingest cut short between the two (``ingest --from`` killed, the broker lost
mid-batch) leaves heads in the request machine's initial state that no consumer will
ever deliver, unless someone runs the same batch again. Every ``interval_s`` the service
looks for them and publishes each one's message, as ingest would have:

1. the process subjects with messages, and how many (one stream info per partition);
2. the request rows (one bulk read), those in the initial state by queue; a queue whose
   waiting heads are no more than its messages is complete, and is not read further;
3. for each other queue, the request each of its messages names, and the requests the
   service dead-lettered (termination marks: their message was taken on purpose, and the
   reconciler is failing them closed);
4. a head with neither, ingested at least ``min_age_s`` ago, is read again and, still
   waiting, published under its request id, the process message's own dedup id: an
   ingest that was only slow publishes the same message, and the broker keeps one.

Each head published is logged (a warning naming it) and counted
(``stovepipe_runtime_events_total{event="republished"}``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.js import JetStreamContext

from ...adapters.jetstream import Topology
from ...adapters.jetstream.bulk import kv_rows, kv_snapshot
from ...adapters.jetstream.codec import decode_request, decode_work
from ...adapters.jetstream.consumer import Observer
from ...adapters.jetstream.partitions import stored_messages, waiting_subjects
from ...adapters.jetstream.terminations import MARK_PREFIX, TerminationMark
from ...domain.entities import Request
from ...domain.errors import NonRetryable, NotFound
from ...ports.clock import Clock
from ...ports.publisher import Publisher
from ...ports.stores import QueueStore, RequestStore

log = logging.getLogger("stovepipe_fsm.service")

#: The most messages of one queue read to find which requests they name; a queue with
#: more waiting is looked at again next round (its heads are not lost meanwhile).
MAX_READ_PER_QUEUE = 10_000


@dataclass(frozen=True)
class UnpublishedHeads:
    """Finds waiting heads without a process message and publishes theirs."""

    js: JetStreamContext
    topology: Topology
    requests: RequestStore
    queues: QueueStore
    publisher: Publisher
    clock: Clock
    #: The request machine's initial state in force (the policy may be reloaded).
    initial: Callable[[], str]
    #: The partitions of the process stream to list (:meth:`.Placement.refresh`).
    partitions: Callable[[], Awaitable[list[int]]]
    observe: Observer
    min_age_s: float

    async def scan(self) -> list[str]:
        """One round: the ids of the heads published now."""
        counts: dict[str, int] = {}
        for subject, count in (
            await waiting_subjects(self.js, self.topology, await self.partitions())
        ).items():
            try:
                queue, _ = self.topology.process_address(subject)
            except ValueError:
                continue  # an orphan's: discovery dead-letters it
            counts[queue] = counts.get(queue, 0) + count
        waiting = await self._waiting_heads()
        short = {q: heads for q, heads in waiting.items() if len(heads) > counts.get(q, 0)}
        if not short:
            return []
        given_up = await self._dead_lettered()
        published = []
        oldest = self.clock.now_ms() - int(self.min_age_s * 1000)
        for queue, heads in sorted(short.items()):
            named = await self._named_by_messages(queue, counts.get(queue, 0))
            if named is None:
                continue
            for head in heads:
                if head.id in named or head.id in given_up or head.ingested_at_ms > oldest:
                    continue
                if await self._publish_if_waiting(head):
                    published.append(head.id)
        return published

    async def _waiting_heads(self) -> dict[str, list[Request]]:
        initial = self.initial()
        out: dict[str, list[Request]] = {}
        for row in await kv_rows(self.js, self.topology.requests_bucket):
            try:
                request = decode_request(row.value)
            except NonRetryable:
                continue  # shown by status; nothing to publish for it
            if request.state == initial:
                out.setdefault(request.queue, []).append(request)
        return out

    async def _dead_lettered(self) -> set[str]:
        """The requests whose process message the service gave up on."""
        marks = await kv_snapshot(self.js, self.topology.attempts_bucket, f"{MARK_PREFIX}.>")
        found = (TerminationMark.decode(value) for _, value in marks)
        return {mark.request_id for mark in found if mark is not None}

    async def _named_by_messages(self, queue: str, count: int) -> set[str] | None:
        """The requests the queue's process messages name; None when there are too many
        to read this round."""
        if count > MAX_READ_PER_QUEUE:
            return None
        try:
            partition = (await self.queues.get(queue)).partition
        except NotFound:
            return None  # no row: discovery's business
        stream = self.topology.process_stream_of(partition)
        subject = self.topology.process_subject(queue, partition)
        named = set()
        async for raw in stored_messages(self.js, stream, subject, MAX_READ_PER_QUEUE):
            try:
                named.add(decode_work(raw.data).request_id)
            except NonRetryable:
                continue
        return named

    async def _publish_if_waiting(self, head: Request) -> bool:
        """Publish ``head``'s process message if its row still waits (read again: an
        admission or an end since the bulk read needs no message)."""
        try:
            now = await self.requests.get(head.id)
            partition = (await self.queues.get(head.queue)).partition
        except NotFound:
            return False
        if now.state != self.initial():
            return False
        await self.publisher.publish_process(head.queue, head.id, partition)
        self.observe("republished", head.queue, head.id, "accepted with no process message")
        log.warning(
            "head accepted with no process message (an ingest cut short): published",
            extra={"queue": head.queue, "request_id": head.id},
        )
        return True

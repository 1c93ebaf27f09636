"""Ingest: turn a reported trunk head into an accepted Request and a process message.

A new head costs four sequential broker round trips, each step safe to repeat:

1. mint an id from the queue's counter, and read the Queue row beside it (concurrently);
2. claim (queue, uri) in the dedup index with that id, a create that fails on existence:
   a re-ingest finds the existing id instead, and the minted value is spent (a counter
   value is never reused, so ids stay monotonic per queue, with gaps);
3. concurrently: create the Request, CAS the Queue row's ``latest_request_id`` forward
   only (or create the row), and append the ``ingested`` trail record;
4. publish the ProcessRequest - last, so the consumer always finds 1-3 durable.

A crash inside 3 may leave any subset of its writes: ``latest`` naming a request whose
row is not written yet only makes older heads superseded (a newer head does exist); the
next ingest of the uri (the poller's next round) finds the dedup entry and heals.
An ingest that has seen the uri before (this instance remembers recent heads), or is told
``at_head`` (a poller, whose head is most often unchanged since its last round), reads the
dedup entry beside the Queue row first and mints only for a head it does not find: an
unchanged head spends no counter value, a new one costs a fifth round trip. A re-ingest
of a URI whose Request is still waiting (in the request machine's initial state) redoes
3-4: it heals a crash anywhere in the sequence and a lost publish. A re-ingest of a
Request past its initial state publishes nothing (a superseded URI is never re-validated).

:meth:`Ingest.ingest_many` is the batch path: it takes every head first (so a bad head
fails the batch before any write), then per queue mints one block of ids in one counter
write and pipelines the claims, the rows and the publishes of all new heads. A batch is
not one transaction: "nothing half-written" means that no single head is ever left in a
state a repeat cannot finish - every head is ingested by the same steps, each safe to
repeat, so a batch cut short by a crash or a broker error is completed by running it
again, and a batch refused for a bad head wrote nothing at all.

A head trunk returns to (a rollback by force-push to a commit already ingested) is
validated again only on the word of someone who just saw the ref name it: with
``at_head=True`` (the poller, which resolves the ref each round), a URI whose request is
no longer the queue's latest is ingested as a new head - a fresh request id, the dedup
entry re-pointed at it by compare-and-set - so it is the latest again and coalescing
treats it like any new head. Without ``at_head`` (an upstream event, possibly late or
duplicated) the dedup entry decides, and ``latest`` only ever moves forward.

An operator's ``retry`` of a head that ended (:meth:`Ingest.again`) is the same move made
on an operator's word: a fresh request for the commit, naming the old one in
``retry_of``, the dedup entry re-pointed at it by compare-and-set.

Ingest runs no policy: of the request machine it needs only the initial state, given at
construction. The service passes its machine's; the ``ingest`` command passes the one the
running service recorded, so an operator's ingest never loads a machine file.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..domain.entities import Queue, Request, evolve
from ..domain.errors import AlreadyExists, IllegalOperation, NotFound, VersionMismatch
from ..domain.ids import compare_request_id, format_request_id, parse_request_id
from ..domain.queue_names import validate_queue_name
from ..domain.trail_record import INGESTED, TrailRecord, detail
from ..ports.clock import Clock
from ..ports.decision_trail import DecisionTrail
from ..ports.publisher import Publisher
from ..ports.stores import Counter, QueueStore, RequestStore, UriIndex
from ..process.lifecycle import update_queue
from ..process.services import StageServices
from ..process.together import all_of, together


class InvalidUri(ValueError):
    """A URI that cannot name a commit (empty, whitespace, control characters)."""


@dataclass(frozen=True)
class IngestResult:
    request_id: str
    created: bool
    published: bool
    #: A new request for a head trunk returned to (``at_head``), not a first sighting.
    returned: bool = False


def validate_uri(uri: object) -> str:
    if not isinstance(uri, str) or not uri:
        raise InvalidUri("uri must be a non-empty string")
    if any(c.isspace() or ord(c) < 32 for c in uri):
        raise InvalidUri(f"uri {uri!r} contains whitespace or control characters")
    if len(uri) > 1024:
        raise InvalidUri(f"uri is {len(uri)} characters; at most 1024 allowed")
    return uri


#: Heads an ingester remembers having seen, so their re-ingest reads before it mints.
REMEMBERED_HEADS = 16_384
#: Heads of one queue a batch pipelines at once (claims, rows, publishes in flight).
BATCH_WINDOW = 64
#: Queues a batch works on at once.
BATCH_QUEUES = 32


@dataclass(frozen=True)
class Head:
    """One head to ingest: what a line of ``ingest --from`` names."""

    queue: str
    uri: str
    at_head: bool = False

    def checked(self) -> Head:
        validate_queue_name(self.queue)
        validate_uri(self.uri)
        return self


class Ingest:
    def __init__(
        self,
        *,
        initial_state: str,
        requests: RequestStore,
        queues: QueueStore,
        publisher: Publisher,
        uri_index: UriIndex,
        counter: Counter,
        clock: Clock,
        trail: DecisionTrail | None = None,
    ) -> None:
        if not initial_state:
            raise ValueError("ingest needs the request machine's initial state")
        self.initial_state = initial_state
        self.requests = requests
        self.queues = queues
        self.publisher = publisher
        self.uri_index = uri_index
        self.counter = counter
        self.clock = clock
        self.trail = trail
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()

    @classmethod
    def on(cls, services: StageServices, *, uri_index: UriIndex, counter: Counter) -> Ingest:
        """Ingest beside the other stages, with their stores and their machine."""
        return cls(
            initial_state=services.roles.initial,
            requests=services.requests,
            queues=services.queues,
            publisher=services.publisher,
            uri_index=uri_index,
            counter=counter,
            clock=services.clock,
            trail=services.trail,
        )

    async def ingest(self, queue: str, uri: str, *, at_head: bool = False) -> IngestResult:
        """Accept ``uri`` as a head of ``queue``.

        ``at_head``: the caller just saw the ref name ``uri`` (a poller's observation, not
        a forwarded event), so a head the queue had moved on from is a return to it.
        """
        validate_queue_name(queue)
        validate_uri(uri)
        minted = ""
        if at_head or self._remembers(queue, uri):
            request_id, row = await together(
                self.uri_index.get(queue, uri), self._queue_row(queue)
            )
        else:
            number, row = await together(self.counter.next(queue), self._queue_row(queue))
            minted, request_id = format_request_id(queue, number), None
        if request_id is None:
            minted = minted or format_request_id(queue, await self.counter.next(queue))
            request_id = await self.uri_index.put_if_absent(queue, uri, minted)
            if request_id == minted:
                self._remember(queue, uri)
                partition = await self._write_new(queue, row, [(request_id, uri, False)])
                await self.publisher.publish_process(queue, request_id, partition)
                return IngestResult(request_id, True, published=True)
        self._remember(queue, uri)
        return await self._known(queue, uri, at_head, row, request_id, minted)

    async def _known(
        self,
        queue: str,
        uri: str,
        at_head: bool,
        row: Queue | None,
        request_id: str,
        minted: str = "",
    ) -> IngestResult:
        """A head the dedup index already names: a return to it, or a re-ingest."""
        if at_head and _moved_on_from(row, queue, request_id):
            minted = minted or format_request_id(queue, await self.counter.next(queue))
            request_id = await self.uri_index.repoint(queue, uri, request_id, minted)
            if request_id == minted:
                partition = await self._write_new(queue, row, [(request_id, uri, True)])
                await self.publisher.publish_process(queue, request_id, partition)
                return IngestResult(request_id, True, published=True, returned=True)
        return await self._heal(queue, row, request_id, uri)

    async def ingest_many(
        self, heads: Iterable[Head], *, window: int = BATCH_WINDOW
    ) -> list[IngestResult]:
        """Ingest many heads in one call; results in the order of ``heads``.

        Every head is checked before the first write, so a bad one raises and nothing is
        written. Per queue, the heads not seen before get one block of ids (in the order
        given) from one counter write, and their claims, rows and publishes are pipelined
        ``window`` heads at a time; queues are worked on concurrently. A head listed twice
        is ingested once. Heads already known go through :meth:`ingest` one by one, which
        keeps the ``at_head`` return rule.
        """
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        checked = [head.checked() for head in heads]
        by_queue: dict[str, list[Head]] = {}
        for head in checked:
            by_queue.setdefault(head.queue, []).append(head)
        results: dict[tuple[str, str], IngestResult] = {}
        gate = asyncio.Semaphore(BATCH_QUEUES)

        async def one_queue(queue: str, queue_heads: list[Head]) -> None:
            async with gate:
                firsts: dict[str, Head] = {}
                for head in queue_heads:  # the first listing of each uri, in listed order
                    firsts.setdefault(head.uri, head)
                distinct = list(firsts.values())
                for at in range(0, len(distinct), window):
                    chunk = distinct[at : at + window]
                    results.update(await self._ingest_window(queue, chunk))

        await all_of(one_queue(q, hs) for q, hs in by_queue.items())
        return [results[(head.queue, head.uri)] for head in checked]

    async def _ingest_window(
        self, queue: str, heads: Sequence[Head]
    ) -> dict[tuple[str, str], IngestResult]:
        row, found = await together(
            self._queue_row(queue),
            all_of(self.uri_index.get(queue, h.uri) for h in heads),
        )
        fresh = [h for h, request_id in zip(heads, found, strict=True) if request_id is None]
        results: dict[tuple[str, str], IngestResult] = {}
        if fresh:
            last = await self.counter.reserve(queue, len(fresh))
            ids = [format_request_id(queue, last - len(fresh) + 1 + i) for i in range(len(fresh))]
            claimed = await all_of(
                self.uri_index.put_if_absent(queue, h.uri, rid)
                for h, rid in zip(fresh, ids, strict=True)
            )
            new = [
                (rid, h.uri, False)
                for h, rid, got in zip(fresh, ids, claimed, strict=True)
                if got == rid
            ]
            if new:
                partition = await self._write_new(queue, row, new)
                await all_of(
                    self.publisher.publish_process(queue, rid, partition) for rid, _, _ in new
                )
            for h, rid, got in zip(fresh, ids, claimed, strict=True):
                self._remember(queue, h.uri)
                if got == rid:
                    results[(queue, h.uri)] = IngestResult(rid, True, published=True)
                else:  # another ingester claimed it first: its id, healed if need be
                    results[(queue, h.uri)] = await self._known(queue, h.uri, h.at_head, row, got)
        for h, request_id in zip(heads, found, strict=True):
            if request_id is not None:
                self._remember(queue, h.uri)
                results[(queue, h.uri)] = await self._known(
                    queue, h.uri, h.at_head, row, request_id
                )
        return results

    async def _write_new(
        self, queue: str, row: Queue | None, new: Sequence[tuple[str, str, bool]]
    ) -> int:
        """Create the requests, stamp the newest as latest and note them, concurrently;
        the queue's partition, as the stamp found it."""
        now = self.clock.now_ms()
        writes: list[Awaitable[Any]] = [self._stamp_latest(queue, row, max_id(new))]
        for request_id, uri, returned in new:
            request = Request(
                id=request_id, queue=queue, uri=uri, state=self.initial_state, ingested_at_ms=now
            )
            writes.append(self._create_request(request))
            writes.append(self._note(request, returned))
        partition: int = (await all_of(writes))[0]
        return partition

    async def _heal(self, queue: str, row: Queue | None, request_id: str, uri: str) -> IngestResult:
        """A known head: finish whatever an earlier ingest of it left undone."""
        request = await self._ensure_request(request_id, queue, uri)
        if request.state != self.initial_state:  # admitted or ended: nothing to heal
            writes: list[Awaitable[Any]] = [self._note(request, False)]
            if row is None:
                writes.append(self._create_queue(Queue(name=queue)))
            await all_of(writes)
            return IngestResult(request_id, False, published=False)
        _, partition = await together(
            self._note(request, False), self._stamp_latest(queue, row, request_id)
        )
        await self.publisher.publish_process(queue, request_id, partition)
        return IngestResult(request_id, False, published=True)

    async def again(self, old: Request, *, newest: bool = True) -> IngestResult:
        """A new request for ``old``'s commit, linked to it by ``retry_of``.

        The dedup entry is re-pointed from ``old`` to a fresh id by compare-and-set, so a
        second call (or a racing one) finds that request (``created`` False) instead of
        making another; an entry already re-pointed whose request was never written (a
        crash) is healed as the retry. The caller checked that ``old`` ended and that no
        newer head was ingested since. The id is minted only if the counter still stands
        at ``old``'s number, in one compare-and-set: a head that took an id since (even
        one not yet written) refuses the retry (``IllegalOperation``), so a retry never
        takes an id above a newer head's and ``latest`` never moves backwards. With
        ``newest`` False (a policy that validates every head) the id is minted as any
        head's is.
        """
        queue, uri = old.queue, old.uri
        request_id = await self.uri_index.get(queue, uri)
        created = False
        if request_id in (None, old.id):
            last = parse_request_id(old.id).counter
            number = (
                await self.counter.next_after(queue, last)
                if newest
                else await self.counter.next(queue)
            )
            if number is None:
                request_id = await self.uri_index.get(queue, uri)
                if request_id in (None, old.id):  # not a racing retry of the same head
                    raise IllegalOperation(
                        f"an id of queue {queue} was taken after {old.id} (a newer head, "
                        "possibly being ingested right now); retrying it would move "
                        "trunk validation backwards"
                    )
            else:
                minted = format_request_id(queue, number)
                request_id = await self.uri_index.repoint(queue, uri, old.id, minted)
                created = request_id == minted
        assert request_id is not None
        request = await self._ensure_request(request_id, queue, uri, retry_of=old.id)
        if self.trail is not None:
            why = detail(uri=uri, retry_of=request.retry_of)
            at = request.ingested_at_ms or self.clock.now_ms()
            await self.trail.append(TrailRecord(INGESTED, queue, request_id, at, detail=why))
        if request.state != self.initial_state:
            return IngestResult(request_id, created, published=False)
        partition = await self._stamp_latest(queue, await self._queue_row(queue), request_id)
        await self.publisher.publish_process(queue, request_id, partition)
        return IngestResult(request_id, created, published=True)

    async def _note(self, request: Request, returned: bool) -> None:
        # Every ingest of a head notes it; the key keeps one record.
        if self.trail is None:
            return
        why = detail(uri=request.uri, returned="yes" if returned else "")
        at = request.ingested_at_ms or self.clock.now_ms()
        await self.trail.append(TrailRecord(INGESTED, request.queue, request.id, at, detail=why))

    def _remembers(self, queue: str, uri: str) -> bool:
        key = (queue, uri)
        if key in self._seen:
            self._seen.move_to_end(key)
            return True
        return False

    def _remember(self, queue: str, uri: str) -> None:
        self._seen[(queue, uri)] = None
        self._seen.move_to_end((queue, uri))
        while len(self._seen) > REMEMBERED_HEADS:
            self._seen.popitem(last=False)

    async def _queue_row(self, name: str) -> Queue | None:
        try:
            return await self.queues.get(name)
        except NotFound:
            return None

    async def _create_queue(self, row: Queue) -> bool:
        """Create the row; False when another writer created it first."""
        try:
            await self.queues.create(row)
        except AlreadyExists:
            return False
        return True

    async def _create_request(self, request: Request) -> None:
        with contextlib.suppress(AlreadyExists):  # a repeat after a lost reply
            await self.requests.create(request)

    async def _ensure_request(
        self, request_id: str, queue: str, uri: str, *, retry_of: str = ""
    ) -> Request:
        try:
            return await self.requests.get(request_id)
        except NotFound:
            pass
        request = Request(
            id=request_id,
            queue=queue,
            uri=uri,
            state=self.initial_state,
            ingested_at_ms=self.clock.now_ms(),
            retry_of=retry_of,
        )
        try:
            await self.requests.create(request)
        except AlreadyExists:
            return await self.requests.get(request_id)
        return request

    async def _stamp_latest(self, queue: str, row: Queue | None, request_id: str) -> int:
        """Move ``latest_request_id`` forward to ``request_id`` (never back); return the
        queue's partition as of that write (a new row's is 0), which the publish after it
        names.

        ``row`` is the row as read moments ago: the write names its version, so it costs
        one round trip unless someone wrote the row since (then it reads and retries).
        """

        def forward(current: Queue) -> Queue:
            latest = current.latest_request_id
            if latest and compare_request_id(queue, request_id, latest) <= 0:
                return current
            return evolve(current, latest_request_id=request_id)

        if row is None:
            if await self._create_queue(Queue(name=queue, latest_request_id=request_id)):
                return 0
        else:
            target = forward(row)
            if target == row:
                return row.partition
            with contextlib.suppress(VersionMismatch):
                await self.queues.update(target, row.version, row.version + 1)
                return row.partition
        return (await update_queue(self.queues, queue, forward)).partition


def _moved_on_from(row: Queue | None, queue: str, request_id: str) -> bool:
    """A newer head than ``request_id`` was ingested on ``queue`` (as ``row`` says)."""
    latest = row.latest_request_id if row is not None else ""
    return bool(latest) and compare_request_id(queue, latest, request_id) > 0


def max_id(new: Sequence[tuple[str, str, bool]]) -> str:
    """The newest of the ids of ``new`` (requests of one queue)."""
    return max((request_id for request_id, _, _ in new), key=lambda r: parse_request_id(r).counter)

"""Ingest: turn a reported trunk head into an accepted Request and a process message.

Order of writes, each one safe to repeat:

1. claim (queue, uri) in the dedup index with a freshly minted id; a re-ingest finds the
   existing id instead (a counter value spent on a lost race is never reused);
2. get-or-create the Queue row;
3. create the Request (``AlreadyExists`` after a crash between 1 and 3 is fine);
4. CAS ``latest_request_id`` forward only, never backward;
5. publish the ProcessRequest - last, so the consumer always finds 1-4 durable.

A re-ingest of a URI whose Request is still waiting (in the request machine's initial
state) redoes 2-5: it heals a crash anywhere in the sequence and a lost publish. A
re-ingest of a Request past its initial state publishes nothing (a superseded URI is
never re-validated).

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

import contextlib
from dataclasses import dataclass, replace

from ..domain.entities import Queue, Request
from ..domain.errors import AlreadyExists, NotFound
from ..domain.ids import compare_request_id, format_request_id
from ..domain.queue_names import validate_queue_name
from ..domain.trail import INGESTED, TrailRecord, detail
from ..ports.clock import Clock
from ..ports.publisher import Publisher
from ..ports.stores import Counter, QueueStore, RequestStore, UriIndex
from ..ports.trail import DecisionTrail
from ..process.lifecycle import update_queue
from ..process.services import StageServices


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
        request_id = await self.uri_index.get(queue, uri)
        created = returned = False
        if request_id is None:
            minted = format_request_id(queue, await self.counter.next(queue))
            request_id = await self.uri_index.put_if_absent(queue, uri, minted)
            created = request_id == minted
        elif at_head and await self._moved_on_from(queue, request_id):
            minted = format_request_id(queue, await self.counter.next(queue))
            request_id = await self.uri_index.repoint(queue, uri, request_id, minted)
            created = returned = request_id == minted
        await self._ensure_queue(queue)
        request = await self._ensure_request(request_id, queue, uri)
        if self.trail is not None:
            # Every ingest of a waiting head notes it; the key keeps one record.
            why = detail(uri=uri, returned="yes" if returned else "")
            at = request.ingested_at_ms or self.clock.now_ms()
            await self.trail.append(TrailRecord(INGESTED, queue, request_id, at, detail=why))
        if request.state != self.initial_state:  # admitted or ended: nothing to heal
            return IngestResult(request_id, created, published=False, returned=returned)
        await self._stamp_latest(queue, request_id)
        await self.publisher.publish_process(queue, request_id)
        return IngestResult(request_id, created, published=True, returned=returned)

    async def again(self, old: Request) -> IngestResult:
        """A new request for ``old``'s commit, linked to it by ``retry_of``.

        The dedup entry is re-pointed from ``old`` to a fresh id by compare-and-set, so a
        second call (or a racing one) finds that request (``created`` False) instead of
        making another; an entry already re-pointed whose request was never written (a
        crash) is healed as the retry. The caller checked that ``old`` ended and that no
        newer head was ingested since.
        """
        queue, uri = old.queue, old.uri
        request_id = await self.uri_index.get(queue, uri)
        created = False
        if request_id in (None, old.id):
            minted = format_request_id(queue, await self.counter.next(queue))
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
        await self._stamp_latest(queue, request_id)
        await self.publisher.publish_process(queue, request_id)
        return IngestResult(request_id, created, published=True)

    async def _moved_on_from(self, queue: str, request_id: str) -> bool:
        """A newer head than ``request_id`` was ingested on ``queue`` since."""
        try:
            latest = (await self.queues.get(queue)).latest_request_id
        except NotFound:
            return False
        return bool(latest) and compare_request_id(queue, latest, request_id) > 0

    async def _ensure_queue(self, name: str) -> None:
        try:
            await self.queues.get(name)
        except NotFound:
            with contextlib.suppress(AlreadyExists):
                await self.queues.create(Queue(name=name))

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

    async def _stamp_latest(self, queue: str, request_id: str) -> None:
        def forward(row: Queue) -> Queue:
            latest = row.latest_request_id
            if latest and compare_request_id(queue, request_id, latest) <= 0:
                return row
            return replace(row, latest_request_id=request_id)

        await update_queue(self.queues, queue, forward)

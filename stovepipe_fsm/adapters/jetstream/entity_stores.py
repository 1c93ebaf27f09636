"""``RequestStore`` and ``QueueStore`` on JetStream KV (see ``ports/stores.py``).

The port's compare-and-set is on the entity's ``version``; KV's is on the key's revision.
``update(entity, old, new)`` joins them: read the current value *and* its revision, check
the stored version is ``old`` (else ``VersionMismatch``), then write conditionally on that
revision. Between the check and the write another writer may win; the server then rejects
the write on the revision, which also surfaces as ``VersionMismatch``. So a stale writer is
always told, and the store never does version arithmetic: it writes ``new`` as given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Generic, TypeVar

from ...domain.entities import Queue, Request
from ...domain.errors import NotFound, VersionMismatch
from .codec import decode_queue, decode_request, encode_queue, encode_request
from .kv_cell import KvCell
from .names import queue_key, request_key

E = TypeVar("E", Request, Queue)


class _KvEntityStore(Generic[E]):
    """Whole-snapshot create/get/CAS-update of one entity type in one bucket."""

    def __init__(
        self,
        cell: KvCell,
        *,
        kind: str,
        key_of: Callable[[str], str],
        identity: Callable[[E], str],
        encode: Callable[[E], bytes],
        decode: Callable[[bytes | None], E],
    ) -> None:
        self._cell = cell
        self._kind = kind
        self._key_of = key_of
        self._identity = identity
        self._encode = encode
        self._decode = decode

    def _key(self, identity: str) -> str:
        try:
            return self._key_of(identity)
        except ValueError as exc:
            # An id that has no key cannot have been stored.
            raise NotFound(f"{self._kind} {identity!r}: {exc}") from None

    async def create(self, entity: E) -> None:
        await self._cell.create(self._key_of(self._identity(entity)), self._encode(entity))

    async def get(self, identity: str) -> E:
        entry = await self._cell.read(self._key(identity))
        return self._decode(entry.value)

    async def update(self, entity: E, old_version: int, new_version: int) -> None:
        key = self._key(self._identity(entity))
        entry = await self._cell.read(key)
        stored = self._decode(entry.value)
        if stored.version != old_version:
            raise VersionMismatch(
                f"{self._kind} {self._identity(entity)!r}: stored version is "
                f"{stored.version}, not {old_version}"
            )
        written = replace(entity, version=new_version)
        await self._cell.replace(key, self._encode(written), entry.revision)


class KvRequestStore(_KvEntityStore[Request]):
    """Requests keyed by their id (``request/<queue>/<n>``, encoded by ``names``)."""

    def __init__(self, cell: KvCell) -> None:
        super().__init__(
            cell,
            kind="request",
            key_of=request_key,
            identity=lambda request: request.id,
            encode=encode_request,
            decode=decode_request,
        )


class KvQueueStore(_KvEntityStore[Queue]):
    """Queue rows keyed by the encoded queue name."""

    def __init__(self, cell: KvCell) -> None:
        super().__init__(
            cell,
            kind="queue",
            key_of=queue_key,
            identity=lambda queue: queue.name,
            encode=encode_queue,
            decode=decode_queue,
        )

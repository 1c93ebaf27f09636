"""``RequestStore``, ``QueueStore`` and ``SearchStore`` on JetStream KV (see ``ports/stores.py``).

The port's compare-and-set is on the entity's ``version``; KV's is on the key's revision.
``update(entity, old, new)`` joins them: it needs a revision at which the stored version
was ``old``, and writes conditionally on it. The store does no version arithmetic: it
writes ``new`` as given.

Where that revision comes from:

- **Remembered.** A decision reads a row and writes it back moments later, so each store
  instance remembers, per key, the (version, revision) of the last value it read or wrote.
  When the remembered version is ``old``, the write names the remembered revision directly
  and saves a read. A remembered pair is a fact about the past ("at revision r the version
  was v"), never a claim about the present: if anyone (another coroutine, replica or
  connection) wrote since, the server rejects the revision and the store falls back.
- **Read.** With nothing remembered, a different version remembered, or after that
  rejection, the store reads the row and its revision, checks the stored version is
  ``old`` (else ``VersionMismatch``), then writes conditionally on that revision. A writer
  who wins between the read and the write makes the server reject ours: ``VersionMismatch``.

So correctness rests on the server's revision check alone, and a stale ``old`` is always
refused, never written. It assumes what JetStream guarantees for a bucket's lifetime: a
revision is never reused. Deleting and re-creating a bucket under a running service
breaks that (and the service's state with it); restart the service after such surgery.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Generic, NamedTuple, TypeVar

from ...domain.culprit_search import CulpritSearch
from ...domain.entities import Queue, Request
from ...domain.errors import NotFound, VersionMismatch
from .codec import (
    REQUEST_LAYOUT,
    REQUEST_LAYOUTS,
    decode_queue,
    decode_request,
    decode_search,
    encode_queue,
    encode_request,
    encode_search,
)
from .kv_cell import KvCell
from .names import queue_key, request_key

E = TypeVar("E", Request, Queue, CulpritSearch)

#: Keys remembered per store instance. A long-running service touches an unbounded number
#: of request ids; only the few in flight matter, so the least recently used are dropped.
DEFAULT_REMEMBERED_KEYS = 65_536


class Seen(NamedTuple):
    """The entity version a key held at a KV revision, as this store last read or wrote it."""

    version: int
    revision: int


class RevisionMemory:
    """Bounded per-key memory of the last (version, revision) seen, least recently used out.

    Only a hint: a wrong entry costs one rejected write and one read, never correctness.
    Used from one event loop; no method awaits, so no lock is needed.
    """

    def __init__(self, capacity: int = DEFAULT_REMEMBERED_KEYS) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        self._seen: OrderedDict[str, Seen] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def get(self, key: str) -> Seen | None:
        seen = self._seen.get(key)
        if seen is not None:
            self._seen.move_to_end(key)
        return seen

    def note(self, key: str, version: int, revision: int) -> None:
        """Remember ``key`` at ``revision``, unless a later revision is remembered already.

        Concurrent calls on one instance may finish out of order; the later revision is the
        one a conditional write can still match, so an older answer must not replace it.
        """
        if self._capacity == 0:
            return
        known = self._seen.get(key)
        if known is None or revision >= known.revision:
            self._seen[key] = Seen(version, revision)
        self._seen.move_to_end(key)
        while len(self._seen) > self._capacity:
            self._seen.popitem(last=False)

    def forget(self, key: str, revision: int) -> None:
        """Drop ``key`` if what is remembered is still ``revision`` (nothing newer came in)."""
        known = self._seen.get(key)
        if known is not None and known.revision == revision:
            del self._seen[key]


class _KvEntityStore(Generic[E]):
    """Whole-snapshot create/get/CAS-update of one entity type in one bucket: each kind
    names itself, the entity field its key is made of, and how."""

    _kind: str
    _identity_field: str
    _key_of: Callable[[str], str]
    _encode: Callable[[E], bytes]
    _decode: Callable[[bytes | None], E]

    def __init__(self, cell: KvCell, *, remembered_keys: int = DEFAULT_REMEMBERED_KEYS) -> None:
        self._cell = cell
        self._memory = RevisionMemory(remembered_keys)

    def _identity(self, entity: E) -> str:
        identity: str = getattr(entity, self._identity_field)
        return identity

    def _key(self, identity: str) -> str:
        try:
            return self._key_of(identity)
        except ValueError as exc:
            # An id that has no key cannot have been stored.
            raise NotFound(f"{self._kind} {identity!r}: {exc}") from None

    async def create(self, entity: E) -> None:
        key = self._key_of(self._identity(entity))
        revision = await self._cell.create(key, self._encode(entity))
        self._memory.note(key, entity.version, revision)

    async def get(self, identity: str) -> E:
        key = self._key(identity)
        entry = await self._cell.read(key)
        entity = self._decode(entry.value)
        self._memory.note(key, entity.version, entry.revision)
        return entity

    async def get_many(self, identities: Sequence[str]) -> dict[str, E]:
        """The stored entities among ``identities``, by identity, read in one pass."""
        keys: dict[str, str] = {}
        for identity in identities:
            try:
                keys[self._key_of(identity)] = identity
            except ValueError:
                continue  # an id that has no key cannot have been stored
        found: dict[str, E] = {}
        for key, entry in (await self._cell.read_many(list(keys))).items():
            entity = self._decode(entry.value)
            self._memory.note(key, entity.version, entry.revision)
            found[keys[key]] = entity
        return found

    async def update(self, entity: E, old_version: int, new_version: int) -> None:
        key = self._key(self._identity(entity))
        value = self._encode(replace(entity, version=new_version))
        seen = self._memory.get(key)
        if seen is not None and seen.version == old_version:
            try:
                await self._write(key, value, new_version, seen.revision)
                return
            except VersionMismatch:
                # Someone wrote since we last saw the key; only a read can say whether the
                # stored version is still ``old`` (then the write is retried once).
                pass
        entry = await self._cell.read(key)
        stored = self._decode(entry.value)
        self._memory.note(key, stored.version, entry.revision)
        if stored.version != old_version:
            raise VersionMismatch(
                f"{self._kind} {self._identity(entity)!r}: stored version is "
                f"{stored.version}, not {old_version}"
            )
        await self._write(key, value, new_version, entry.revision)

    async def _write(self, key: str, value: bytes, version: int, revision: int) -> None:
        try:
            written = await self._cell.replace(key, value, revision)
        except BaseException:
            # Rejected, or unknown whether it landed (timeout, lost connection): what we
            # remember may be stale either way, and the next update should read.
            self._memory.forget(key, revision)
            raise
        self._memory.note(key, version, written)


class KvRequestStore(_KvEntityStore[Request]):
    """Requests keyed by their id (``request/<queue>/<n>``, encoded by ``names``)."""

    _kind, _identity_field = "request", "id"
    _key_of = staticmethod(request_key)
    _decode = staticmethod(decode_request)

    def __init__(
        self,
        cell: KvCell,
        *,
        remembered_keys: int = DEFAULT_REMEMBERED_KEYS,
        layout: int = REQUEST_LAYOUT,
    ) -> None:
        if layout not in REQUEST_LAYOUTS:
            raise ValueError(f"request layout must be one of {REQUEST_LAYOUTS}, got {layout}")
        super().__init__(cell, remembered_keys=remembered_keys)
        self._layout = layout

    def _encode(self, request: Request) -> bytes:
        return encode_request(request, self._layout)


class KvQueueStore(_KvEntityStore[Queue]):
    """Queue rows keyed by the encoded queue name."""

    _kind, _identity_field = "queue", "name"
    _key_of = staticmethod(queue_key)
    _encode = staticmethod(encode_queue)
    _decode = staticmethod(decode_queue)


class KvSearchStore(_KvEntityStore[CulpritSearch]):
    """Culprit search rows, one per queue, keyed by the encoded queue name."""

    _kind, _identity_field = "search", "queue"
    _key_of = staticmethod(queue_key)
    _encode = staticmethod(encode_search)
    _decode = staticmethod(decode_search)

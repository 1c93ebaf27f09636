"""In-memory stores: the storage ports as plain dictionaries of frozen values.

They keep the exact contract of ``stovepipe_fsm.ports.stores`` (compare-and-set on
``version``, ``NotFound``, ``AlreadyExists``) so that a controller tested here behaves
the same on JetStream KV. Nothing inside awaits: every operation completes in one step
of the event loop, which makes each call atomic and every run deterministic.

Two extras serve simulation and model checking, not the core:

- ``snapshot()`` returns the stored values sorted by key, so a whole world
  state can be compared or hashed;
- ``clone()`` returns an independent store. Stored values are immutable, so
  copying the dictionary is a complete (and cheap) fork: no later write to either store
  can be seen by the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Generic, Self, TypeVar

from ...domain.culprit_search import CulpritSearch
from ...domain.entities import Queue, Request, evolve
from ...domain.errors import AlreadyExists, NotFound, VersionMismatch

E = TypeVar("E", Request, Queue, CulpritSearch)


class _VersionedStore(Generic[E]):
    """Create/get/CAS-update of one entity type, keyed by a field of the entity.

    The store does no version arithmetic: ``update`` writes the caller's entity with the
    caller's ``new_version``, guarded only by ``old_version`` (see the port docstring).
    """

    _entity_type: type[E]
    _kind: str
    #: The entity field a value is stored under.
    _key_field: str

    def __init__(self, entities: Iterable[E] = ()) -> None:
        self._items: dict[str, E] = {}
        for entity in entities:
            self._items[self._key(entity)] = self._freeze(entity)
        #: The last snapshot, until the next write: ``check`` takes one for every state
        #: it reaches, and a fork that writes nothing hands out the very tuple its
        #: parent did.
        self._snapshot: tuple[E, ...] | None = None

    def _key(self, entity: E) -> str:
        key: str = getattr(entity, self._key_field)
        return key

    def _freeze(self, entity: E) -> E:
        """The value to store: a frozen entity of exactly the expected type.

        Checking the type here turns a wiring mistake (a dict, a mutable stand-in) into
        an immediate error instead of a store that hands out objects callers can change.
        """
        if not isinstance(entity, self._entity_type):
            raise TypeError(
                f"{type(self).__name__} stores {self._entity_type.__name__} values, "
                f"got {type(entity).__name__}"
            )
        return entity

    async def create(self, entity: E) -> None:
        value = self._freeze(entity)
        key = self._key(value)
        if key in self._items:
            raise AlreadyExists(f"{self._kind} {key!r} already exists")
        self._items[key] = value
        self._snapshot = None

    async def get(self, key: str) -> E:
        try:
            return self._items[key]
        except KeyError:
            raise NotFound(f"{self._kind} {key!r} not found") from None

    async def get_many(self, keys: Sequence[str]) -> dict[str, E]:
        """The stored values among ``keys``, by key (missing ones left out)."""
        items = self._items
        return {key: items[key] for key in keys if key in items}

    async def update(self, entity: E, old_version: int, new_version: int) -> None:
        value = self._freeze(entity)
        key = self._key(value)
        stored = self._items.get(key)
        if stored is None:
            raise NotFound(f"{self._kind} {key!r} not found")
        if stored.version != old_version:
            raise VersionMismatch(
                f"{self._kind} {key!r}: stored version is {stored.version}, "
                f"update expected {old_version}"
            )
        self._items[key] = evolve(value, version=new_version)
        self._snapshot = None

    def snapshot(self) -> tuple[E, ...]:
        """Every stored value, sorted by key (hashable: the values are frozen)."""
        if self._snapshot is None:
            items = self._items
            self._snapshot = tuple(items[key] for key in sorted(items))
        return self._snapshot

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def clone(self) -> Self:
        """An independent store holding the same values (values are immutable)."""
        twin = object.__new__(type(self))
        twin._items = dict(self._items)
        twin._snapshot = self._snapshot
        return twin


class MemoryRequestStore(_VersionedStore[Request]):
    """``RequestStore`` keyed by ``Request.id``."""

    _entity_type = Request
    _kind = "request"
    _key_field = "id"


class MemoryQueueStore(_VersionedStore[Queue]):
    """``QueueStore`` keyed by ``Queue.name``."""

    _entity_type = Queue
    _kind = "queue"
    _key_field = "name"

    def _freeze(self, entity: Queue) -> Queue:
        # A frozen dataclass still holds whatever sequence it was given; a list of slot
        # holders would let the caller change the stored row behind the store's back.
        value = super()._freeze(entity)
        if type(value.slot_holders) is not tuple:
            value = dataclasses.replace(value, slot_holders=tuple(value.slot_holders))
        return value


class MemorySearchStore(_VersionedStore[CulpritSearch]):
    """``SearchStore`` keyed by ``CulpritSearch.queue``."""

    _entity_type = CulpritSearch
    _kind = "search"
    _key_field = "queue"


class MemoryUriIndex:
    """``UriIndex``: (queue, uri) → request id, each entry written once (re-pointed only
    by a return to a head trunk had left).

    ``put_if_absent`` is the dedup point of ingest: two ingests of one commit must end
    with one request id, so the first stored id wins and is returned to both.
    """

    def __init__(self, entries: Iterable[tuple[tuple[str, str], str]] = ()) -> None:
        self._items: dict[tuple[str, str], str] = dict(entries)

    async def get(self, queue: str, uri: str) -> str | None:
        return self._items.get((queue, uri))

    async def put_if_absent(self, queue: str, uri: str, request_id: str) -> str:
        return self._items.setdefault((queue, uri), request_id)

    async def repoint(self, queue: str, uri: str, expected: str, request_id: str) -> str:
        stored = self._items.setdefault((queue, uri), request_id)
        if stored == expected:
            self._items[(queue, uri)] = stored = request_id
        return stored

    def snapshot(self) -> tuple[tuple[tuple[str, str], str], ...]:
        """Every ``((queue, uri), request_id)`` entry, sorted by key."""
        return tuple(sorted(self._items.items()))

    def __len__(self) -> int:
        return len(self._items)

    def clone(self) -> MemoryUriIndex:
        return MemoryUriIndex(self._items.items())


class MemoryCounter:
    """``Counter``: one monotonic sequence per queue, the first value is 1.

    The stored number is the last value handed out, so a clone continues each sequence
    exactly where the original stood and no value is ever issued twice by one store.
    """

    def __init__(self, last: Iterable[tuple[str, int]] = ()) -> None:
        self._last: dict[str, int] = dict(last)

    async def next(self, queue: str) -> int:
        return await self.reserve(queue, 1)

    async def reserve(self, queue: str, count: int) -> int:
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        value = self._last.get(queue, 0) + count
        self._last[queue] = value
        return value

    async def next_after(self, queue: str, last: int) -> int | None:
        if self._last.get(queue, 0) != last:
            return None
        self._last[queue] = last + 1
        return last + 1

    def peek(self, queue: str) -> int:
        """The last value issued for ``queue`` (0 when none was)."""
        return self._last.get(queue, 0)

    def snapshot(self) -> tuple[tuple[str, int], ...]:
        """Every ``(queue, last issued value)`` pair, sorted by queue."""
        return tuple(sorted(self._last.items()))

    def clone(self) -> MemoryCounter:
        return MemoryCounter(self._last.items())

"""Storage ports: single-key reads and compare-and-set writes, nothing more.

Contract (shared by every implementation, checked by ``tests/contracts``):

- ``get`` returns a snapshot equal to the last successful write, or raises ``NotFound``.
  Storage is read-after-write consistent.
- ``get_many`` (requests) returns the stored snapshots among the ids asked for, keyed by
  id, the missing ones left out, in a number of round trips that does not grow with the
  number of ids: a decision that looks at every newer head of a queue reads them at once.
- ``create`` writes a new key or raises ``AlreadyExists``; it never overwrites.
- ``update(entity, old_version, new_version)`` writes ``entity`` with ``version =
  new_version`` only if the stored version equals ``old_version``; otherwise it raises
  ``VersionMismatch`` (or ``NotFound`` when the key is gone). The store does no version
  arithmetic: the caller computes ``new_version = old_version + 1`` and assigns it to its
  own value only after the call succeeds.
- Stores never mutate a caller's value (entities are frozen) and never return an object
  a later write could change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from ..domain.culprit_search import CulpritSearch
from ..domain.entities import Queue, Request


class RequestStore(Protocol):
    async def create(self, request: Request) -> None: ...

    async def get(self, request_id: str) -> Request: ...

    async def get_many(self, request_ids: Sequence[str]) -> Mapping[str, Request]: ...

    async def update(self, request: Request, old_version: int, new_version: int) -> None: ...


class QueueStore(Protocol):
    async def create(self, queue: Queue) -> None: ...

    async def get(self, name: str) -> Queue: ...

    async def update(self, queue: Queue, old_version: int, new_version: int) -> None: ...


class SearchStore(Protocol):
    """A queue's culprit search row, keyed by the queue's name."""

    async def create(self, search: CulpritSearch) -> None: ...

    async def get(self, queue: str) -> CulpritSearch: ...

    async def update(self, search: CulpritSearch, old_version: int, new_version: int) -> None: ...


class UriIndex(Protocol):
    """Dedup index on (queue, uri) → request id.

    An entry changes only when trunk returns to a head it had left (ingest's ``at_head``):
    it is then re-pointed, by compare-and-set, at the request of the return.
    """

    async def get(self, queue: str, uri: str) -> str | None: ...

    async def put_if_absent(self, queue: str, uri: str, request_id: str) -> str:
        """Store ``request_id`` unless an entry exists; return the id that is stored."""
        ...

    async def repoint(self, queue: str, uri: str, expected: str, request_id: str) -> str:
        """Point the entry at ``request_id`` if it still names ``expected`` (or is absent);
        return the id stored afterwards: the caller's, or the one a racing writer put."""
        ...


class Counter(Protocol):
    """Per-queue monotonic counter; values start at 1 and are never reused."""

    async def next(self, queue: str) -> int: ...

    async def reserve(self, queue: str, count: int) -> int:
        """Hand out ``count`` consecutive values in one step; return the last of them."""
        ...

    async def next_after(self, queue: str, last: int) -> int | None:
        """Hand out ``last + 1`` only if ``last`` is the last value handed out, in one
        step; ``None`` when another value was handed out since. A retry mints this way,
        so no head can take an id between the one it checked against and its own."""
        ...

"""``UriIndex`` on JetStream KV: the (queue, uri) dedup point of ingest.

An entry is written with a create (``only if absent``), so the first ingest of a commit
wins and every later one, on any replica, reads back the same request id. It changes only
when trunk returns to a head it had left: :meth:`KvUriIndex.repoint` replaces it by
revision, so of two racing returns one wins and the other reads the winner's id. The
value records queue and uri as well as the id: the key of a very long uri is its digest,
and reading the uri back lets a lookup prove it found the right entry.
"""

from __future__ import annotations

from ...domain.errors import AlreadyExists, NonRetryable, NotFound, Retryable, VersionMismatch
from .codec import UriEntry, decode_uri_entry, encode_uri_entry
from .kv_cell import KvCell
from .names import uri_key

_CREATE_ATTEMPTS = 5


class KvUriIndex:
    def __init__(self, cell: KvCell) -> None:
        self._cell = cell

    async def get(self, queue: str, uri: str) -> str | None:
        entry = await self._cell.read_optional(uri_key(queue, uri))
        if entry is None:
            return None
        return self._checked(queue, uri, decode_uri_entry(entry.value)).request_id

    async def put_if_absent(self, queue: str, uri: str, request_id: str) -> str:
        key = uri_key(queue, uri)
        value = encode_uri_entry(UriEntry(queue=queue, uri=uri, request_id=request_id))
        for _ in range(_CREATE_ATTEMPTS):
            try:
                await self._cell.create(key, value)
                return request_id
            except AlreadyExists:
                pass
            try:
                entry = await self._cell.read(key)
            except NotFound:
                # Only prune deletes entries (of old terminal requests); it raced us.
                continue
            return self._checked(queue, uri, decode_uri_entry(entry.value)).request_id
        raise Retryable(f"uri index {queue!r} {uri!r}: entry kept appearing and vanishing")

    async def repoint(self, queue: str, uri: str, expected: str, request_id: str) -> str:
        key = uri_key(queue, uri)
        value = encode_uri_entry(UriEntry(queue=queue, uri=uri, request_id=request_id))
        for _ in range(_CREATE_ATTEMPTS):
            entry = await self._cell.read_optional(key)
            if entry is None:
                return await self.put_if_absent(queue, uri, request_id)
            stored = self._checked(queue, uri, decode_uri_entry(entry.value)).request_id
            if stored != expected:
                return stored
            try:
                await self._cell.replace(key, value, entry.revision)
                return request_id
            except VersionMismatch:
                continue  # a racing return re-pointed it first: read whose id won
        raise Retryable(f"uri index {queue!r} {uri!r}: entry kept changing while re-pointing")

    @staticmethod
    def _checked(queue: str, uri: str, entry: UriEntry) -> UriEntry:
        if (entry.queue, entry.uri) != (queue, uri):
            raise NonRetryable(
                f"uri index entry for {queue!r} {uri!r} holds {entry.queue!r} {entry.uri!r}"
            )
        return entry

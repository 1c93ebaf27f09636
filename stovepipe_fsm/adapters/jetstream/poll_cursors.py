"""Where each followed ref stands: the commit ``poll`` reported last, in the service bucket.

A poller ingests the first-parent commits a ref gained since the commit it reported
last, so that commit must outlive the poller: a restarted poller neither re-reads a
range already ingested nor skips one. One key per (queue, ref); every write is a
compare-and-set on the revision read, so of two pollers of one ref the slower learns
that the other moved the ref's cursor first (ingest dedups the heads both read).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from ...domain.errors import AlreadyExists, NonRetryable, VersionMismatch
from .kv_cell import KvCell
from .names import encode_queue_token

CURSOR_KEY_PREFIX = "poll."


@dataclass(frozen=True)
class PollCursor:
    """The commit reported last for ``ref`` into ``queue``; ``revision`` 0: none yet."""

    queue: str
    ref: str
    commit: str = ""
    revision: int = 0


def cursor_key(queue: str, ref: str) -> str:
    digest = hashlib.sha256(ref.encode()).hexdigest()[:24]
    return f"{CURSOR_KEY_PREFIX}{encode_queue_token(queue)}.{digest}"


class KvPollCursors:
    def __init__(self, cell: KvCell) -> None:
        self._cell = cell

    async def read(self, queue: str, ref: str) -> PollCursor:
        entry = await self._cell.read_optional(cursor_key(queue, ref))
        if entry is None:
            return PollCursor(queue, ref)
        try:
            value = json.loads(entry.value)
            commit = value["commit"]
            if (value["queue"], value["ref"]) != (queue, ref) or not isinstance(commit, str):
                raise ValueError(f"it names {value['queue']!r} {value['ref']!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise NonRetryable(
                f"poll cursor of {queue!r} {ref!r} in {self._cell.bucket} is damaged: {exc}"
            ) from None
        return PollCursor(queue, ref, commit, entry.revision)

    async def advance(self, read: PollCursor, commit: str) -> bool:
        """Store ``commit`` as where ``read``'s ref stands, if nobody moved it since
        ``read``; False when someone did (their cursor stands)."""
        key = cursor_key(read.queue, read.ref)
        value = json.dumps({"queue": read.queue, "ref": read.ref, "commit": commit}).encode()
        try:
            if read.revision == 0:
                await self._cell.create(key, value)
            else:
                await self._cell.replace(key, value, read.revision)
        except (AlreadyExists, VersionMismatch):
            return False
        return True

"""``Counter`` on JetStream KV: per-queue request numbers, minted by compare-and-set.

Several ingest replicas may mint for one queue at once, so ``next`` is a CAS loop: create
the key at 1, or replace the value read with value + 1 conditionally on its revision.
A lost race re-reads and tries again, so no number is ever handed out twice; the loop is
bounded, and persistent contention becomes ``Retryable`` instead of a spin.

An ingester mints for the same queues again and again, so each instance remembers the
value and revision it last wrote per queue and tries the next write on that revision
without reading first: one round trip while nobody else minted for the queue. What it
remembers is only a hint; a write on a stale revision is refused by the server and the
loop reads, so correctness rests on the server's revision check alone.
The value is plain decimal text, readable with ``nats kv get``.
"""

from __future__ import annotations

from ...domain.errors import AlreadyExists, NonRetryable, Retryable, VersionMismatch
from .kv_cell import KvCell
from .names import queue_key

DEFAULT_MAX_ATTEMPTS = 50


class KvCounter:
    def __init__(self, cell: KvCell, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self._cell = cell
        self._max_attempts = max_attempts
        self._last: dict[str, tuple[int, int]] = {}  # queue -> (value, revision) we wrote

    async def next(self, queue: str) -> int:
        return await self.reserve(queue, 1)

    async def next_after(self, queue: str, last: int) -> int | None:
        """``last + 1`` by one compare-and-set on the counter's entry, or ``None`` when
        its value is not ``last`` (another value was handed out since)."""
        key = queue_key(queue)
        self._last.pop(queue, None)
        entry = await self._cell.read_optional(key)
        current = 0 if entry is None else _parse(queue, entry.value)
        if current != last:
            return None
        encoded = str(last + 1).encode("ascii")
        try:
            await self._cell.write(key, encoded, entry.revision if entry else 0)
        except (AlreadyExists, VersionMismatch):
            return None
        return last + 1

    async def reserve(self, queue: str, count: int) -> int:
        """Hand out ``count`` consecutive values at once; return the last of them.

        The values ``last - count + 1 .. last`` are the caller's alone (one write).
        """
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        key = queue_key(queue)
        remembered = self._last.pop(queue, None)
        for _ in range(self._max_attempts):
            if remembered is not None:
                last, revision = remembered
                remembered = None
            else:
                entry = await self._cell.read_optional(key)
                last = 0 if entry is None else _parse(queue, entry.value)
                revision = 0 if entry is None else entry.revision
            value = last + count
            encoded = str(value).encode("ascii")
            try:
                written = await self._cell.write(key, encoded, revision)
            except (AlreadyExists, VersionMismatch):
                continue
            self._last[queue] = (value, written)
            return value
        raise Retryable(
            f"counter {queue!r}: lost {self._max_attempts} compare-and-set races in a row"
        )

    async def peek(self, queue: str) -> int:
        """The last value handed out for ``queue`` (0 when none was)."""
        entry = await self._cell.read_optional(queue_key(queue))
        return 0 if entry is None else _parse(queue, entry.value)


def _parse(queue: str, raw: bytes) -> int:
    text = raw.decode("ascii", errors="replace")
    if not (text.isascii() and text.isdecimal()) or int(text) < 1:
        raise NonRetryable(f"counter {queue!r} holds {text!r}, not a positive integer")
    return int(text)

"""``Counter`` on JetStream KV: per-queue request numbers, minted by compare-and-set.

Several ingest replicas may mint for one queue at once, so ``next`` is a CAS loop: create
the key at 1, or replace the value read with value + 1 conditionally on its revision.
A lost race re-reads and tries again, so no number is ever handed out twice; the loop is
bounded, and persistent contention becomes ``Retryable`` instead of a spin.
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

    async def next(self, queue: str) -> int:
        key = queue_key(queue)
        for _ in range(self._max_attempts):
            entry = await self._cell.read_optional(key)
            try:
                if entry is None:
                    await self._cell.create(key, b"1")
                    return 1
                value = _parse(queue, entry.value) + 1
                await self._cell.replace(key, str(value).encode("ascii"), entry.revision)
                return value
            except (AlreadyExists, VersionMismatch):
                continue
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

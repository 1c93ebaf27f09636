"""Push-event deliveries already ingested, by their delivery id, for a bounded time.

A forge sends a delivery again when it saw no answer (or an operator asks it to): the
second one must ingest nothing. The id is written only after the delivery's commits
were ingested, so a crash in between leaves the id unwritten and the forge's repeat is
ingested again (ingest's dedup on (queue, uri) makes that a no-op). The bucket discards
an id after the topology's ``delivery_max_age_s``, so it holds at most that many days of
pushes.
"""

from __future__ import annotations

import contextlib
import hashlib

from ...domain.errors import AlreadyExists
from .kv_cell import KvCell


def delivery_key(forge: str, delivery: str) -> str:
    return f"{forge}.{hashlib.sha256(delivery.encode()).hexdigest()[:32]}"


class KvDeliveries:
    def __init__(self, cell: KvCell) -> None:
        self._cell = cell

    async def seen(self, forge: str, delivery: str) -> bool:
        return await self._cell.read_optional(delivery_key(forge, delivery)) is not None

    async def record(self, forge: str, delivery: str, summary: bytes) -> None:
        """Note the delivery as ingested (a second note of it changes nothing)."""
        with contextlib.suppress(AlreadyExists):
            await self._cell.create(delivery_key(forge, delivery), summary)

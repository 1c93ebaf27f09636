"""``DecisionTrail``: where the stage writes why it decided what it decided."""

from __future__ import annotations

from typing import Protocol

from ..domain.trail_record import TrailRecord


class DecisionTrail(Protocol):
    """Appends decisions and reads one request's history back in time order.

    ``append`` of a record whose key was appended before is no new record: a repeated
    decision is kept once, and a repeated hold (same key) is counted into the one record.
    """

    async def append(self, record: TrailRecord) -> None: ...

    async def history(self, request_id: str) -> list[TrailRecord]: ...

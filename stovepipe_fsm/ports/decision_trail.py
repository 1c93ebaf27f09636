"""``DecisionTrail``: where the stage writes why it decided what it decided."""

from __future__ import annotations

from typing import Protocol

from ..domain.trail_record import TrailRecord


class DecisionTrail(Protocol):
    """Appends decisions and reads one request's history back in time order.

    ``append`` of a record whose key was appended before is no new record: a repeated
    decision is kept once, however late it is repeated, and a repeated hold (same key) is
    counted into the one record. ``has`` says whether a decision without a tag (one per
    request and kind, such as ``ended``) was kept already.
    """

    async def append(self, record: TrailRecord) -> None: ...

    async def has(self, request_id: str, kind: str) -> bool: ...

    async def history(self, request_id: str) -> list[TrailRecord]: ...

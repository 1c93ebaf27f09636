"""In-memory ``DecisionTrail``: simulate and the tests keep the trail the service keeps."""

from __future__ import annotations

from ...domain.trail_record import HELD, TrailRecord, decision_key


class MemoryTrail:
    """Every record in append order; a repeated key is kept once, a repeated hold counted."""

    def __init__(self) -> None:
        self._records: list[TrailRecord] = []
        self._index: dict[str, int] = {}

    async def append(self, record: TrailRecord) -> None:
        at = self._index.get(record.key)
        if at is None:
            self._index[record.key] = len(self._records)
            self._records.append(record)
        elif record.kind == HELD:
            self._records[at] = self._records[at].again(record)

    async def has(self, request_id: str, kind: str) -> bool:
        return decision_key(kind, request_id) in self._index

    async def history(self, request_id: str) -> list[TrailRecord]:
        mine = [r for r in self._records if r.request_id == request_id]
        return sorted(mine, key=lambda r: r.first_at_ms)

    @property
    def records(self) -> tuple[TrailRecord, ...]:
        return tuple(self._records)

    def clone(self) -> MemoryTrail:
        twin = MemoryTrail()
        twin._records = list(self._records)
        twin._index = dict(self._index)
        return twin

"""In-memory publisher: records every publish, in order, duplicates included.

Tests and the model checker need to see exactly what a controller sent, including the
re-publishes a redelivery causes, because "a duplicate carries the same dedup id" is a
property to check, not something to hide. ``unique`` shows what a deduplicating broker
would deliver. ``fail_next`` makes the next publish of a kind raise ``Retryable`` and
record nothing, which is how a crash between "state written" and "message sent" is
staged (persist-before-publish tests).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Final, Literal

from ...domain.errors import Retryable
from ...domain.hooks import HookEvent

PublishKind = Literal["process", "build", "hook"]
PROCESS: Final = "process"
BUILD: Final = "build"
HOOK: Final = "hook"
KINDS: tuple[PublishKind, ...] = (PROCESS, BUILD, HOOK)


@dataclass(frozen=True)
class Published:
    """One accepted publish.

    ``dedup_id`` is the id a broker deduplicates on (the request id for process and
    build messages, the event id for hooks). A hook's payload is kept as sorted pairs
    so the record is immutable and hashable; :meth:`event` rebuilds an event equal to
    the one published.
    """

    kind: PublishKind
    queue: str
    request_id: str
    dedup_id: str
    event_type: str = ""
    timestamp_ms: int = 0
    payload: tuple[tuple[str, str], ...] = ()
    source: str = ""
    envelope_version: int = 0

    def event(self) -> HookEvent:
        if self.kind != HOOK:
            raise ValueError(f"a {self.kind} publish carries no hook event")
        return HookEvent(
            id=self.dedup_id,
            type=self.event_type,
            timestamp_ms=self.timestamp_ms,
            payload=dict(self.payload),
            source=self.source,
            version=self.envelope_version,
        )


class MemoryPublisher:
    """``Publisher`` that appends a :class:`Published` record per successful call."""

    def __init__(self) -> None:
        self._records: list[Published] = []
        self._failures: Counter[str] = Counter()

    async def publish_process(self, queue: str, request_id: str, partition: int = 0) -> None:
        # One topic: the partition only matters to a broker that has several.
        self._record(Published(PROCESS, queue, request_id, dedup_id=request_id))

    async def publish_build(self, queue: str, request_id: str) -> None:
        self._record(Published(BUILD, queue, request_id, dedup_id=request_id))

    async def publish_hook(self, event: HookEvent) -> None:
        self._record(
            Published(
                HOOK,
                queue=event.payload.get("queue", ""),
                request_id=event.payload.get("request_id", ""),
                dedup_id=event.id,
                event_type=event.type,
                timestamp_ms=event.timestamp_ms,
                payload=tuple(sorted(event.payload.items())),
                source=event.source,
                envelope_version=event.version,
            )
        )

    def fail_next(self, kind: PublishKind, times: int = 1) -> None:
        """Make the next ``times`` publishes of ``kind`` raise ``Retryable``."""
        if kind not in KINDS:
            raise ValueError(f"unknown publish kind {kind!r}; expected one of {KINDS}")
        if times < 1:
            raise ValueError(f"times must be >= 1, got {times}")
        self._failures[kind] += times

    def pending_failures(self, kind: PublishKind) -> int:
        return self._failures[kind]

    def _record(self, record: Published) -> None:
        if self._failures[record.kind] > 0:
            self._failures[record.kind] -= 1
            raise Retryable(f"injected {record.kind} publish failure ({record.dedup_id})")
        self._records.append(record)

    @property
    def records(self) -> tuple[Published, ...]:
        """Every accepted publish in order, duplicates included."""
        return tuple(self._records)

    def of_kind(self, kind: PublishKind) -> tuple[Published, ...]:
        return tuple(r for r in self._records if r.kind == kind)

    def builds(self) -> tuple[Published, ...]:
        return self.of_kind(BUILD)

    def processes(self) -> tuple[Published, ...]:
        return self.of_kind(PROCESS)

    def hooks(self) -> tuple[Published, ...]:
        return self.of_kind(HOOK)

    def unique(self, kind: PublishKind) -> tuple[Published, ...]:
        """First publish per dedup id: what a deduplicating broker would deliver."""
        seen: set[str] = set()
        firsts: list[Published] = []
        for record in self.of_kind(kind):
            if record.dedup_id not in seen:
                seen.add(record.dedup_id)
                firsts.append(record)
        return tuple(firsts)

    def clear(self) -> None:
        """Forget the records (not the injected failures)."""
        self._records.clear()

    def clone(self) -> MemoryPublisher:
        """An independent copy of the records and of the pending injected failures."""
        twin = object.__new__(MemoryPublisher)
        twin._records = self._records.copy()
        twin._failures = self._failures.copy() if self._failures else Counter()
        return twin

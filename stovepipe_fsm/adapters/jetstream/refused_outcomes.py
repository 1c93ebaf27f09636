"""Refused build outcomes, tallied per queue: one bounded record each, with a retention.

An outcome the recorder refuses (undecodable, an unknown request, an undeclared outcome, a
request that ended otherwise) replaces no work, so it is not a dead letter to act on; it
is something to notice. Each queue has one record in the refused-outcomes bucket (key:
the queue's subject token) holding how many outcomes were refused and when, how many for
each kind of reason, and the :data:`RECENT_KEPT` latest refusals with their reasons. A
flood of junk outcomes so costs one key per queue, not one record each, and the bucket's
``max_age`` (``Topology.refused_outcomes_max_age_s``) drops a queue's record once no
outcome of it was refused for that long.

Every write is a compare-and-set on the key's revision; a refusal already among the
latest (the same stream sequence: a redelivery after a crash) is not counted twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from nats.js import JetStreamContext

from ...domain.bounded_text import clip
from ...domain.errors import AlreadyExists, NonRetryable, VersionMismatch
from .bulk import kv_snapshot
from .codec import _dump, _load, _str
from .errors import translated
from .kv_cell import KvCell
from .names import decode_queue_token, encode_queue_token
from .topology import Topology

KIND = "refused_outcomes"
#: The latest refusals a queue's record keeps, with their reasons.
RECENT_KEPT = 20
#: What a refusal's reason keeps of the error text.
REASON_CHARS = 300
#: Compare-and-set rounds before a write gives up (retryable).
WRITE_ATTEMPTS = 8

#: Kinds of reason a tally counts (its ``reasons``).
UNDECODABLE = "undecodable"
UNKNOWN_REQUEST = "unknown_request"
UNDECLARED_OUTCOME = "undeclared_outcome"
ENDED_OTHERWISE = "ended_otherwise"
OTHER = "other"
REASON_KINDS = (UNDECODABLE, UNKNOWN_REQUEST, UNDECLARED_OUTCOME, ENDED_OTHERWISE, OTHER)


@dataclass(frozen=True)
class Refusal:
    """One refused outcome message: when, for which request and outcome, and why."""

    at_ms: int
    stream_seq: int
    request_id: str
    outcome: str
    reason_kind: str
    reason: str

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def bounded(
        cls, at_ms: int, stream_seq: int, request_id: str, outcome: str, kind: str, reason: str
    ) -> Refusal:
        """A refusal whose texts are cut to their bounds (they come from outside)."""
        return cls(
            at_ms,
            stream_seq,
            clip(request_id, REASON_CHARS),
            clip(outcome, 100),
            kind if kind in REASON_KINDS else OTHER,
            clip(reason, REASON_CHARS),
        )


@dataclass(frozen=True)
class RefusalTally:
    """A queue's refused outcomes: the count since ``first_at_ms``, per reason kind, and
    the latest few, oldest first."""

    queue: str
    count: int = 0
    first_at_ms: int = 0
    last_at_ms: int = 0
    reasons: tuple[tuple[str, int], ...] = ()
    recent: tuple[Refusal, ...] = ()

    def counts(self, refusal: Refusal) -> bool:
        """Whether ``refusal`` is counted already (a redelivery of the same message)."""
        return any(r.stream_seq == refusal.stream_seq for r in self.recent)

    def add(self, refusal: Refusal) -> RefusalTally:
        if self.counts(refusal):
            return self
        reasons = dict(self.reasons)
        reasons[refusal.reason_kind] = reasons.get(refusal.reason_kind, 0) + 1
        return replace(
            self,
            count=self.count + 1,
            first_at_ms=self.first_at_ms or refusal.at_ms,
            last_at_ms=max(self.last_at_ms, refusal.at_ms),
            reasons=tuple(sorted(reasons.items())),
            recent=(*self.recent, refusal)[-RECENT_KEPT:],
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "count": self.count,
            "first_at_ms": self.first_at_ms,
            "last_at_ms": self.last_at_ms,
            "reasons": dict(self.reasons),
            "recent": [r.as_json() for r in self.recent],
        }

    def encode(self) -> bytes:
        return _dump(KIND, self.as_json())

    @classmethod
    def decode(cls, data: bytes) -> RefusalTally:
        fields = _load(
            data,
            KIND,
            frozenset(("queue", "count", "first_at_ms", "last_at_ms", "reasons", "recent")),
        )
        try:
            reasons = _counts(fields["reasons"])
            recent = tuple(_refusal(item) for item in fields["recent"])
            return cls(
                _str(KIND, fields, "queue"),
                int(fields["count"]),
                int(fields["first_at_ms"]),
                int(fields["last_at_ms"]),
                reasons,
                recent[-RECENT_KEPT:],
            )
        except (TypeError, ValueError, KeyError) as exc:
            raise NonRetryable(f"{KIND} record is damaged: {exc}") from None


def _counts(value: object) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, Mapping):
        raise TypeError(f"reasons must be an object, got {value!r}")
    return tuple(sorted((str(k), int(v)) for k, v in value.items()))


def _refusal(item: object) -> Refusal:
    if not isinstance(item, Mapping):
        raise TypeError(f"a refusal must be an object, got {item!r}")
    return Refusal(
        int(item["at_ms"]),
        int(item["stream_seq"]),
        str(item["request_id"]),
        str(item["outcome"]),
        str(item["reason_kind"]),
        str(item["reason"]),
    )


async def _cell(js: JetStreamContext, topology: Topology) -> KvCell:
    bucket = topology.refused_bucket
    with translated(f"open bucket {bucket}"):
        return KvCell(await js.key_value(bucket), bucket, js)


async def tally_refusal(
    js: JetStreamContext, topology: Topology, queue: str, refusal: Refusal
) -> RefusalTally:
    """Count ``refusal`` in ``queue``'s record (created on the first), by compare-and-set."""
    cell = await _cell(js, topology)
    key = encode_queue_token(queue)
    for _ in range(WRITE_ATTEMPTS):
        entry = await cell.read_optional(key)
        try:
            tally = RefusalTally.decode(entry.value) if entry else RefusalTally(queue)
        except NonRetryable:
            tally = RefusalTally(queue)  # a damaged record is started afresh
        updated = tally.add(refusal)
        if updated is tally:
            return tally
        try:
            await cell.write(key, updated.encode(), entry.revision if entry else 0)
        except (AlreadyExists, VersionMismatch):
            continue
        return updated
    raise VersionMismatch(f"refused outcomes of {queue!r} kept changing while counting one")


async def read_tallies(js: JetStreamContext, topology: Topology) -> list[RefusalTally]:
    """Every queue's record (damaged ones left out), by queue name."""
    tallies = []
    for key, value in await kv_snapshot(js, topology.refused_bucket):
        try:
            tally = RefusalTally.decode(value)
            if decode_queue_token(key) != tally.queue:
                continue
        except (NonRetryable, ValueError):
            continue  # damaged, or not the record its key names
        tallies.append(tally)
    return sorted(tallies, key=lambda t: t.queue)

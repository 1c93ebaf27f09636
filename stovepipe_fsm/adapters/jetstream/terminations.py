"""Which process messages the service itself gave up on: the proof a dead letter needs.

The dead-letter subject is a plain subject: anyone allowed to publish on it could write a
record that names a healthy request, and the reconciler would fail that request closed.
So before the service publishes a dead-letter record it writes a *termination mark* in
the attempts bucket, keyed by the process message's stream sequence and naming the queue
and request the record is about. The reconciler honours a record only when a mark for
its sequence exists and names the same queue and request (and the record arrived on that
queue's subject). Forging a record therefore needs write access to the attempts bucket,
not just publish rights on the dead-letter subject (docs/jetstream.md lists the subjects
to restrict).

Marks are small, written once per dead-lettered message, and kept: a record may be read
again long after (a new reconciler consumer replays the stream). Sequences are never
reused by the stream, so a mark can never be mistaken for another message's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import nats.js.errors
from nats.js.kv import KeyValue

from .errors import translated

MARK_PREFIX = "terminated"


def mark_key(stage: str, stream_seq: int) -> str:
    if stream_seq < 1:
        raise ValueError(f"stream sequence must be >= 1, got {stream_seq}")
    return f"{MARK_PREFIX}.{stage}.{stream_seq}"


@dataclass(frozen=True)
class TerminationMark:
    """The service gave up on message ``stream_seq`` of ``queue`` about ``request_id``."""

    queue: str
    request_id: str

    def encode(self) -> bytes:
        body = {"queue": self.queue, "request_id": self.request_id}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes | None) -> TerminationMark | None:
        """The mark stored in ``data``; ``None`` for anything that is not one."""
        try:
            body = json.loads(data or b"")
            queue, request_id = body["queue"], body["request_id"]
        except (ValueError, KeyError, TypeError):
            return None
        if not isinstance(queue, str) or not isinstance(request_id, str):
            return None
        return cls(queue, request_id)


class TerminationLedger:
    """Termination marks of one stage (``process``), in the attempts bucket."""

    def __init__(self, kv: KeyValue, *, stage: str = "process") -> None:
        self._kv = kv
        self._stage = stage

    async def mark(self, stream_seq: int, mark: TerminationMark) -> None:
        """Record that the service is about to dead-letter message ``stream_seq``."""
        key = mark_key(self._stage, stream_seq)
        with translated(f"mark termination {key}"):
            await self._kv.put(key, mark.encode())

    async def lookup(self, stream_seq: int) -> TerminationMark | None:
        """The mark of ``stream_seq``; ``None`` when the service never wrote one."""
        if stream_seq < 1:
            return None
        key = mark_key(self._stage, stream_seq)
        with translated(f"read termination {key}"):
            try:
                entry = await self._kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                return None
        return TerminationMark.decode(entry.value)

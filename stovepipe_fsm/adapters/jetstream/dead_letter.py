"""Dead-letter records: what replaces a message the service gave up on.

A record is published *before* its message is terminated, with a ``Nats-Msg-Id`` made of
the stage and the message's stream sequence, so a crash between the two leads to a
redelivery whose second record is dropped as a duplicate: nothing leaves a stream without
one. ``stage`` says which stream: ``process`` records fail their request closed (the
dead-letter consumer reads only those); ``record`` records are outcomes that were refused
and applied to nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from nats.js import JetStreamContext

from ...domain.errors import NonRetryable
from .errors import translated
from .publisher import MSG_ID_HEADER
from .topology import Topology

DEAD_LETTER_KIND = "dead_letter"


@dataclass(frozen=True)
class DeadLetter:
    """The record that replaces a message the process stage gave up on."""

    queue: str
    request_id: str
    error: str
    attempts: int
    stream_seq: int
    stage: str = "process"

    def encode(self) -> bytes:
        body = {
            "kind": DEAD_LETTER_KIND,
            "stage": self.stage,
            "queue": self.queue,
            "request_id": self.request_id,
            "error": self.error,
            "attempts": self.attempts,
            "stream_seq": self.stream_seq,
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> DeadLetter:
        try:
            body = json.loads(data)
            return cls(
                queue=str(body["queue"]),
                request_id=str(body["request_id"]),
                error=str(body["error"]),
                attempts=int(body["attempts"]),
                stream_seq=int(body["stream_seq"]),
                stage=str(body.get("stage", "process")),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise NonRetryable(f"dead letter is malformed: {exc}") from None


async def publish_dead_letter(
    js: JetStreamContext, topology: Topology, letter: DeadLetter, *, timeout: float = 5.0
) -> None:
    """Store ``letter``; its msg id is its stage and sequence, so a re-publish dedupes."""
    with translated(f"dead-letter {letter.request_id or '(unknown request)'}"):
        await js.publish(
            topology.dead_letter_subject(letter.queue, letter.stage),
            letter.encode(),
            timeout=timeout,
            stream=topology.dead_letter_stream,
            headers={MSG_ID_HEADER: f"{letter.stage}-{letter.stream_seq}"},
        )

"""Dead-letter records: what replaces a message the service gave up on.

A record is published *before* its message is terminated, with a ``Nats-Msg-Id`` made of
the stage and the message's stream sequence, so a crash between the two leads to a
redelivery whose second record is dropped as a duplicate: nothing leaves a stream without
one. ``stage`` says which stream: ``process`` records fail their request closed (the
dead-letter consumer reads only those); ``record`` records are outcomes that were refused
and applied to nothing.

A record is bounded (:data:`MAX_FIELD_CHARS` per text field, cut with a digest by
:func:`~stovepipe_fsm.domain.bounded_text.clip`): the request id and the error come from
the message, and a record over the broker's payload limit could never be published, so
the message it replaces could never be settled.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from nats.js import JetStreamContext

from ...domain.bounded_text import clip
from ...domain.errors import NonRetryable
from .errors import translated
from .publisher import MSG_ID_HEADER
from .topology import Topology

DEAD_LETTER_KIND = "dead_letter"
#: The most characters a text field of a record keeps (the queue name is bounded by its
#: own rule); a whole record stays well under 4 KiB after JSON escaping of these.
MAX_FIELD_CHARS = 1024


@dataclass(frozen=True)
class DeadLetter:
    """The record that replaces a message the process stage gave up on.

    Built with :meth:`bounded` from anything the message said; ``request_id`` is then
    either a whole id or empty (a clipped id would name no request).
    """

    queue: str
    request_id: str
    error: str
    attempts: int
    stream_seq: int
    stage: str = "process"

    @classmethod
    def bounded(
        cls,
        queue: str,
        request_id: str,
        error: str,
        attempts: int,
        stream_seq: int,
        stage: str = "process",
    ) -> DeadLetter:
        """A record whose text fields fit :data:`MAX_FIELD_CHARS`; a request id too long
        to keep is moved, clipped, into the error instead."""
        if len(request_id) > MAX_FIELD_CHARS:
            error = f"{error} (request id {clip(request_id, 200)})"
            request_id = ""
        return cls(
            clip(queue, MAX_FIELD_CHARS),
            request_id,
            clip(error, MAX_FIELD_CHARS),
            attempts,
            stream_seq,
            stage,
        )

    def minimal(self) -> DeadLetter:
        """The same record with the error cut to its first line, short: what is still
        worth trying when the full record could not be published."""
        first = self.error.splitlines()[0] if self.error else ""
        return replace(self, error=clip(first, 200))

    def encode(self) -> bytes:
        body = {"kind": DEAD_LETTER_KIND, **asdict(self)}
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
    js: JetStreamContext,
    topology: Topology,
    letter: DeadLetter,
    *,
    timeout: float = 5.0,
    subject: str | None = None,
) -> None:
    """Store ``letter``; its msg id is its stage and sequence, so a re-publish dedupes.

    ``subject`` replaces the queue's dead-letter subject (a message whose subject token
    names no valid queue is dead-lettered under that same token).
    """
    with translated(f"dead-letter {clip(letter.request_id, 200) or '(unknown request)'}"):
        await js.publish(
            subject or topology.dead_letter_subject(letter.queue, letter.stage),
            letter.encode(),
            timeout=timeout,
            stream=topology.dead_letter_stream,
            headers={MSG_ID_HEADER: f"{letter.stage}-{letter.stream_seq}"},
        )

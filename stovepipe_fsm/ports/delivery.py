"""Delivery port: one process message in hand.

The controller reads the message and may ask for more time; it never settles it. Its
flow ends by deciding to ack (done) or hold (postpone the same message by a delay that
never counts toward the failure budget), or it raises ``Retryable`` or ``NonRetryable``.
What becomes of the message is the settle policy's call
(:func:`~stovepipe_fsm.domain.settle.settle`) and the runtime performs it: retries,
dead letters, acks and holds alike.
"""

from __future__ import annotations

from typing import Protocol


class Delivery(Protocol):
    @property
    def queue(self) -> str:
        """The queue (partition) the message arrived on."""
        ...

    @property
    def request_id(self) -> str: ...

    @property
    def stream_seq(self) -> int:
        """The message's sequence in its stream (0 where there is none): the trail's
        reference to the delivery a decision was made on."""
        ...

    async def in_progress(self) -> None:
        """Extend the ack deadline during a long step (no-op where there is none)."""
        ...

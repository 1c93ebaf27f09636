"""Delivery port: one process message in hand.

The controller finishes a delivery exactly one way: ``ack`` (done), or ``hold(ms)``
(postpone the same message; it redelivers after ``ms`` and the wait never counts toward
the failure budget). Failure is signalled by raising ``Retryable`` or ``NonRetryable``;
the runtime, not the controller, owns retry accounting and dead-lettering.
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

    async def ack(self) -> None: ...

    async def hold(self, delay_ms: int) -> None: ...

    async def in_progress(self) -> None:
        """Extend the ack deadline during a long step (no-op where there is none)."""
        ...

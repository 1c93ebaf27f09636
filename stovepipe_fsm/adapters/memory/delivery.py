"""In-memory delivery: one process message, and how it was settled, for a test to read.

The controller only decides; the runtime settles the message, exactly once, by
performing the settle policy's answer. :meth:`MemoryDelivery.perform` is that performer
for an ack or a hold. Settling twice is a runtime bug (it would ack a message it also
postponed), so it raises instead of being recorded, and the test fails where the bug is.
"""

from __future__ import annotations

from typing import Final, Literal

from ...domain.settle import SettleKind, Settlement

Outcome = Literal["acked", "held"]
ACKED: Final = "acked"
HELD: Final = "held"


class DeliveryAlreadyFinished(RuntimeError):
    """A delivery already settled was settled again (or asked for more time)."""


class MemoryDelivery:
    """``Delivery`` recording its outcome (``acked`` or ``held`` with a delay)."""

    def __init__(self, queue: str, request_id: str, stream_seq: int = 0) -> None:
        self.queue: Final = queue
        self.request_id: Final = request_id
        self.stream_seq: Final = stream_seq
        self._outcome: Outcome | None = None
        self._delay_ms: int | None = None
        self.in_progress_calls = 0

    @property
    def outcome(self) -> Outcome | None:
        """``None`` until finished, then ``"acked"`` or ``"held"``."""
        return self._outcome

    @property
    def delay_ms(self) -> int | None:
        """The hold delay; ``None`` unless the delivery was held."""
        return self._delay_ms

    @property
    def finished(self) -> bool:
        return self._outcome is not None

    def perform(self, settlement: Settlement) -> None:
        """Settle the message as ``settlement`` says: an ack, or a hold for its delay.

        Only a flow that finished is settled here; what a raising flow leads to (a retry,
        a dead letter) is the runtime's, and a test reads the exception instead.
        """
        if settlement.kind is SettleKind.ACK:
            self._finish(ACKED)
        elif settlement.kind is SettleKind.HOLD:
            delay_ms = round(settlement.delay_s * 1000)
            if delay_ms < 0:
                raise ValueError(f"hold delay must be >= 0 ms, got {delay_ms}")
            self._finish(HELD)
            self._delay_ms = delay_ms
        else:
            raise ValueError(f"an in-memory delivery performs an ack or a hold, not {settlement}")

    async def in_progress(self) -> None:
        if self.finished:
            raise DeliveryAlreadyFinished(
                f"in_progress on {self.request_id!r} after it was {self._outcome}"
            )
        self.in_progress_calls += 1

    def _finish(self, outcome: Outcome) -> None:
        if self._outcome is not None:
            raise DeliveryAlreadyFinished(
                f"delivery of {self.request_id!r} on queue {self.queue!r} was already "
                f"{self._outcome}; cannot be {outcome} as well"
            )
        self._outcome = outcome

    def __repr__(self) -> str:
        delay = f", delay_ms={self._delay_ms}" if self._delay_ms is not None else ""
        return (
            f"MemoryDelivery(queue={self.queue!r}, request_id={self.request_id!r}, "
            f"outcome={self._outcome!r}{delay})"
        )

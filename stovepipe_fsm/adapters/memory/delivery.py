"""In-memory delivery: one process message whose outcome a test can read back.

The port says a controller finishes a delivery exactly one way. Finishing twice is a
controller bug (it would ack a message it also postponed), so it raises instead of being
recorded, and the test fails where the bug is.
"""

from __future__ import annotations

from typing import Final, Literal

Outcome = Literal["acked", "held"]
ACKED: Final = "acked"
HELD: Final = "held"


class DeliveryAlreadyFinished(RuntimeError):
    """``ack`` or ``hold`` was called on a delivery that was already finished."""


class MemoryDelivery:
    """``Delivery`` recording its outcome (``acked`` or ``held`` with a delay)."""

    def __init__(self, queue: str, request_id: str, stream_seq: int = 0) -> None:
        self._queue = queue
        self._request_id = request_id
        self._stream_seq = stream_seq
        self._outcome: Outcome | None = None
        self._delay_ms: int | None = None
        self.in_progress_calls = 0

    @property
    def queue(self) -> str:
        return self._queue

    @property
    def stream_seq(self) -> int:
        return self._stream_seq

    @property
    def request_id(self) -> str:
        return self._request_id

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

    async def ack(self) -> None:
        self._finish(ACKED)

    async def hold(self, delay_ms: int) -> None:
        if delay_ms < 0:
            raise ValueError(f"hold delay must be >= 0 ms, got {delay_ms}")
        self._finish(HELD)
        self._delay_ms = delay_ms

    async def in_progress(self) -> None:
        if self.finished:
            raise DeliveryAlreadyFinished(
                f"in_progress on {self._request_id!r} after it was {self._outcome}"
            )
        self.in_progress_calls += 1

    def _finish(self, outcome: Outcome) -> None:
        if self._outcome is not None:
            raise DeliveryAlreadyFinished(
                f"delivery of {self._request_id!r} on queue {self._queue!r} was already "
                f"{self._outcome}; cannot be {outcome} as well"
            )
        self._outcome = outcome

    def __repr__(self) -> str:
        delay = f", delay_ms={self._delay_ms}" if self._delay_ms is not None else ""
        return (
            f"MemoryDelivery(queue={self._queue!r}, request_id={self._request_id!r}, "
            f"outcome={self._outcome!r}{delay})"
        )

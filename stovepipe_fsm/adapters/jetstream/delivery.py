"""The Delivery port over one JetStream process message."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from nats.aio.msg import Msg

from .errors import translated


class JetStreamDelivery:
    """The Delivery port over one JetStream message (the consumer settles the message).

    ``in_progress`` only reaches the broker once half of ``ack_wait_s`` has passed since
    the message arrived (or since it last reached it): before that the deadline is still
    at least half an ack wait away, and the round trip would be pure cost on every admit.
    A step that may outlast that half (a slow git call) is covered by the service's
    heartbeat, which calls this regularly while a delivery is handled.
    """

    def __init__(
        self,
        msg: Msg,
        queue: str,
        request_id: str,
        *,
        ack_wait_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._msg = msg
        self.queue: Final = queue
        self.request_id: Final = request_id
        self._clock = clock
        self._half_wait = ack_wait_s / 2 if ack_wait_s else 0.0
        self._extend_after = clock() + self._half_wait
        self.extensions = 0

    @property
    def stream_seq(self) -> int:
        return int(self._msg.metadata.sequence.stream)

    async def in_progress(self) -> None:
        now = self._clock()
        if now < self._extend_after:
            return
        with translated(f"in-progress {self.request_id}"):
            await self._msg.in_progress()
        self.extensions += 1
        self._extend_after = now + self._half_wait  # a fresh deadline from now

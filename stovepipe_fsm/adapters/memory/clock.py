"""Clocks in milliseconds: a manual one for simulated time, the system one for serving.

Hook timestamps and hold bookkeeping read the clock through the ``Clock`` port, so
``simulate`` and ``check`` replay identically by driving a :class:`ManualClock`.
"""

from __future__ import annotations

import time


class ManualClock:
    """A clock that moves only when told to; never goes backwards through ``advance``."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now_ms = int(start_ms)

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, ms: int) -> int:
        """Move forward by ``ms`` (>= 0) and return the new time."""
        if ms < 0:
            raise ValueError(f"cannot advance a clock by a negative amount ({ms} ms)")
        self._now_ms += int(ms)
        return self._now_ms

    def set(self, now_ms: int) -> None:
        """Jump to ``now_ms`` (either direction, e.g. to replay a wall-clock step back)."""
        self._now_ms = int(now_ms)

    def clone(self) -> ManualClock:
        return ManualClock(self._now_ms)


class SystemClock:
    """Wall-clock milliseconds since the epoch, as an int (no float rounding)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

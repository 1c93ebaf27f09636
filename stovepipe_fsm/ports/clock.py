"""Clock port: milliseconds, so simulate and check can run on simulated time."""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...

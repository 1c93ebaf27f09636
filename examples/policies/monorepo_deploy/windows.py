"""Daily UTC time windows written ``HH:MM-HH:MM``: parsing and membership.

A helper of ``maintenance_window.py``, imported relatively (``from . import windows``)
so that it is loaded with the plugin, from the same policy directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DAY_MS = 24 * 60 * 60 * 1000
_WINDOW = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")


@dataclass(frozen=True)
class Window:
    """From ``start_ms`` to ``end_ms`` after midnight UTC; past midnight when end < start."""

    text: str
    start_ms: int
    end_ms: int

    def contains(self, now_ms: int) -> bool:
        at = now_ms % DAY_MS
        if self.start_ms <= self.end_ms:
            return self.start_ms <= at < self.end_ms
        return at >= self.start_ms or at < self.end_ms


def parse(text: str) -> Window:
    """``02:00-04:00`` as a :class:`Window`; ``ValueError`` naming the text otherwise."""
    found = _WINDOW.match(text)
    if found is None:
        raise ValueError(f"maintenance window {text!r} is not HH:MM-HH:MM (UTC)")
    h1, m1, h2, m2 = (int(part) for part in found.groups())
    return Window(text, (h1 * 60 + m1) * 60_000, (h2 * 60 + m2) * 60_000)


def current(texts: list[str], now_ms: int) -> str:
    """The first window of ``texts`` that ``now_ms`` falls in ("" when none)."""
    return next((t for t in texts if parse(t).contains(now_ms)), "")

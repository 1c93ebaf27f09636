"""Ages and waits on the command line: ``90s``, ``15m``, ``12h``, ``7d``, ``2w``, or seconds."""

from __future__ import annotations

import re

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def parse_duration(text: str) -> float:
    """Seconds in ``text``; ``ValueError`` saying what is accepted. Must be positive."""
    match = _DURATION_RE.match(text)
    if match is None:
        raise ValueError(
            f"{text!r} is not a duration: a number with an optional unit s, m, h, d or w "
            "(e.g. 30s, 7d)"
        )
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds <= 0:
        raise ValueError(f"{text!r}: a duration must be positive")
    return seconds

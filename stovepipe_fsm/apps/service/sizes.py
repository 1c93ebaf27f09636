"""Sizes on the command line: ``1GiB``, ``512MiB``, ``64KiB``, or bytes."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in ``text``; ``ValueError`` saying what is accepted. Must be positive."""
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"{text!r} is not a size: a whole number with an optional unit B, KiB, MiB, GiB "
            "or TiB (e.g. 1GiB)"
        )
    size = int(match.group(1)) * _UNITS[unit]
    if size <= 0:
        raise ValueError(f"{text!r}: a size must be positive")
    return size

"""Plain-text tables of ``whatif``: columns padded to their widest cell."""

from __future__ import annotations

from typing import Any


def at(block: dict[str, Any], path: tuple[str, ...]) -> str:
    """The figure at ``path`` in a ``FIGURES`` block, as text (``-`` for none)."""
    value: Any = block
    for key in path:
        value = value[key]
    return "-" if value is None else str(value)


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """``header``, a rule, then ``rows``, each column as wide as its widest cell."""
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, tuple("-" * w for w in widths), *rows]
    ]

"""Source-control port: ancestry only. Process never parses a URI.

``is_ancestor(a, b)`` answers whether commit ``a`` is an ancestor of (or equal to)
commit ``b``. It raises ``NotFound`` when either commit is unknown (ancestry
uncertainty: the caller falls back to a full build) and ``Retryable`` for anything
transient (connection, timeout); every other outcome is a bool.
"""

from __future__ import annotations

from typing import Protocol


class SourceControl(Protocol):
    async def is_ancestor(self, ancestor: str, descendant: str) -> bool: ...


class SourceControlProvider(Protocol):
    """Which source control answers for a queue; ``None`` means none is configured."""

    def for_queue(self, queue: str) -> SourceControl | None: ...

"""Source-control port: ancestry and changed paths. Process never parses a URI.

``is_ancestor(a, b)`` answers whether commit ``a`` is an ancestor of (or equal to)
commit ``b``. ``changed_paths(a, b)`` is the set of file paths (relative to the
repository root, ``/``-separated) whose content differs between commits ``a`` and ``b``.
``first_parent(c)`` is commit ``c``'s first parent (``""`` for a root commit).
``first_parents_after(base, head, limit)`` is the commits of ``head``'s first-parent line
that ``base`` does not reach, oldest first, ``head`` last (a culprit search's blamelist):
the newest ``limit`` of them, so more than ``limit - 1`` tells a caller its bound is
passed. All four raise ``NotFound`` when either commit is unknown (uncertainty: the caller falls
back to a full build) and ``Retryable`` for anything transient (connection, timeout).
"""

from __future__ import annotations

from typing import Protocol


class SourceControl(Protocol):
    async def is_ancestor(self, ancestor: str, descendant: str) -> bool: ...

    async def changed_paths(self, base: str, head: str) -> frozenset[str]: ...

    async def first_parent(self, commit: str) -> str: ...

    async def first_parents_after(self, base: str, head: str, limit: int) -> tuple[str, ...]: ...


class SourceControlProvider(Protocol):
    """Which source control answers for a queue; ``None`` means none is configured."""

    def for_queue(self, queue: str) -> SourceControl | None: ...

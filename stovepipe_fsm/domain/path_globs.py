"""Globs over repository paths, as build files are named: ``WORKSPACE``, ``**/*.bzl``.

``*`` and ``?`` stay within one path segment; ``**`` spans segments (``**/`` also
matches none, so ``**/*.bzl`` matches ``defs.bzl`` at the root too). A glob without
``/`` still matches only at the root: ``BUILD`` is the root file, ``**/BUILD`` any.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache

#: A glob's pieces, in the order they are tried at each position, and what each means.
_PIECES = re.compile(r"\*\*/|\*\*|\*|\?|[^*?]+")
_MEANINGS = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}


@cache
def _pattern(glob: str) -> re.Pattern[str]:
    pieces = _PIECES.findall(glob)
    return re.compile("".join(_MEANINGS.get(p) or re.escape(p) for p in pieces))


def path_matches(path: str, glob: str) -> bool:
    """Whether repository path ``path`` matches ``glob``."""
    return _pattern(glob).fullmatch(path) is not None


def first_match(paths: Iterable[str], globs: Iterable[str]) -> tuple[str, str] | None:
    """The first (path, glob) pair that matches, in sorted path order; ``None`` if none."""
    patterns = tuple(globs)
    pairs = ((path, glob) for path in sorted(paths) for glob in patterns)
    return next(((path, glob) for path, glob in pairs if path_matches(path, glob)), None)


def all_match(paths: Iterable[str], globs: Iterable[str]) -> tuple[tuple[str, str], ...] | None:
    """Each path with the first glob it matches, in sorted path order, when every path
    matches one; ``None`` when some path matches none, or there are no paths."""
    patterns = tuple(globs)
    pairs: list[tuple[str, str]] = []
    for path in sorted(paths):
        glob = next((g for g in patterns if path_matches(path, g)), None)
        if glob is None:
            return None
        pairs.append((path, glob))
    return tuple(pairs) or None

"""Commit-ish arguments: what may be handed to git, and what may be cached.

A URI comes from outside (a webhook, an operator); passed to git unchecked, a value
such as ``--output=...`` would be read as an option. No commit on a ref can be named by
a string that starts with ``-`` or contains whitespace or control characters, so such a
value is answered like any other name git does not know: ``NotFound``.
"""

from __future__ import annotations

import re

from ...domain.errors import NotFound

_FULL_ID = re.compile(r"(?:[0-9a-fA-F]{40}|[0-9a-fA-F]{64})")


def check_commitish(value: object) -> str:
    """Return ``value`` if it is safe to pass to git as a revision, else raise ``NotFound``."""
    if not isinstance(value, str) or not value:
        raise NotFound(f"commit {value!r} is not a revision name")
    if value.startswith("-"):
        raise NotFound(f"commit {value!r} is not a revision name (starts with '-')")
    for char in value:
        if char.isspace() or ord(char) < 0x20 or ord(char) == 0x7F:
            raise NotFound(f"commit {value!r} is not a revision name (contains {char!r})")
    return value


def is_full_commit_id(value: str) -> bool:
    """A complete SHA-1 or SHA-256 object id (names exactly one immutable object).

    Only such ids may key a cache: a branch name or an abbreviated id can come to mean
    another commit later (a push, a new object making the prefix ambiguous).
    """
    return _FULL_ID.fullmatch(value) is not None

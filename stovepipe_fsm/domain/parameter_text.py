"""Parameter values and commits as people read them, not as Python prints them.

A policy's parameters are YAML values (numbers, booleans, strings, lists of globs); the
trail, ``explain``, ``status``, the status page and the policy card show them the way
the YAML spells them (``true``, ``[WORKSPACE, "**/BUILD.bazel"]`` reads
``[WORKSPACE, **/BUILD.bazel]``), never as a Python ``repr`` (``True``, ``('a',)``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

#: Characters of a commit id shown in text: enough to be unique in a large repository.
SHORT_COMMIT = 10
_HEX_ID = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


def value_text(value: object) -> str:
    """One parameter value as its YAML reads: ``true``, ``5000``, ``[a, b]``, ``[]``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {value_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple | frozenset | set):
        items = sorted(value, key=str) if isinstance(value, frozenset | set) else value
        return "[" + ", ".join(value_text(v) for v in items) + "]"
    return str(value)


def parameters_text(parameters: Iterable[tuple[str, object]]) -> str:
    """``name=value, ...`` sorted by name, each value as :func:`value_text` reads it."""
    return ", ".join(f"{k}={value_text(v)}" for k, v in sorted(parameters))


def short_commit(uri: str) -> str:
    """A full git commit id (40 or 64 hex digits) cut to :data:`SHORT_COMMIT`; any other
    uri (a branch name, a test's ``A``) as it is."""
    return uri[:SHORT_COMMIT] if _HEX_ID.fullmatch(uri) else uri

"""``ingest --from``: heads as JSON lines, read and checked whole before any write.

One JSON object per line: ``queue`` and ``uri`` (strings, required), ``at_head``
(boolean, optional: the uri is what the ref names right now) and ``parents`` (a list of
commit ids, optional: accepted so a timeline's or an export's head lines can be fed as
they are; ingest takes ancestry from source control, not from the line). Blank lines are
skipped. Any other key, a value of the wrong type, a bad queue name or uri stops the read
with the line number, and the command exits 2 before it connects: a batch with a bad
line writes nothing at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from ...domain.queue_names import InvalidQueueName, normalize_queue_name
from ...pipeline.ingest import Head, InvalidUri

_KEYS = frozenset({"queue", "uri", "at_head", "parents"})


class BadHeadLine(ValueError):
    """A line of a heads file that is not a head; the message names the line."""


def read_heads(lines: Iterable[str], source: str) -> list[Head]:
    heads: list[Head] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            heads.append(_head(line))
        except (ValueError, InvalidQueueName, InvalidUri) as exc:
            raise BadHeadLine(f"{source}:{number}: {exc}") from None
    return heads


def _head(line: str) -> Head:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(item, dict):
        raise ValueError(f"expected a JSON object, got {type(item).__name__}")
    unknown = sorted(set(item) - _KEYS)
    if unknown:
        allowed = ", ".join(sorted(_KEYS))
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; allowed: {allowed}")
    for key in ("queue", "uri"):
        if not isinstance(item.get(key), str):
            raise ValueError(f"{key!r} must be a string")
    at_head = item.get("at_head", False)
    if not isinstance(at_head, bool):
        raise ValueError("'at_head' must be true or false")
    parents = item.get("parents", [])
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise ValueError("'parents' must be a list of strings")
    return Head(normalize_queue_name(item["queue"]), item["uri"], at_head).checked()

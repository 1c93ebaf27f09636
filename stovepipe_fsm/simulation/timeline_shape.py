"""The timeline schema's answer for a step, a history and a header, without the schema.

Validating a recorded history of 100,000 heads with the JSON-schema validator costs more
than replaying it: every step goes through the ``oneOf`` of every step kind. These
predicates say, for each shape, exactly what ``timeline.schema.json`` says (valid or
not), specialised by hand for the step kinds a recorded history holds; a test checks
them against the schema over every timeline fixture and a corpus of defects.

They only answer yes or no. A timeline they refuse is validated again with the schema,
whose messages and locations are what the user reads; an ``expect`` step is always left
to the schema (:func:`step_decided`), and so is a header with anything unusual in it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator

from ..located.schema import load_schema
from .world import CRASH_POINTS, STALL_POINTS

_TARGET_KINDS = frozenset(
    {"ingest", "redeliver", "dead_letter", "resume", "cancel", "return", "retry", "failing"}
)
_BARE = frozenset({"deliver", "run"})
_SOURCE_CONTROL = frozenset({"down", "up"})
_OUTCOME = re.compile("^[a-z][a-z0-9_]*$")  # the schema's pattern, searched as it searches
_PARAMETER_TYPES = (bool, int, float, str, list)


def _text(value: Any) -> bool:
    return type(value) is str and value != ""


def _target(value: Any) -> bool:
    if type(value) is str:
        return value != ""
    if type(value) is not dict or "uri" not in value or not _text(value["uri"]):
        return False
    return all(k == "uri" or (k == "queue" and _text(v)) for k, v in value.items())


def _integer(value: Any) -> bool:
    """JSON Schema's integer: an int that is not a bool, or a float with no fraction."""
    if type(value) is int:
        return True
    return type(value) is float and value.is_integer()


def _complete(value: Any) -> bool:
    if type(value) is not dict or not _text(value.get("uri")):
        return False
    outcome = value.get("outcome")
    if type(outcome) is not str or not _OUTCOME.search(outcome):
        return False
    return all(k in ("uri", "outcome") or (k == "queue" and _text(v)) for k, v in value.items())


def _config(value: Any) -> bool:
    if type(value) is not dict or not value:
        return False
    for key, item in value.items():
        if key == "queue":
            if not _text(item):
                return False
        elif not isinstance(item, _PARAMETER_TYPES):
            return False
    return True


def step_valid(raw: Any) -> bool:
    """Whether the schema accepts ``raw`` as a step; only for the steps
    :func:`step_decided` says it decides."""
    if type(raw) is str:
        return raw in _BARE
    if type(raw) is not dict or len(raw) != 1:
        return False
    ((kind, value),) = raw.items()
    if kind in _TARGET_KINDS:
        return _target(value)
    if kind in ("advance_ms", "run_ms"):
        return _integer(value) and value >= 0
    if kind == "complete":
        return _complete(value)
    if kind == "crash":
        return type(value) is str and value in CRASH_POINTS
    if kind == "source_control":
        return type(value) is str and value in _SOURCE_CONTROL
    if kind == "stall":
        return type(value) is str and value in STALL_POINTS
    if kind == "config":
        return _config(value)
    return False


def step_decided(raw: Any) -> bool:
    """Whether :func:`step_valid` answers for ``raw`` (everything but an ``expect`` step)."""
    return not (type(raw) is dict and "expect" in raw)


def commits_valid(commits: Any) -> bool:
    """The schema's ``history`` (and ``changes``): commit -> a list of non-empty strings."""
    if type(commits) is not dict:
        return False
    for ids in commits.values():
        if type(ids) is not list:
            return False
        for item in ids:
            if type(item) is not str or item == "":
                return False
    return True


def changes_valid(changes: Any) -> bool:
    """The schema's ``changes``: commit -> a list of paths, or a map of path -> content id."""
    if type(changes) is not dict:
        return False
    for paths in changes.values():
        if type(paths) is dict:
            for path, content in paths.items():
                if path == "" or type(content) is not str:
                    return False
        elif not commits_valid({"": paths}):
            return False
    return True


def builds_valid(builds: Any) -> bool:
    """The schema's ``builds``: a list of ``{uri, queue?, admitted_ms?, duration_ms,
    outcome}``."""
    if type(builds) is not list:
        return False
    for build in builds:
        if type(build) is not dict or not _text(build.get("uri")):
            return False
        duration: Any = build.get("duration_ms")
        outcome = build.get("outcome")
        if not (_integer(duration) and duration >= 0):
            return False
        if type(outcome) is not str or not _OUTCOME.search(outcome):
            return False
        if any(k not in _BUILD_KEYS or (k == "queue" and not _text(v)) for k, v in build.items()):
            return False
        admitted: Any = build.get("admitted_ms", 0)
        if not (_integer(admitted) and admitted >= 0):
            return False
    return True


_BUILD_KEYS = frozenset({"uri", "queue", "admitted_ms", "duration_ms", "outcome"})


def header_valid(header: Mapping[str, Any]) -> bool:
    """Whether the schema accepts a timeline whose bulk keys (:data:`~.timeline_lines.BULK`) are
    empty and whose other keys are ``header``'s: the header alone, by the schema."""
    return bool(_header_validator().is_valid({**header, "steps": []}))


@cache
def _header_validator() -> Draft202012Validator:
    return Draft202012Validator(load_schema("timeline"))

"""The JSON-lines timeline: recorded history in a form that reads as fast as it writes.

One JSON value per line (docs/whatif.md, schema ``timeline-lines.schema.json``)::

    {"timeline": 1, "queue": "repo/main", "description": "...", "config": {...}}
    {"commit": "c1", "parents": []}
    {"commit": "c2", "parents": ["c1"], "changes": ["src/a.py"]}
    {"ingest": {"uri": "c1", "queue": "repo/main"}}
    "run"
    {"advance_ms": 1000}

The first line is the header: ``"timeline": 1`` (the format's version) and the keys of a
YAML timeline other than its bulk (``steps``, ``history``, ``changes``, ``builds``). Every
other line is a commit of the history (``commit``, ``parents``, optional ``changes``), a recorded
build (``{"build": {...}}``, an entry of the YAML form's ``builds``, in order) or a step,
written exactly as a step of a YAML timeline. Commits may come anywhere (the history is a
graph, read whole before the run); steps run in file order. Blank lines are skipped.

A file is read into the same data a YAML timeline parses to, each value located at its
line (column 1; a JSON syntax error at its column), so every check and message is the
YAML timeline's. :func:`timeline_lines` writes one (``export --out FILE.jsonl``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..located.errors import Location, SpecError, SpecIssue
from ..located.yaml_source import JsonPath, SourceDocument

FORMAT_KEY = "timeline"
FORMAT_VERSION = 1
SUFFIXES = (".jsonl", ".ndjson")
#: The keys a header leaves out (given line by line), which the fast path checks by shape.
BULK = ("steps", "history", "changes", "builds")


class _DuplicateKey(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(f"duplicate key {key!r}")
            seen.add(key)
    return out


def is_lines(path: str | Path, head: bytes) -> bool:
    """Whether a timeline file is JSON lines: by its suffix, else by its first line
    (``head``: the file's first bytes) being a JSON object with the format key."""
    suffix = Path(path).suffix.lower()
    if suffix in SUFFIXES:
        return True
    if suffix in (".yaml", ".yml"):
        return False
    first = head.lstrip().split(b"\n", 1)[0]
    if not first.startswith(b"{"):
        return False
    try:
        value = json.loads(first)
    except ValueError:
        return False
    return isinstance(value, dict) and FORMAT_KEY in value


def parse_lines(text: str, file: str) -> SourceDocument:
    """The timeline data of a JSON-lines file, each value located at its line.

    Raises :class:`SpecError` for what only this format can get wrong (a line that is not
    JSON, a missing or unknown header, a commit listed twice); everything else is the
    timeline's own checking.
    """
    values: dict[JsonPath, Location] = {}
    keys: dict[JsonPath, Location] = {}
    issues: list[SpecIssue] = []
    header: dict[str, Any] | None = None
    steps: list[Any] = []
    history: dict[str, Any] = {}
    changes: dict[str, Any] = {}
    builds: list[Any] = []
    decode = json.JSONDecoder(object_pairs_hook=_pairs).decode
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = Location(file, number, 1)
        try:
            value = decode(line)
        except json.JSONDecodeError as exc:
            issues.append(SpecIssue(Location(file, number, exc.colno), f"not JSON: {exc.msg}"))
            continue
        except _DuplicateKey as exc:
            issues.append(SpecIssue(where, f"{exc}; remove one of them"))
            continue
        if header is None:
            header = _header(value, where, issues)
            for key in header:
                values[(key,)] = keys[(key,)] = where
            continue
        if isinstance(value, dict) and "commit" in value:
            _commit(value, where, history, changes, values, keys, issues)
            continue
        if isinstance(value, dict) and "build" in value and len(value) == 1:
            values[("builds", len(builds))] = where
            builds.append(value["build"])
            continue
        values[("steps", len(steps))] = where
        steps.append(value)
    if header is None:
        issues.append(SpecIssue(Location(file, 1, 1), "file is empty; expected a header line"))
    if issues:
        raise SpecError(issues)
    data: dict[str, Any] = dict(header or {})
    data["steps"] = steps
    if history:
        data["history"] = history
    if changes:
        data["changes"] = changes
    if builds:
        data["builds"] = builds
    values.setdefault((), Location(file, 1, 1))
    values.setdefault(("steps",), Location(file, 1, 1))
    return SourceDocument(file, data, values, keys)


def _header(value: Any, where: Location, issues: list[SpecIssue]) -> dict[str, Any]:
    if not isinstance(value, dict) or value.get(FORMAT_KEY) != FORMAT_VERSION:
        expected = f'{{"{FORMAT_KEY}": {FORMAT_VERSION}, ...}}'
        issues.append(SpecIssue(where, f"the first line must be the header, {expected}"))
        return {}
    header = {k: v for k, v in value.items() if k != FORMAT_KEY}
    for key in BULK:
        if key in header:
            issues.append(
                SpecIssue(where, f"{key!r} does not go in the header: give it line by line")
            )
            del header[key]
    return header


_COMMIT_KEYS = frozenset({"commit", "parents", "changes"})


def _commit(
    value: dict[str, Any],
    where: Location,
    history: dict[str, Any],
    changes: dict[str, Any],
    values: dict[JsonPath, Location],
    keys: dict[JsonPath, Location],
    issues: list[SpecIssue],
) -> None:
    commit = value["commit"]
    unknown = sorted(set(value) - _COMMIT_KEYS)
    if not isinstance(commit, str) or not commit or "parents" not in value or unknown:
        extra = f" (unknown key {unknown[0]!r})" if unknown else ""
        shape = (
            'a commit line is {"commit": ID, "parents": [ID, ...]} with an optional '
            f'"changes": [PATH, ...] or {{PATH: CONTENT_ID, ...}}{extra}'
        )
        issues.append(SpecIssue(where, shape))
        return
    if commit in history:
        first = keys[("history", commit)]
        issues.append(
            SpecIssue(where, f"commit {commit!r} is listed twice (first at line {first.line})")
        )
        return
    history[commit] = value["parents"]
    keys[("history", commit)] = values[("history", commit)] = where
    if "changes" in value:
        changes[commit] = value["changes"]
        keys[("changes", commit)] = values[("changes", commit)] = where


def timeline_lines(doc: Mapping[str, Any]) -> Iterator[str]:
    """A timeline document (the YAML form's data) as JSON lines, each without its newline:
    the header, the history's commits, the recorded builds, then the steps."""
    header = {FORMAT_KEY: FORMAT_VERSION, **{k: v for k, v in doc.items() if k not in BULK}}
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": ")).encode
    yield dumps(header)
    changes: Mapping[str, Any] = doc.get("changes", {})
    for commit, parents in doc.get("history", {}).items():
        line: dict[str, Any] = {"commit": commit, "parents": list(parents)}
        if commit in changes:
            paths = changes[commit]
            line["changes"] = dict(paths) if isinstance(paths, Mapping) else list(paths)
        yield dumps(line)
    for build in doc.get("builds", []):
        yield dumps({"build": build})
    for step in doc.get("steps", []):
        yield dumps(step)

"""JSON Schema (draft 2020-12) validation with errors mapped back to YAML locations.

The schemas ship inside the package (``stovepipe_fsm/spec/schemas``) so the loader
never depends on the working directory; ``docs/schemas`` holds published copies that
a test keeps identical.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from .errors import SpecIssue
from .yaml_source import JsonPath, SourceDocument

SCHEMA_NAMES = ("machine", "queues")


@cache
def load_schema(name: str) -> dict[str, Any]:
    """The packaged schema ``<name>.schema.json``."""
    text = resources.files(__package__).joinpath("schemas", f"{name}.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    Draft202012Validator.check_schema(schema)
    return schema


@cache
def _validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(load_schema(name))


def schema_issues(doc: SourceDocument, schema_name: str) -> list[SpecIssue]:
    """Every schema violation in ``doc``, each located at the offending key or value."""
    issues: list[SpecIssue] = []
    for error in _validator(schema_name).iter_errors(doc.data):
        issues.extend(_describe(doc, error))
    return issues


def _describe(doc: SourceDocument, error: ValidationError) -> list[SpecIssue]:
    path: JsonPath = tuple(error.absolute_path)
    where = _display_path(path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        patterns = list(error.schema.get("patternProperties", {}))
        extras = [
            key
            for key in error.instance
            if key not in allowed and not any(re.search(p, key) for p in patterns)
        ]
        hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return [
            SpecIssue(
                doc.locate((*path, key), key=True),
                f"unknown key {key!r} in {where}{hint}",
            )
            for key in extras
        ]
    if error.validator in ("oneOf", "anyOf") and error.context:
        # Report the branch that got furthest: the one whose error path is deepest.
        best = max(error.context, key=lambda e: (len(e.absolute_path), -len(str(e.message))))
        if len(best.absolute_path) > len(error.absolute_path):
            return _describe(doc, best)
    message = error.schema.get("errorMessage") if isinstance(error.schema, dict) else None
    text = message or error.message
    return [SpecIssue(doc.locate(path), f"{where}: {text}")]


def _display_path(path: JsonPath) -> str:
    if not path:
        return "document"
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out

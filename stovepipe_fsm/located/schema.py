"""JSON Schema (draft 2020-12) validation with errors mapped back to YAML locations.

The schemas ship inside the package (``stovepipe_fsm/located/schemas``) so the loader
never depends on the working directory; ``docs/schemas`` holds published copies that
a test keeps identical.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
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


def schema_issues(
    doc: SourceDocument, schema_name: str, *, schema: Mapping[str, Any] | None = None
) -> list[SpecIssue]:
    """Every schema violation in ``doc``, each located at the offending key or value.

    ``schema`` replaces the packaged schema ``schema_name`` (a schema a loader derived
    from it, e.g. with a policy's declared parameters added).
    """
    validator = _validator(schema_name) if schema is None else Draft202012Validator(schema)
    return [issue for error in validator.iter_errors(doc.data) for issue in _describe(doc, error)]


def _describe(doc: SourceDocument, error: ValidationError) -> list[SpecIssue]:
    path: JsonPath = tuple(error.absolute_path)
    where = _display_path(path)
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(schema.get("properties", {}))
        patterns = list(schema.get("patternProperties", {}))
        extras = [
            key
            for key in error.instance
            if key not in allowed and not any(re.search(p, key) for p in patterns)
        ]
        hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return [
            SpecIssue(doc.locate((*path, key), key=True), f"unknown key {key!r} in {where}{hint}")
            for key in extras
        ]
    if error.validator in ("oneOf", "anyOf") and error.context:
        branch = _fitting_branch(error)
        if branch:
            return [issue for sub in branch for issue in _describe(doc, sub)]
    message = error.schema.get("errorMessage") if isinstance(error.schema, dict) else None
    text = message or error.message
    return [SpecIssue(doc.locate(path), f"{where}: {text}")]


def _fitting_branch(error: ValidationError) -> list[ValidationError]:
    """Errors of the alternative the value was evidently written for, or ``[]``.

    A state is a name *or* a mapping: a mapping with an unknown key fails both branches at
    the same depth, so picking "the deepest error" would drop to the useless "not valid
    under any of the given schemas" and lose the key's location. Branches the value does
    not even have the shape of (a ``type``/``const``/``enum`` miss on the value itself) are
    discarded, and so are branches missing a required key when another branch is not (the
    required key is what tells object alternatives apart). Of the rest, the one whose
    errors reach deepest wins and all its errors are reported, so one run shows every
    defect. When the choice stays ambiguous the caller keeps the generic message.
    """
    branches: dict[object, list[ValidationError]] = {}
    for sub in error.context or ():
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    depth = len(error.absolute_path)

    def misses(errors: list[ValidationError], validators: tuple[str, ...]) -> bool:
        return any(e.validator in validators and len(e.absolute_path) == depth for e in errors)

    fitting = [e for e in branches.values() if not misses(e, ("type", "const", "enum"))]
    complete = [e for e in fitting if not misses(e, ("required",))]
    candidates = complete or (fitting if len(fitting) == 1 else [])
    if not candidates:
        return []
    return max(candidates, key=lambda errors: max(len(e.absolute_path) for e in errors))


def _display_path(path: JsonPath) -> str:
    if not path:
        return "document"
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out

"""Loading ``config/queues.yaml`` into a :class:`QueuePolicy`, reporting every issue at once.

The order is fixed: parse (syntax and duplicate keys stop here, there is nothing
sound to check further), then JSON Schema and the key checks side by side, and only a
document with no issue is turned into a policy. Building the value from validated data
means the construction code never has to defend against bad input.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..domain.entities import RUNTIME_KEYS, QueueConfig
from ..located.errors import SpecError, SpecIssue
from ..located.schema import load_schema, schema_issues
from ..located.yaml_source import SourceDocument, read_yaml
from ..machine.model import ParameterSpec
from .checks import (
    HOLD_DELAY,
    INVARIANTS,
    LEASE,
    QUEUES,
    invariant_scope_issues,
    key_issues,
    lease_issues,
)
from .policy import InvariantScope, PolicyEntry, QueuePolicy, Settings

DEFAULTS = "defaults"
SCHEMA_NAME = "queues"
MEMORY_SOURCE = "<memory>"


#: The policy's parameter declarations, by name. ``None`` loads *tolerantly*: any key
#: beyond the runtime's own is kept as a parameter unchecked, for the operator commands
#: that do not run the policy and must not fail on a key a newer machine file declares.
Declarations = Mapping[str, ParameterSpec] | None


def load_queue_config(
    path: str | Path, *, display_name: str | None = None, parameters: Declarations = None
) -> QueuePolicy:
    """Read, validate and build the policy in ``path``; raise SpecError with all issues."""
    return policy_from_document(read_yaml(path, display_name=display_name), parameters)


def check_queue_config(
    path: str | Path,
    *,
    display_name: str | None = None,
    parameters: Declarations = None,
    other_keys: bool = False,
) -> list[SpecIssue]:
    """Every issue in ``path`` (empty when the file is good), for ``validate``.

    ``other_keys`` accepts keys beyond the declared ones (their values unchecked): for a
    run in which some machine file did not load, whose declarations are unknown.
    """
    try:
        doc = read_yaml(path, display_name=display_name)
    except SpecError as error:
        return list(error.issues)
    issues = document_issues(doc, parameters, other_keys=other_keys)
    return list(SpecError(issues).issues) if issues else []  # in the order a load reports


def policy_from_mapping(
    data: Mapping[str, Any], *, source: str = MEMORY_SOURCE, parameters: Declarations = None
) -> QueuePolicy:
    """Validate in-memory content shaped like the YAML file and build the policy.

    Used where there is no file (tests, simulation). Without a file there are no line
    numbers, so issues point at ``<source>:1:1`` and name the offending path instead.
    """
    return policy_from_document(SourceDocument(source, _plain(data), {}, {}), parameters)


def settings_schema(parameters: Declarations, *, other_keys: bool = False) -> dict[str, Any]:
    """The queues schema with the declared parameters as the only keys beyond the
    runtime's own (an unknown key is then an error listing them), or as published
    (any further key allowed) when loading tolerantly."""
    schema = copy.deepcopy(load_schema(SCHEMA_NAME))
    if parameters is None:
        return schema
    settings = schema["$defs"]["settings"]
    for name, parameter in parameters.items():
        settings["properties"][name] = {
            **parameter.value_schema(),
            "description": parameter.description,
        }
    settings["additionalProperties"] = other_keys
    return schema


def document_issues(
    doc: SourceDocument, parameters: Declarations = None, *, other_keys: bool = False
) -> list[SpecIssue]:
    """Schema violations plus key problems of a parsed document."""
    schema = settings_schema(parameters, other_keys=other_keys)
    issues = [*schema_issues(doc, SCHEMA_NAME, schema=schema), *key_issues(doc)]
    issues += invariant_scope_issues(doc)
    if parameters is not None and LEASE in parameters and HOLD_DELAY in parameters:
        issues += lease_issues(doc, parameters[HOLD_DELAY].default)
    return issues


def policy_from_document(doc: SourceDocument, parameters: Declarations = None) -> QueuePolicy:
    """Build the policy of a parsed document, or raise SpecError with every issue."""
    issues = document_issues(doc, parameters)
    if issues:
        raise SpecError(issues)
    data: Mapping[str, Any] = doc.data
    entries = tuple(
        PolicyEntry(key=key, settings=_settings(raw), location=doc.locate((QUEUES, key), key=True))
        for key, raw in (data.get(QUEUES) or {}).items()
    )
    defaults = QueueConfig.of(**{n: p.default for n, p in (parameters or {}).items()})
    return QueuePolicy(
        defaults=_settings(data.get(DEFAULTS)),
        entries=entries,
        source=doc.file,
        parameter_defaults=defaults.parameters,
        invariant_scopes=tuple(
            InvariantScope(name, tuple(queues), doc.locate((INVARIANTS, name), key=True))
            for name, queues in (data.get(INVARIANTS) or {}).items()
        ),
    )


def _plain(value: Any) -> Any:
    """A copy with string mapping keys, as the YAML reader produces, so checks see one shape."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _settings(raw: Mapping[str, Any] | None) -> Settings:
    """Settings from a schema-valid block (``null`` or an omitted block sets nothing).

    JSON Schema counts ``5.0`` as an integer; ``int()`` stores it as the ``5`` it means.
    """
    if not raw:
        return Settings()
    values: dict[str, Any] = {
        name: int(value) if isinstance(value, float) and value.is_integer() else value
        for name, value in raw.items()
    }
    runtime = {k: values.pop(k) for k in RUNTIME_KEYS if k in values}
    return Settings(**runtime, parameters=QueueConfig.of(**values).parameters)

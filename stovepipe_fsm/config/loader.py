"""Loading ``config/queues.yaml`` into a :class:`QueuePolicy`, reporting every issue at once.

The order is fixed: parse (syntax and duplicate keys stop here, there is nothing
sound to check further), then JSON Schema and the key checks side by side, and only a
document with no issue is turned into a policy. Building the value from validated data
means the construction code never has to defend against bad input.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..spec.errors import SpecError, SpecIssue
from ..spec.schema import schema_issues
from ..spec.yaml_source import SourceDocument, read_yaml
from .checks import QUEUES, key_issues
from .policy import PolicyEntry, QueuePolicy, Settings

DEFAULT_CONFIG_PATH = Path("config") / "queues.yaml"
DEFAULTS = "defaults"
SCHEMA_NAME = "queues"
MEMORY_SOURCE = "<memory>"


def load_queue_config(path: str | Path, *, display_name: str | None = None) -> QueuePolicy:
    """Read, validate and build the policy in ``path``; raise SpecError with all issues."""
    return policy_from_document(read_yaml(path, display_name=display_name))


def check_queue_config(path: str | Path, *, display_name: str | None = None) -> list[SpecIssue]:
    """Every issue in ``path`` (empty when the file is good), for ``validate``."""
    try:
        load_queue_config(path, display_name=display_name)
    except SpecError as error:
        return list(error.issues)
    return []


def policy_from_mapping(data: Mapping[str, Any], *, source: str = MEMORY_SOURCE) -> QueuePolicy:
    """Validate in-memory content shaped like the YAML file and build the policy.

    Used where there is no file (tests, simulation). Without a file there are no line
    numbers, so issues point at ``<source>:1:1`` and name the offending path instead.
    """
    return policy_from_document(SourceDocument(source, _plain(data), {}, {}))


def document_issues(doc: SourceDocument) -> list[SpecIssue]:
    """Schema violations plus key problems of a parsed document."""
    return [*schema_issues(doc, SCHEMA_NAME), *key_issues(doc)]


def policy_from_document(doc: SourceDocument) -> QueuePolicy:
    """Build the policy of a parsed document, or raise SpecError with every issue."""
    issues = document_issues(doc)
    if issues:
        raise SpecError(issues)
    data: Mapping[str, Any] = doc.data
    entries = tuple(
        PolicyEntry(
            key=key,
            settings=_settings(raw),
            location=doc.locate((QUEUES, key), key=True),
        )
        for key, raw in (data.get(QUEUES) or {}).items()
    )
    return QueuePolicy(defaults=_settings(data.get(DEFAULTS)), entries=entries, source=doc.file)


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
        name: int(value) if isinstance(value, float) else value for name, value in raw.items()
    }
    return Settings(**values)

"""JSON encoding of the values the JetStream adapter stores and publishes.

Every stored value carries ``schema`` (a version of this layout) and ``kind`` so that a
value read from the wrong bucket, written by an incompatible release, or damaged by hand
is reported precisely instead of being half-understood. Decoding is strict: a missing,
extra or mistyped field raises :class:`~stovepipe_fsm.domain.errors.NonRetryable` naming
the field, because redelivering a delivery cannot repair a stored value. (Ignoring unknown
fields would be worse: the next whole-snapshot write would silently drop them.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...domain.entities import Queue, Request
from ...domain.errors import NonRetryable

SCHEMA_VERSION = 1
REQUEST_KIND = "request"
QUEUE_KIND = "queue"
URI_ENTRY_KIND = "uri"
WORK_KIND = "work"

_REQUEST_STR_FIELDS = ("id", "queue", "uri", "state", "build_strategy", "base_uri", "superseded_by")
_QUEUE_STR_FIELDS = ("name", "last_green_uri", "last_green_request_id", "latest_request_id")


@dataclass(frozen=True)
class WorkMessage:
    """Payload of a process or build message: which request of which queue to work on.

    Only ids travel: producer and consumer share the store, and the consumer always
    reloads current state rather than trusting a snapshot off the wire.
    """

    queue: str
    request_id: str


@dataclass(frozen=True)
class UriEntry:
    """Value of a (queue, uri) dedup entry; the uri is kept so a hashed key stays checkable."""

    queue: str
    uri: str
    request_id: str


def _dump(kind: str, fields: dict[str, Any]) -> bytes:
    body = {"schema": SCHEMA_VERSION, "kind": kind, **fields}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _load(
    data: bytes | None,
    kind: str,
    expected: frozenset[str],
    optional: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Parse and check the envelope and the exact field set of one value.

    ``optional`` fields may be missing: a field added to a layout reads as absent from
    values written before it existed.
    """
    if data is None:
        raise NonRetryable(f"{kind} value is empty")
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NonRetryable(f"{kind} value is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise NonRetryable(f"{kind} value must be a JSON object, got {type(body).__name__}")
    schema = body.get("schema")
    if schema != SCHEMA_VERSION:
        raise NonRetryable(
            f"{kind} value has schema {schema!r}; this release reads schema {SCHEMA_VERSION}"
        )
    if body.get("kind") != kind:
        raise NonRetryable(f"expected a {kind} value, got kind {body.get('kind')!r}")
    fields = {k: v for k, v in body.items() if k not in ("schema", "kind")}
    missing = sorted(expected - fields.keys())
    if missing:
        raise NonRetryable(f"{kind} value is missing field(s) {', '.join(missing)}")
    unknown = sorted(fields.keys() - expected - optional)
    if unknown:
        raise NonRetryable(f"{kind} value has unknown field(s) {', '.join(unknown)}")
    return fields


def _str(kind: str, fields: dict[str, Any], name: str) -> str:
    value = fields[name]
    if not isinstance(value, str):
        raise NonRetryable(f"{kind} field {name!r} must be a string, got {value!r}")
    return value


def _version(kind: str, fields: dict[str, Any]) -> int:
    value = fields["version"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise NonRetryable(f"{kind} field 'version' must be an integer >= 1, got {value!r}")
    return value


def encode_request(request: Request) -> bytes:
    fields: dict[str, Any] = {name: getattr(request, name) for name in _REQUEST_STR_FIELDS}
    fields["version"] = request.version
    return _dump(REQUEST_KIND, fields)


def decode_request(data: bytes | None) -> Request:
    fields = _load(data, REQUEST_KIND, frozenset((*_REQUEST_STR_FIELDS, "version")))
    strings = {name: _str(REQUEST_KIND, fields, name) for name in _REQUEST_STR_FIELDS}
    return Request(**strings, version=_version(REQUEST_KIND, fields))


def encode_queue(queue: Queue) -> bytes:
    fields: dict[str, Any] = {name: getattr(queue, name) for name in _QUEUE_STR_FIELDS}
    fields["slot_holders"] = list(queue.slot_holders)
    # Written only when set, so a row without leases or a rewrite holder stays as it was.
    if queue.leases:
        fields["leases"] = {holder: expires for holder, expires in queue.leases}
    if queue.serial_holder:
        fields["serial_holder"] = queue.serial_holder
    fields["version"] = queue.version
    return _dump(QUEUE_KIND, fields)


def decode_queue(data: bytes | None) -> Queue:
    """A queue row; ``leases`` and ``serial_holder`` may be missing (none of either)."""
    fields = _load(
        data,
        QUEUE_KIND,
        frozenset((*_QUEUE_STR_FIELDS, "slot_holders", "version")),
        optional=frozenset(("leases", "serial_holder")),
    )
    strings = {name: _str(QUEUE_KIND, fields, name) for name in _QUEUE_STR_FIELDS}
    holders = fields["slot_holders"]
    if not isinstance(holders, list) or not all(isinstance(h, str) for h in holders):
        raise NonRetryable(f"queue field 'slot_holders' must be a list of strings, got {holders!r}")
    leases = fields.get("leases", {})
    if not isinstance(leases, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in leases.values()
    ):
        raise NonRetryable(
            f"queue field 'leases' must map holder ids to integer expiry times, got {leases!r}"
        )
    serial = _str(QUEUE_KIND, fields, "serial_holder") if "serial_holder" in fields else ""
    return Queue(
        **strings,
        slot_holders=tuple(holders),
        leases=tuple(sorted(leases.items())),
        serial_holder=serial,
        version=_version(QUEUE_KIND, fields),
    )


def encode_uri_entry(entry: UriEntry) -> bytes:
    return _dump(
        URI_ENTRY_KIND, {"queue": entry.queue, "uri": entry.uri, "request_id": entry.request_id}
    )


def decode_uri_entry(data: bytes | None) -> UriEntry:
    names = ("queue", "uri", "request_id")
    fields = _load(data, URI_ENTRY_KIND, frozenset(names))
    return UriEntry(*(_str(URI_ENTRY_KIND, fields, name) for name in names))


def encode_work(message: WorkMessage) -> bytes:
    return _dump(WORK_KIND, {"queue": message.queue, "request_id": message.request_id})


def decode_work(data: bytes | None) -> WorkMessage:
    fields = _load(data, WORK_KIND, frozenset(("queue", "request_id")))
    return WorkMessage(_str(WORK_KIND, fields, "queue"), _str(WORK_KIND, fields, "request_id"))

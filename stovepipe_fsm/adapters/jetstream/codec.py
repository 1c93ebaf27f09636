"""JSON encoding of the values the JetStream adapter stores and publishes.

Every stored value carries ``schema`` (a version of this layout) and ``kind`` so that a
value read from the wrong bucket, written by an incompatible release, or damaged by hand
is reported precisely instead of being half-understood.

Request rows have two layouts. Layout 2 adds the times (``ingested_at_ms``,
``admitted_at_ms``, ``ended_at_ms``); both are read (a layout-1 row has no times: 0), and
layout 2 is written unless a deployment asks for layout 1 while replicas of a release
that reads only layout 1 still run (docs/service.md, "Upgrades and the stored layout").
Layout 2 has two optional fields, ``retry_of`` (the request an operator's ``retry`` made
this one again for) and ``probe_of`` (the red head a probe build was started for),
written only when set, so rows written before it read as they did; layout 1 cannot carry
them (a retry written in layout 1 loses its link; a probe is never written in layout 1).

Decoding is strict: a missing, extra or mistyped field raises
:class:`~stovepipe_fsm.domain.errors.NonRetryable` naming the field, because redelivering
a delivery cannot repair a stored value. (Ignoring unknown fields would be worse: the next
whole-snapshot write would silently drop them.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ...domain.bounded_text import clip
from ...domain.culprit_search import MAX_BLAMELIST, CulpritSearch, Probe, Tally
from ...domain.entities import MAX_RECENT_GREENS, Green, Queue, Request
from ...domain.errors import NonRetryable
from ...domain.ids import parse_request_id
from ...domain.queue_names import MAX_QUEUE_NAME_LENGTH

SCHEMA_VERSION = 1
#: The request layouts this release reads, and the one it writes by default.
REQUEST_LAYOUTS = (1, 2)
REQUEST_LAYOUT = 2
REQUEST_KIND = "request"
QUEUE_KIND = "queue"
URI_ENTRY_KIND = "uri"
SEARCH_KIND = "search"
WORK_KIND = "work"

_REQUEST_STR_FIELDS = ("id", "queue", "uri", "state", "build_strategy", "base_uri", "superseded_by")
_REQUEST_TIME_FIELDS = ("ingested_at_ms", "admitted_at_ms", "ended_at_ms")
#: Fields of layout 2 a row may leave out (written only when set).
_REQUEST_OPTIONAL = ("retry_of", "probe_of")
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


def _dump(kind: str, fields: dict[str, Any], schema: int = SCHEMA_VERSION) -> bytes:
    body = {"schema": schema, "kind": kind, **fields}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _load(
    data: bytes | None,
    kind: str,
    expected: frozenset[str],
    optional: frozenset[str] = frozenset(),
    *,
    layouts: dict[int, frozenset[str]] | None = None,
) -> dict[str, Any]:
    """Parse and check the envelope and the exact field set of one value.

    ``optional`` fields may be missing: a field added to a layout reads as absent from
    values written before it existed. ``layouts`` (schema -> field set) replaces
    ``expected`` for a kind with several layouts; the schema read is returned under the
    key ``schema``.
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
    readable = layouts or {SCHEMA_VERSION: expected}
    if isinstance(schema, bool) or schema not in readable:
        versions = " or ".join(str(v) for v in sorted(readable))
        raise NonRetryable(f"{kind} value has schema {schema!r}; this release reads {versions}")
    expected = readable[schema]
    if body.get("kind") != kind:
        raise NonRetryable(f"expected a {kind} value, got kind {body.get('kind')!r}")
    fields = body  # parsed just now: nobody else holds it
    del fields["schema"], fields["kind"]
    keys = fields.keys()
    if keys != expected:  # the usual value has exactly the expected fields
        missing = sorted(expected - keys)
        if missing:
            raise NonRetryable(f"{kind} value is missing field(s) {', '.join(missing)}")
        unknown = sorted(keys - expected - optional)
        if unknown:
            raise NonRetryable(f"{kind} value has unknown field(s) {', '.join(unknown)}")
    if layouts:
        fields["schema"] = schema
    return fields


def _str(kind: str, fields: dict[str, Any], name: str) -> str:
    value = fields[name]
    if not isinstance(value, str):
        raise NonRetryable(f"{kind} field {name!r} must be a string, got {value!r}")
    return value


def _int(kind: str, fields: dict[str, Any], name: str, least: int = 0) -> int:
    """The integer field ``name`` (0 when missing), at least ``least``."""
    value = fields.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise NonRetryable(f"{kind} field {name!r} must be an integer >= {least}, got {value!r}")
    return value


_REQUEST_FIELDS = {
    1: frozenset((*_REQUEST_STR_FIELDS, "version")),
    2: frozenset((*_REQUEST_STR_FIELDS, "version", *_REQUEST_TIME_FIELDS)),
}


def encode_request(request: Request, layout: int = REQUEST_LAYOUT) -> bytes:
    """``request`` in ``layout`` (layout 1 has no times: they are dropped)."""
    if layout not in REQUEST_LAYOUTS:
        raise ValueError(f"request layout must be one of {REQUEST_LAYOUTS}, got {layout}")
    fields: dict[str, Any] = {name: getattr(request, name) for name in _REQUEST_FIELDS[layout]}
    for name in _REQUEST_OPTIONAL:
        if getattr(request, name):
            if layout < 2:
                if name == "probe_of":
                    raise ValueError("a probe request cannot be written in request layout 1")
                continue
            fields[name] = getattr(request, name)
    return _dump(REQUEST_KIND, fields, schema=layout)


def decode_request(data: bytes | None) -> Request:
    fields = _load(
        data, REQUEST_KIND, frozenset(), frozenset(_REQUEST_OPTIONAL), layouts=_REQUEST_FIELDS
    )
    optional = [name for name in _REQUEST_OPTIONAL if name in fields]
    if fields["schema"] < 2 and optional:
        raise NonRetryable(f"request value has unknown field(s) {', '.join(optional)}")
    values: dict[str, Any] = {
        name: _str(REQUEST_KIND, fields, name) for name in (*_REQUEST_STR_FIELDS, *optional)
    }
    values["version"] = _int(REQUEST_KIND, fields, "version", 1)
    for name in _REQUEST_TIME_FIELDS:
        values[name] = _int(REQUEST_KIND, fields, name)
    return Request(**values)


def encode_queue(queue: Queue) -> bytes:
    fields: dict[str, Any] = {name: getattr(queue, name) for name in _QUEUE_STR_FIELDS}
    fields["slot_holders"] = list(queue.slot_holders)
    # Written only when set, so a row without leases or a rewrite holder stays as it was.
    if queue.leases:
        fields["leases"] = {holder: expires for holder, expires in queue.leases}
    if queue.serial_holder:
        fields["serial_holder"] = queue.serial_holder
    if queue.partition:
        fields["partition"] = queue.partition
    if queue.recent_greens:
        fields["recent_greens"] = [
            {"uri": g.uri, "request_id": g.request_id, "at_ms": g.at_ms}
            for g in queue.recent_greens
        ]
    fields["version"] = queue.version
    return _dump(QUEUE_KIND, fields)


def decode_queue(data: bytes | None) -> Queue:
    """A queue row; ``leases``, ``serial_holder``, ``partition`` and ``recent_greens``
    may be missing (none of either, partition 0, no list: a row written before the list
    existed reads its last green as the only recent green)."""
    fields = _load(
        data,
        QUEUE_KIND,
        frozenset((*_QUEUE_STR_FIELDS, "slot_holders", "version")),
        optional=frozenset(("leases", "serial_holder", "partition", "recent_greens")),
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
    partition = _int(QUEUE_KIND, fields, "partition")
    greens = _objects(
        QUEUE_KIND,
        fields.get("recent_greens", []),
        "recent_greens",
        "green",
        MAX_RECENT_GREENS,
        ("uri", "request_id", "at_ms"),
        Green,
    )
    return Queue(
        **strings,
        slot_holders=tuple(holders),
        leases=tuple(sorted(leases.items())),
        serial_holder=serial,
        partition=partition,
        recent_greens=greens,
        version=_int(QUEUE_KIND, fields, "version", 1),
    )


T = TypeVar("T")


def _objects(
    kind: str,
    value: Any,
    field: str,
    noun: str,
    most: int,
    keys: tuple[str, str, str],
    make: Callable[[str, str, int], T],
) -> tuple[T, ...]:
    """``make(a, b, n)`` of each item of ``value``, a list of at most ``most`` objects
    (``noun``) with exactly ``keys``: two strings and an integer >= 0; else
    ``NonRetryable`` saying so of ``kind``'s ``field``."""
    what = f"{kind} field {field!r}"
    if not isinstance(value, list) or len(value) > most:
        raise NonRetryable(
            f"{what} must be a list of at most {most} {noun}s, got {clip(repr(value), 200)}"
        )
    for item in value:
        if not isinstance(item, dict) or item.keys() != set(keys):
            named = f"{', '.join(keys[:-1])} and {keys[-1]}"
            raise NonRetryable(
                f"{what}: each {noun} must be an object with {named}, got {clip(repr(item), 200)}"
            )
    first, second, number = keys
    return tuple(
        make(_str(kind, item, first), _str(kind, item, second), _int(kind, item, number))
        for item in value
    )


_SEARCH_STR_FIELDS = ("queue", "state", "red_request_id", "base_uri", "culprit", "reason")
_SEARCH_INT_FIELDS = ("probes_started", "started_at_ms", "ended_at_ms")
#: The most probes a search row may list in flight (``probe_slots`` at most, carried over
#: from searches before it).
MAX_PROBES_LISTED = 1024


def encode_search(search: CulpritSearch) -> bytes:
    fields: dict[str, Any] = {name: getattr(search, name) for name in _SEARCH_STR_FIELDS}
    fields.update({name: getattr(search, name) for name in _SEARCH_INT_FIELDS})
    fields["blamelist"] = list(search.blamelist)
    fields["tallies"] = [[t.greens, t.reds] for t in search.tallies]
    fields["probes"] = [
        {"request_id": p.request_id, "commit": p.commit, "started_at_ms": p.started_at_ms}
        for p in search.probes
    ]
    fields["version"] = search.version
    return _dump(SEARCH_KIND, fields)


def decode_search(data: bytes | None) -> CulpritSearch:
    """A queue's search row: a blamelist of at most ``MAX_BLAMELIST`` commits, one tally
    of two counts per commit, at most ``MAX_PROBES_LISTED`` probes."""
    fields = _load(
        data,
        SEARCH_KIND,
        frozenset(
            (*_SEARCH_STR_FIELDS, *_SEARCH_INT_FIELDS, "blamelist", "tallies", "probes", "version")
        ),
    )
    strings: dict[str, Any] = {name: _str(SEARCH_KIND, fields, name) for name in _SEARCH_STR_FIELDS}
    counts: dict[str, Any] = {name: _int(SEARCH_KIND, fields, name) for name in _SEARCH_INT_FIELDS}
    blamelist = fields["blamelist"]
    if (
        not isinstance(blamelist, list)
        or len(blamelist) > MAX_BLAMELIST
        or not all(isinstance(c, str) for c in blamelist)
    ):
        raise NonRetryable(
            f"search field 'blamelist' must be a list of at most {MAX_BLAMELIST} strings, "
            f"got {clip(repr(blamelist), 200)}"
        )
    tallies = fields["tallies"]
    if (
        not isinstance(tallies, list)
        or len(tallies) != len(blamelist)
        or not all(
            isinstance(t, list)
            and len(t) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in t)
            for t in tallies
        )
    ):
        raise NonRetryable(
            "search field 'tallies' must list one [greens, reds] pair of integers >= 0 per "
            f"blamelist commit, got {clip(repr(tallies), 200)}"
        )
    probes = _objects(
        SEARCH_KIND,
        fields["probes"],
        "probes",
        "probe",
        MAX_PROBES_LISTED,
        ("request_id", "commit", "started_at_ms"),
        Probe,
    )
    return CulpritSearch(
        **strings,
        **counts,
        blamelist=tuple(blamelist),
        tallies=tuple(Tally(g, r) for g, r in tallies),
        probes=probes,
        version=_int(SEARCH_KIND, fields, "version", 1),
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


#: The longest id ingest can mint: ``request/`` + the longest queue name + ``/`` + a
#: 20-digit counter (more than a 64-bit counter needs).
MAX_REQUEST_ID_CHARS = len("request/") + MAX_QUEUE_NAME_LENGTH + 1 + 20


def check_work(message: WorkMessage, subject_queue: str) -> WorkMessage:
    """``message`` when it is one ingest could have published on ``subject_queue``'s
    subject; else :class:`NonRetryable` saying what is wrong (the text is bounded)."""
    rid = message.request_id
    if len(rid) > MAX_REQUEST_ID_CHARS:
        raise NonRetryable(
            f"work request id is {len(rid)} characters; at most {MAX_REQUEST_ID_CHARS} allowed"
        )
    if message.queue != subject_queue:
        raise NonRetryable(
            f"work payload names queue {clip(message.queue, 200)!r} but arrived on the "
            f"subject of queue {subject_queue!r}"
        )
    try:
        parsed = parse_request_id(rid)
    except ValueError as exc:
        raise NonRetryable(f"work request id is malformed: {clip(str(exc), 300)}") from None
    if parsed.queue != subject_queue:
        raise NonRetryable(
            f"work request id {rid!r} belongs to queue {parsed.queue!r}, not {subject_queue!r}"
        )
    return message

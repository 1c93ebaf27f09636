"""Hook events announced on the hook topic.

The payload names the queue and the request only: a hook resolves commit, strategy and
baseline from the request store instead of trusting a snapshot off the wire. An event id
is derived from the transition it announces (request id and the version that transition
wrote), never from the clock, so every re-announce of one transition dedupes downstream.

Validations: ``validation.repository.started`` when process admits a head, and
``validation.repository.<outcome>`` (``succeeded``, ``failed``, ``cancelled`` in the
shipped machine) when its validation ends, so a consumer pairs each start with one end. A
build a newer head preempted (a policy with the ``preempt`` role) ends as
``validation.repository.<its state>`` (``preempted``), by the same id rule. A probe
build of a culprit search is not a validation of trunk and announces neither; the search
announces its end as ``validation.repository.culprit_found`` or ``culprit_unresolved``.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from typing import Any

VALIDATION_EVENT_PREFIX = "validation.repository."
VALIDATION_STARTED = VALIDATION_EVENT_PREFIX + "started"
VALIDATION_LEASE_EXPIRED = VALIDATION_EVENT_PREFIX + "lease_expired"
#: Names the family of end events in their ids (their type names the outcome).
VALIDATION_ENDED = VALIDATION_EVENT_PREFIX + "ended"
SOURCE = "stovepipe"
ENVELOPE_VERSION = 1
_NAMESPACE = uuid.UUID("6f1c7d3e-5b0a-4d8e-9a51-2f3c4b5d6e7f")
_NAMESPACE_BYTES = _NAMESPACE.bytes


def name_based_id(name: str) -> str:
    """``str(uuid.uuid5(namespace, name))`` for the events' namespace, made directly.

    Every admission and every end announces an event, so a long replay mints hundreds of
    thousands of ids; a ``UUID`` object built for each only to be printed is work the id
    does not need. Same RFC 4122 version-5 id, byte for byte (tested against ``uuid5``).
    """
    sha1 = hashlib.sha1(_NAMESPACE_BYTES + name.encode(), usedforsecurity=False)
    digest = bytearray(sha1.digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    text = digest.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


@dataclass(frozen=True)
class HookEvent:
    id: str
    type: str
    timestamp_ms: int
    payload: dict[str, str] = field(default_factory=dict)
    source: str = SOURCE
    version: int = ENVELOPE_VERSION

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "source": self.source,
            "type": self.type,
            "timestamp_ms": self.timestamp_ms,
            "version": self.version,
            "payload": dict(self.payload),
        }

def _event(
    event_id: str, kind: str, now_ms: int, queue: str, request_id: str, **more: str
) -> HookEvent:
    """An event of ``kind`` about ``request_id`` of ``queue`` (``more``: the payload's rest)."""
    return HookEvent(event_id, kind, now_ms, {"queue": queue, "request_id": request_id, **more})


def admission_event_id(request_id: str, admitted_version: int) -> str:
    """Stable id of the start event of one admission."""
    return name_based_id(f"{VALIDATION_STARTED}|{request_id}|{admitted_version}")


def started_event(queue: str, request_id: str, admitted_version: int, now_ms: int) -> HookEvent:
    event_id = admission_event_id(request_id, admitted_version)
    return _event(event_id, VALIDATION_STARTED, now_ms, queue, request_id)


def ended_event_type(outcome: str) -> str:
    """The hook event type announcing that a validation ended with ``outcome``."""
    return VALIDATION_EVENT_PREFIX + outcome


def ended_event(
    queue: str, request_id: str, outcome: str, ended_version: int, now_ms: int
) -> HookEvent:
    """The end event of one validation: its id is that of the terminal write, so a
    redelivered outcome (which finds the request already ended) re-announces the same id.
    The outcome's name is not part of the id: renaming an outcome renames the event type
    and nothing else."""
    event_id = name_based_id(f"{VALIDATION_ENDED}|{request_id}|{ended_version}")
    return _event(event_id, ended_event_type(outcome), now_ms, queue, request_id)


def lease_expired_event_id(request_id: str, expires_at_ms: int) -> str:
    """Stable id of the expiry of one lease: a reclaim repeated after a crash dedupes."""
    return name_based_id(f"{VALIDATION_LEASE_EXPIRED}|{request_id}|{expires_at_ms}")


def lease_expired_event(queue: str, request_id: str, expires_at_ms: int, now_ms: int) -> HookEvent:
    """The slot of ``request_id`` was reclaimed because its lease ran out."""
    event_id = lease_expired_event_id(request_id, expires_at_ms)
    expired = str(expires_at_ms)
    return _event(
        event_id, VALIDATION_LEASE_EXPIRED, now_ms, queue, request_id, expired_at_ms=expired
    )


CULPRIT_FOUND = VALIDATION_EVENT_PREFIX + "culprit_found"
CULPRIT_UNRESOLVED = VALIDATION_EVENT_PREFIX + "culprit_unresolved"


def culprit_event(
    found: bool,
    queue: str,
    red_request_id: str,
    search_version: int,
    now_ms: int,
    evidence: dict[str, str],
) -> HookEvent:
    """The end of the culprit search of ``red_request_id``: ``culprit_found`` (the
    evidence names the culprit and its green parent) or ``culprit_unresolved`` (it says
    why). The id is that of the search row's write that ended it, so announcing again
    publishes one event."""
    kind = CULPRIT_FOUND if found else CULPRIT_UNRESOLVED
    event_id = name_based_id(f"{kind}|{queue}|{red_request_id}|{search_version}")
    return _event(event_id, kind, now_ms, queue, red_request_id, **evidence)

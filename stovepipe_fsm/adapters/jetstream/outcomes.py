"""Build outcomes as messages on the outcome stream: the format and its publisher.

A build farm (or ``stovepipe-fsm complete``) reports that a build ended by publishing one
message; the service records it with the policy it runs, so whoever reports an outcome
needs no machine or config file, and an outcome reported while the service is down is
recorded when it returns (the stream keeps it).

Subject ``<prefix>.outcome.<q>`` (``<q>`` the queue's subject token), payload::

    {"schema": 1, "kind": "outcome", "queue": "<queue>",
     "request_id": "<id from the build message>", "outcome": "<declared outcome>"}

and header ``Nats-Msg-Id: outcome|<request id>|<outcome>`` (:func:`outcome_msg_id`), so a
retried publish of the same outcome is stored once. A refused outcome is removed from the
stream by the service; reporting it again then publishes under ``...|after-<sequence of the
refused one>``, so the broker's duplicate window never swallows a report whose cause was
fixed (:func:`publish_outcome`). A payload over
:data:`MAX_OUTCOME_BYTES`, a request id of another queue than the subject's, or an outcome
that is not a name is refused at decode and dead-lettered; so is a second, different
outcome for a request that already ended.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import nats.js.errors
from nats.js import JetStreamContext

from ...domain.errors import NonRetryable
from ...domain.ids import parse_request_id
from .codec import _dump, _load, _str
from .errors import translated
from .publisher import MSG_ID_HEADER
from .topology import Topology

OUTCOME_KIND = "outcome"
#: Far above any honest message (three short strings); refused before parsing.
MAX_OUTCOME_BYTES = 4096
_OUTCOME_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
#: Reports of one outcome refused inside one duplicate window that :func:`publish_outcome`
#: steps past; far above any honest sequence of fixes, a bound on a hostile one.
MAX_REPORTS_AFTER_REFUSALS = 64


@dataclass(frozen=True)
class OutcomeMessage:
    """One build outcome: which request of which queue ended, and how."""

    queue: str
    request_id: str
    outcome: str


def outcome_msg_id(request_id: str, outcome: str, after: int = 0) -> str:
    """The dedup id of an outcome: one per (request, outcome), whoever publishes it; with
    ``after``, the id of a report sent again once the report stored at that sequence of
    the outcome stream was refused."""
    base = f"outcome|{request_id}|{outcome}"
    return f"{base}|after-{after}" if after else base


def encode_outcome(message: OutcomeMessage) -> bytes:
    return _dump(
        OUTCOME_KIND,
        {"queue": message.queue, "request_id": message.request_id, "outcome": message.outcome},
    )


def decode_outcome(data: bytes | None, subject_queue: str) -> OutcomeMessage:
    """The outcome in ``data``, checked against the queue its subject names.

    ``NonRetryable`` (dead-lettered by the consumer) for anything a redelivery cannot fix.
    """
    if data is not None and len(data) > MAX_OUTCOME_BYTES:
        raise NonRetryable(f"outcome message is {len(data)} bytes; at most {MAX_OUTCOME_BYTES}")
    fields = _load(data, OUTCOME_KIND, frozenset(("queue", "request_id", "outcome")))
    message = OutcomeMessage(
        *(_str(OUTCOME_KIND, fields, name) for name in ("queue", "request_id", "outcome"))
    )
    if message.queue != subject_queue:
        raise NonRetryable(
            f"outcome names queue {message.queue!r} but was published for {subject_queue!r}"
        )
    try:
        owner = parse_request_id(message.request_id).queue
    except ValueError as exc:
        raise NonRetryable(f"outcome names no request: {exc}") from None
    if owner != subject_queue:
        raise NonRetryable(
            f"outcome for request {message.request_id!r} of queue {owner!r} was published "
            f"for queue {subject_queue!r}"
        )
    if not _OUTCOME_NAME_RE.match(message.outcome):
        raise NonRetryable(f"outcome {message.outcome[:64]!r} is not an outcome name")
    return message


async def publish_outcome(
    js: JetStreamContext, topology: Topology, message: OutcomeMessage, *, timeout: float = 5.0
) -> bool:
    """Store ``message`` on the outcome stream; ``True`` when the stream already had it.

    The broker answers a duplicate with the sequence of the message it kept. When the
    service refused that message it removed it from the stream: the report is then sent
    again under an id naming that sequence, so it is decided afresh (recorded, or refused
    again with the reason of now) instead of dropped by the duplicate window. A duplicate
    whose message is still stored is pending or recorded: ``True``.
    """
    what = f"publish outcome {message.outcome} of {message.request_id}"
    after = 0
    for _ in range(MAX_REPORTS_AFTER_REFUSALS):
        with translated(what):
            ack = await js.publish(
                topology.outcome_subject(message.queue),
                encode_outcome(message),
                timeout=timeout,
                stream=topology.outcome_stream,
                headers={MSG_ID_HEADER: outcome_msg_id(message.request_id, message.outcome, after)},
            )
        if not ack.duplicate or await _stored(js, topology.outcome_stream, ack.seq, what):
            return bool(ack.duplicate)
        after = ack.seq
    raise NonRetryable(
        f"outcome {message.outcome} of {message.request_id!r} was refused "
        f"{MAX_REPORTS_AFTER_REFUSALS} times within the duplicate window; see dlq list"
    )


async def _stored(js: JetStreamContext, stream: str, seq: int, what: str) -> bool:
    """Whether the message at ``seq`` of ``stream`` is still there (a refused outcome is
    removed as it is refused)."""
    with translated(what):
        try:
            await js.get_msg(stream, seq)
        except nats.js.errors.NotFoundError:
            return False
    return True

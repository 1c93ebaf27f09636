"""``DecisionTrail`` on a JetStream stream: one subject per request and kind.

Each request's records live under ``<prefix>.trail.<q>.<n>.<kind>`` (a hold: with a
digest of its reason as a last token), so a request's history is a handful of subjects
and every one of them holds exactly one record:

- a decision is published with ``Nats-Msg-Id`` = its key: a repeat inside the duplicate
  window is dropped, and a later one lands on the same subject, where only the last
  message is read (:meth:`JetStreamTrail.history`), so nothing is ever doubled;
- a hold reads the record of its reason, adds one to its count, and publishes the sum
  with ``Nats-Rollup: sub``, which removes the earlier message: an hour of holds is one
  record with a count and its first and last time.

An operator verb (kind ``operator``) has its verb in the tag, so each verb about a request
has its own subject; a verb about queues (no request) lands on
``<prefix>.trail._ops.<digest of its key>`` and is read back by
:meth:`JetStreamTrail.operator_records`.

Retention (``Topology.trail_max_age_s``, ``trail_max_bytes``) bounds the stream.
"""

from __future__ import annotations

import json

import nats.js.errors
from nats.js import JetStreamContext

from ...domain.errors import NonRetryable
from ...domain.trail import HELD, OPERATOR, TrailRecord
from .errors import translated
from .publisher import MSG_ID_HEADER
from .topology import Topology

ROLLUP_HEADER = "Nats-Rollup"


class JetStreamTrail:
    def __init__(self, js: JetStreamContext, topology: Topology, *, timeout: float = 5.0) -> None:
        self._js = js
        self._topology = topology
        self._timeout = timeout

    async def append(self, record: TrailRecord) -> None:
        topology = self._topology
        if record.kind == HELD:
            subject = topology.trail_subject(record.request_id, record.kind, record.tag)
            previous = await self._last(subject)
            if previous is not None:
                record = previous.again(record)
            headers = {ROLLUP_HEADER: "sub"}
        elif not record.request_id:
            subject = topology.operator_trail_subject(record.key)
            headers = {MSG_ID_HEADER: record.key}
        elif record.kind == OPERATOR:
            subject = topology.trail_subject(record.request_id, record.kind, record.tag)
            headers = {MSG_ID_HEADER: record.key}
        else:
            subject = topology.trail_subject(record.request_id, record.kind)
            headers = {MSG_ID_HEADER: record.key}
        payload = json.dumps(record.as_json(), sort_keys=True, separators=(",", ":")).encode()
        with translated(f"trail {record.kind} of {record.request_id or record.queue}"):
            await self._js.publish(
                subject,
                payload,
                timeout=self._timeout,
                stream=topology.trail_stream,
                headers=headers,
            )

    async def history(self, request_id: str) -> list[TrailRecord]:
        """The request's records, oldest decision first."""
        topology = self._topology
        with translated(f"read the trail of {request_id}"):
            info = await self._js.stream_info(
                topology.trail_stream, subjects_filter=topology.trail_filter(request_id)
            )
        subjects = sorted((info.state.subjects or {}).keys())
        records = [r for r in [await self._last(s) for s in subjects] if r is not None]
        return sorted(records, key=lambda r: (r.first_at_ms, r.at_ms))

    async def operator_records(self) -> list[TrailRecord]:
        """Every operator verb about queues (pause, resume, dlq prune), oldest first."""
        topology = self._topology
        with translated("read the operator trail"):
            info = await self._js.stream_info(
                topology.trail_stream, subjects_filter=topology.operator_trail_filter()
            )
        subjects = sorted((info.state.subjects or {}).keys())
        records = [r for r in [await self._last(s) for s in subjects] if r is not None]
        return sorted(records, key=lambda r: (r.first_at_ms, r.at_ms))

    async def _last(self, subject: str) -> TrailRecord | None:
        with translated(f"read trail {subject}"):
            try:
                message = await self._js.get_last_msg(self._topology.trail_stream, subject)
            except nats.js.errors.NotFoundError:
                return None
        try:
            return TrailRecord.from_json(json.loads(message.data or b"{}"))
        except (ValueError, KeyError, TypeError) as exc:
            raise NonRetryable(f"trail record on {subject} is damaged: {exc}") from None

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

Retention (``Topology.trail_max_age_s``, ``trail_max_bytes``) bounds the stream.
:meth:`JetStreamTrail.latest` reads the newest records across all requests (the status
page), walking back from the stream's last sequence a bounded number of reads.
"""

from __future__ import annotations

import json

import nats.js.errors
from nats.js import JetStreamContext

from ...domain.errors import NonRetryable
from ...domain.trail import HELD, TrailRecord
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
        else:
            subject = topology.trail_subject(record.request_id, record.kind)
            headers = {MSG_ID_HEADER: record.key}
        payload = json.dumps(record.as_json(), sort_keys=True, separators=(",", ":")).encode()
        with translated(f"trail {record.kind} of {record.request_id}"):
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

    async def latest(self, limit: int, *, max_reads: int | None = None) -> list[TrailRecord]:
        """Up to ``limit`` of the newest records, newest first, in at most ``max_reads``
        reads (default ``4 * limit``).

        Read back from the stream's last sequence: a rolled-up hold leaves gaps (its
        earlier messages are gone), which is why reads are bounded separately from
        records, so a stream full of gaps costs a bounded time, never a full scan.
        A damaged message is passed over: one bad record must not hide the others.
        """
        if limit <= 0:
            return []
        budget = max_reads if max_reads is not None else 4 * limit
        stream = self._topology.trail_stream
        with translated(f"read the latest of {stream}"):
            info = await self._js.stream_info(stream)
        first, seq = int(info.state.first_seq or 0), int(info.state.last_seq or 0)
        records: list[TrailRecord] = []
        while seq >= max(first, 1) and len(records) < limit and budget > 0:
            budget -= 1
            with translated(f"read {stream} message {seq}"):
                try:
                    message = await self._js.get_msg(stream, seq)
                except nats.js.errors.NotFoundError:
                    message = None
            seq -= 1
            if message is None:
                continue
            try:
                records.append(TrailRecord.from_json(json.loads(message.data or b"{}")))
            except (ValueError, KeyError, TypeError):
                continue
        return records

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

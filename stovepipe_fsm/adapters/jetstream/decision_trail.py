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

An operator verb (kind ``operator``), a plugin's note and a failed attempt carry what
tells them apart in the tag, so each has its own subject; a verb about queues (no request) lands on
``<prefix>.trail._ops.<digest of its key>`` and is read back by
:meth:`JetStreamTrail.operator_records`.

Retention (``Topology.trail_max_age_s``, ``trail_max_bytes``) bounds the stream.
:meth:`JetStreamTrail.latest` reads the newest records across all requests (the status
page): the records of a window of the newest sequences, read forward, bounded.
"""

from __future__ import annotations

import contextlib
import json

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext, api

from ...domain.errors import NonRetryable
from ...domain.trail_record import ATTEMPT_FAILED, HELD, OPERATOR, PLUGIN, TrailRecord
from .errors import translated
from .publisher import MSG_ID_HEADER
from .topology import Topology

ROLLUP_HEADER = "Nats-Rollup"
#: Kinds whose records are each on a subject of their own (the tag in it): a request
#: has many of them, and each is kept (an operator verb, a plugin's note, a failed
#: attempt), where a later record of another kind replaces the earlier one.
OWN_SUBJECT_KINDS = (OPERATOR, PLUGIN, ATTEMPT_FAILED)
#: The windows of newest sequences :meth:`JetStreamTrail.latest` reads, narrowest first,
#: and the most messages it reads in all.
LATEST_WINDOWS = (1_024, 16_384, 131_072)
LATEST_MAX_MESSAGES = 20_000
READ_BATCH = 256
#: An abandoned read consumer is removed by the server after this long.
READ_INACTIVE_S = 30.0


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
        elif record.kind in OWN_SUBJECT_KINDS:
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

    async def latest(
        self,
        limit: int,
        *,
        windows: tuple[int, ...] = LATEST_WINDOWS,
        max_messages: int = LATEST_MAX_MESSAGES,
    ) -> list[TrailRecord]:
        """Up to ``limit`` of the newest records, newest first.

        A rolled-up hold removes its earlier message, so the stream's sequence numbers
        have gaps, many of them where a head is held for long: walking back one
        sequence at a time would mostly read gaps. Instead the records of a window of
        the newest sequences are read forward by a consumer (which skips gaps on the
        server), growing the window (``windows``) until it holds ``limit`` records or
        reaches the first message. At most ``max_messages`` are read in all: when a
        wider window would take more, the records of the narrower one are the answer
        (the newest ones, fewer than ``limit``). A damaged message is passed over.
        """
        if limit <= 0:
            return []
        stream = self._topology.trail_stream
        with translated(f"read the latest of {stream}"):
            info = await self._js.stream_info(stream)
        first, last = int(info.state.first_seq or 0), int(info.state.last_seq or 0)
        if not info.state.messages or last < max(first, 1):
            return []
        newest: list[TrailRecord] = []
        budget = max_messages
        for window in windows:
            start = max(first, last - window + 1, 1)
            found = await self._read_forward(start, last, budget)
            if found is None:
                break
            records, read = found
            budget -= read
            newest = records[-limit:]
            if len(records) >= limit or start == max(first, 1):
                break
        return newest[::-1]

    async def _read_forward(
        self, start: int, last: int, budget: int
    ) -> tuple[list[TrailRecord], int] | None:
        """The records stored from ``start`` to ``last``, oldest first, and how many
        messages that took; None when it would take more than ``budget``."""
        topology = self._topology
        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start,
            ack_policy=api.AckPolicy.NONE,
            inactive_threshold=READ_INACTIVE_S,
            mem_storage=True,
        )
        records: list[TrailRecord] = []
        read = 0
        with translated(f"read {topology.trail_stream} from {start}"):
            sub = await self._js.pull_subscribe(
                f"{topology.prefix}.trail.>", stream=topology.trail_stream, config=config
            )
            try:
                while True:
                    if read >= budget:
                        return None
                    try:
                        batch = await sub.fetch(
                            min(READ_BATCH, budget - read), timeout=self._timeout
                        )
                    except nats.errors.TimeoutError:
                        return records, read  # nothing more was stored
                    for message in batch:
                        read += 1
                        meta = message.metadata
                        if meta.sequence.stream > last:
                            return records, read
                        with contextlib.suppress(ValueError, KeyError, TypeError):
                            records.append(
                                TrailRecord.from_json(json.loads(message.data or b"{}"))
                            )
                        if meta.sequence.stream >= last or meta.num_pending == 0:
                            return records, read
            finally:
                with contextlib.suppress(Exception):  # else the server removes it later
                    name = (await sub.consumer_info()).name
                    await sub.unsubscribe()
                    await self._js.delete_consumer(topology.trail_stream, name)

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

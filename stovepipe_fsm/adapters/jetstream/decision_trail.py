"""``DecisionTrail`` on a JetStream stream: one subject per request and kind.

Each request's records live under ``<prefix>.trail.<q>.<n>.<kind>`` (a hold: with a
digest of its reason as a last token), so a request's history is a handful of subjects
and every one of them holds exactly one record:

- a decision is published with ``Nats-Msg-Id`` = its key: a repeat inside the duplicate
  window is dropped; where its subject holds that one key (every kind but holds and
  plugin notes), it is also published only if the subject holds no message yet
  (``Nats-Expected-Last-Subject-Sequence: 0``, a compare-and-set of the stream), so a
  repeat after the window is refused by the broker and the first record stays;
  a plugin note lands on its request's one plugin subject, where only the last message
  is read (:meth:`JetStreamTrail.history`);
- a hold reads the record of its reason, adds one to its count, and publishes the sum
  with ``Nats-Rollup: sub``, which removes the earlier message: an hour of holds is one
  record with a count and its first and last time.

An operator verb (kind ``operator``), a plugin's note, a failed attempt and where a
culprit search stands (kind ``culprit``, one per write of the search row) carry what tells
them apart in the tag, so each has its own subject; a verb about queues (no request)
lands on ``<prefix>.trail._ops.<pattern token>.<digest of its key>``, so that
:meth:`JetStreamTrail.operator_records` for one queue lists the patterns (one request)
and reads the records of the matching ones alone, in one pass: a story costs the same
whatever the number of verbs about other queues.

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

from ...config.globs import glob_match
from ...domain.errors import NonRetryable
from ...domain.trail_record import (
    ATTEMPT_FAILED,
    CULPRIT,
    HELD,
    OPERATOR,
    PLUGIN,
    TrailRecord,
    decision_key,
)
from .bulk import last_per_subject
from .errors import is_wrong_last_sequence, translated
from .names import InvalidToken, decode_token
from .publisher import MSG_ID_HEADER
from .topology import Topology

ROLLUP_HEADER = "Nats-Rollup"
EXPECTED_LAST_SUBJECT_SEQ_HEADER = "Nats-Expected-Last-Subject-Sequence"
#: Kinds whose records are each on a subject of their own (the tag in it): a request
#: has many of them, and each is kept (an operator verb, a plugin's note, a failed
#: attempt, a step of a culprit search), where a later record of another kind replaces
#: the earlier one.
OWN_SUBJECT_KINDS = (OPERATOR, PLUGIN, ATTEMPT_FAILED, CULPRIT)
#: The windows of newest sequences :meth:`JetStreamTrail.latest` reads, narrowest first,
#: and the most messages it reads in all.
LATEST_WINDOWS = (1_024, 16_384, 131_072)
LATEST_MAX_MESSAGES = 20_000
READ_BATCH = 256
#: Subject filters of one read of operator records.
FILTERS_PER_READ = 256
#: An abandoned read consumer is removed by the server after this long.
READ_INACTIVE_S = 30.0


class JetStreamTrail:
    def __init__(self, js: JetStreamContext, topology: Topology, *, timeout: float = 5.0) -> None:
        self._js = js
        self._topology = topology
        self._timeout = timeout

    async def append(self, record: TrailRecord) -> None:
        topology = self._topology
        headers = {MSG_ID_HEADER: record.key}
        if record.kind == HELD:
            subject = topology.trail_subject(record.request_id, record.kind, record.tag)
            previous = await self._last(subject)
            if previous is not None:
                record = previous.again(record)
            headers = {ROLLUP_HEADER: "sub"}
        elif not record.request_id:
            subject = topology.operator_trail_subject(record.queue, record.key)
        elif record.kind in OWN_SUBJECT_KINDS:
            subject = topology.trail_subject(record.request_id, record.kind, record.tag)
        else:
            subject = topology.trail_subject(record.request_id, record.kind)
        if record.kind not in (HELD, PLUGIN):  # a subject of one key: kept once, for good
            headers[EXPECTED_LAST_SUBJECT_SEQ_HEADER] = "0"
        payload = json.dumps(record.as_json(), sort_keys=True, separators=(",", ":")).encode()
        with translated(f"trail {record.kind} of {record.request_id or record.queue}"):
            try:
                await self._js.publish(
                    subject,
                    payload,
                    timeout=self._timeout,
                    stream=topology.trail_stream,
                    headers=headers,
                )
            except nats.js.errors.APIError as exc:
                if not is_wrong_last_sequence(exc):
                    raise
                # The subject holds this decision already: kept once.

    async def has(self, request_id: str, kind: str) -> bool:
        """Whether the decision ``kind`` (one without a tag) about ``request_id`` is kept."""
        subject = self._topology.trail_subject(request_id, kind)
        record = await self._last(subject)
        return record is not None and record.key == decision_key(kind, request_id)

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

    async def operator_records(self, about: str = "") -> list[TrailRecord]:
        """The operator verbs about queues (pause, resume, dlq prune), oldest first:
        every one, or with ``about`` those whose pattern matches that queue."""
        topology = self._topology
        if about:
            filters = await self._operator_filters(about)
        else:
            filters = [topology.operator_trail_filter()]
        records: list[TrailRecord] = []
        for start in range(0, len(filters), FILTERS_PER_READ):
            found = await last_per_subject(
                self._js,
                topology.trail_stream,
                filters[start : start + FILTERS_PER_READ],
                timeout=self._timeout,
            )
            for message in found:
                records.append(_decoded(message.subject, message.data))
        return sorted(records, key=lambda r: (r.first_at_ms, r.at_ms))

    async def _operator_filters(self, queue: str) -> list[str]:
        """Filters for the verbs about ``queue``: one per pattern that matches it (listed
        in one request), and each record whose subject names no pattern."""
        topology = self._topology
        prefix = topology.operator_trail_prefix()
        with translated("list the operator trail"):
            info = await self._js.stream_info(
                topology.trail_stream, subjects_filter=topology.operator_trail_filter()
            )
        filters: dict[str, None] = {}
        for subject in sorted((info.state.subjects or {}).keys()):
            tokens = subject[len(prefix) :].split(".")
            if len(tokens) == 1:
                filters[subject] = None  # no pattern in its subject: read to be sure
                continue
            try:
                pattern = decode_token(tokens[0])
            except InvalidToken:
                continue  # not written by this service
            if glob_match(pattern, queue):
                filters[f"{prefix}{tokens[0]}.*"] = None
        return list(filters)

    async def _last(self, subject: str) -> TrailRecord | None:
        with translated(f"read trail {subject}"):
            try:
                message = await self._js.get_last_msg(self._topology.trail_stream, subject)
            except nats.js.errors.NotFoundError:
                return None
        return _decoded(subject, message.data)


def _decoded(subject: str, data: bytes | None) -> TrailRecord:
    try:
        return TrailRecord.from_json(json.loads(data or b"{}"))
    except (ValueError, KeyError, TypeError) as exc:
        raise NonRetryable(f"trail record on {subject} is damaged: {exc}") from None

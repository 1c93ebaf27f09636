"""Reading a whole bucket, a key range or a list of keys of it (and, on any stream, the
last message of each subject a set of filters matches) in one pass.

A listing of keys followed by one ``get`` per key costs a round trip per row, tens of
thousands of them for ``status`` of 10,000 queues and their requests. One short-lived
pull consumer delivering the last message per key streams every row instead, a batch
per round trip, and each message says how many are still pending, which is where the
read stops.

A pull consumer, not the client's key watch: the watch is pushed, and when the server
has pushed every row before the watch checks its pending count, it reports "nothing
there" and the rows arrive after the read has ended (an empty ``status`` now and then).
A pull consumer delivers nothing until asked, so its pending count at creation is exact;
an empty read costs two requests (create, delete).
"""

from __future__ import annotations

import contextlib
import datetime
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext, api

from .asked_again import asked_again
from .errors import translated

#: How long a bulk read waits for its next batch before giving up.
BULK_READ_TIMEOUT_S = 10.0
#: Rows asked for per round trip.
BULK_READ_BATCH = 512
#: The server removes the reader's consumer after this long unused (if a crash left it).
READER_INACTIVE_S = 60.0

#: ``KV-Operation`` headers of a key that holds no value.
REMOVED_OPERATIONS = frozenset({"DEL", "PURGE"})


@dataclass(frozen=True)
class StoredMessage:
    """The last message of one subject, as the stream stores it."""

    subject: str
    data: bytes
    sequence: int
    stored: datetime.datetime
    #: The ``KV-Operation`` header (``DEL``, ``PURGE``), empty for a plain message.
    operation: str = ""


@dataclass(frozen=True)
class BucketRow:
    """One key's latest value, with the revision and the time the server stored it."""

    key: str
    value: bytes
    revision: int
    stored: datetime.datetime


async def kv_snapshot(
    js: JetStreamContext, bucket: str, keys: str = ">", *, timeout: float = BULK_READ_TIMEOUT_S
) -> list[tuple[str, bytes]]:
    """``(key, value)`` of every key of ``bucket`` matching ``keys`` that holds a value
    (:func:`kv_rows` without revision and time)."""
    return [(row.key, row.value) for row in await kv_rows(js, bucket, keys, timeout=timeout)]


async def kv_rows(
    js: JetStreamContext, bucket: str, keys: str = ">", *, timeout: float = BULK_READ_TIMEOUT_S
) -> list[BucketRow]:
    """Every key of ``bucket`` matching ``keys`` that holds a value, in stream order:
    deleted, purged and empty ones left out; empty when the bucket does not exist;
    ``TimeoutError`` naming the bucket when the broker stalls for ``timeout``."""
    return values_of(bucket, await kv_entries(js, bucket, (keys,), timeout=timeout))


async def kv_rows_of(
    js: JetStreamContext,
    bucket: str,
    keys: Iterable[str],
    *,
    timeout: float = BULK_READ_TIMEOUT_S,
) -> list[BucketRow]:
    """The rows of exactly ``keys`` that hold a value, in one pass (:func:`kv_rows` with
    one filter per key): a look at many known keys costs the same few round trips as a
    look at one. Keep ``keys`` to a few hundred: they all travel in one request."""
    wanted = tuple(dict.fromkeys(keys))  # the server refuses overlapping filters
    if not wanted:
        return []
    return values_of(bucket, await kv_entries(js, bucket, wanted, timeout=timeout))


async def kv_entries(
    js: JetStreamContext,
    bucket: str,
    keys: Sequence[str] = (">",),
    *,
    timeout: float = BULK_READ_TIMEOUT_S,
) -> list[StoredMessage]:
    """The last entry of every key of ``bucket`` matching one of ``keys``, values and
    delete markers alike, in one pass (:func:`last_per_subject`)."""
    prefix = kv_prefix(bucket)
    return await last_per_subject(
        js, f"KV_{bucket}", [prefix + key for key in keys], timeout=timeout, what=bucket
    )


def values_of(bucket: str, entries: Iterable[StoredMessage]) -> list[BucketRow]:
    """The entries of ``bucket`` that hold a value, as rows: markers and empty ones left
    out."""
    start = len(kv_prefix(bucket))
    return [
        BucketRow(m.subject[start:], m.data, m.sequence, m.stored)
        for m in entries
        if m.data and m.operation not in REMOVED_OPERATIONS
    ]


def kv_prefix(bucket: str) -> str:
    """What the subject of every key of ``bucket`` starts with."""
    return f"$KV.{bucket}."


async def last_per_subject(
    js: JetStreamContext,
    stream: str,
    subjects: Sequence[str],
    *,
    timeout: float = BULK_READ_TIMEOUT_S,
    what: str = "",
) -> list[StoredMessage]:
    """The last message of every subject of ``stream`` matching one of the filters
    ``subjects`` (wildcards allowed, none overlapping another), in stream order; empty
    when the stream does not exist; ``TimeoutError`` naming ``what`` (the stream) when
    the broker stalls for ``timeout``. A read the broker answers with no one to serve it
    (a cluster electing the stream's leader after a node went down) is asked again a few
    times: the read changes nothing."""
    filters = tuple(subjects)
    return await asked_again(
        lambda: _last_per_subject_once(js, stream, filters, timeout, what or stream)
    )


async def _last_per_subject_once(
    js: JetStreamContext, stream: str, filters: tuple[str, ...], timeout: float, what: str
) -> list[StoredMessage]:
    name = f"bulk-{uuid.uuid4().hex}"
    config = api.ConsumerConfig(
        name=name,
        filter_subject=filters[0] if len(filters) == 1 else None,
        filter_subjects=list(filters) if len(filters) > 1 else None,
        deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
        ack_policy=api.AckPolicy.NONE,
        inactive_threshold=READER_INACTIVE_S,
        mem_storage=True,
    )
    with translated(f"read {what}"):
        try:
            created = await js.add_consumer(stream, config)
        except nats.js.errors.NotFoundError:  # no such stream (yet)
            return []
        try:
            if not created.num_pending:
                return []
            return await _read_all(js, stream, name, what, timeout)
        finally:
            with contextlib.suppress(Exception):  # else the server removes it later
                await js.delete_consumer(stream, name)


async def _read_all(
    js: JetStreamContext, stream: str, name: str, what: str, timeout: float
) -> list[StoredMessage]:
    sub = await js.pull_subscribe_bind(consumer=name, stream=stream)
    found: list[StoredMessage] = []
    try:
        while True:
            try:
                batch = await sub.fetch(BULK_READ_BATCH, timeout=timeout)
            except nats.errors.TimeoutError:
                raise TimeoutError(
                    f"{what}: no value within {timeout:g}s while reading it"
                ) from None
            for msg in batch:
                meta = msg.metadata
                operation = (msg.headers or {}).get("KV-Operation", "")
                found.append(
                    StoredMessage(
                        msg.subject,
                        msg.data or b"",
                        meta.sequence.stream,
                        meta.timestamp,
                        operation,
                    )
                )
                if meta.num_pending == 0:
                    return found
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()

"""The process stream's partitions: which exist, which has room, moving a queue's work.

The broker caps the consumers of each stream at the account's JetStream consumer limit,
and every queue has a consumer of its own, so one process stream serves at most that
many queues. Past it the service spreads queues over partitions (``topology.py`` names
them): a queue stays where it is until its own stream refuses it a consumer, and then
moves, once, to the lowest partition with room, created if none has any.

A queue's row names its partition, and ingest publishes where the row it read says. A
publish that read the row just before the move lands on the old partition; the service
moves such messages after it (:func:`move_waiting`), so none is left where no consumer
reads it. A moved message keeps its ``Nats-Msg-Id``, so a move repeated after a crash
between the copy and the delete is dropped by the target's duplicate window; past the
window the copy is delivered and found already done, as any re-published request is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg

from ...domain.errors import NonRetryable
from .errors import is_no_message, translated
from .raw_api import api_request
from .topology import MAX_PARTITIONS, Topology, ensure_partition

log = logging.getLogger("stovepipe_fsm.service")

#: Messages of one queue moved in one call: bounds a call against a flooded subject (the
#: next discovery round moves the rest).
MAX_MOVED = 1_000


class NoPartitionRoom(NonRetryable):
    """No partition has room for one more consumer and the account refuses a new stream."""


async def partitions(js: JetStreamContext, topology: Topology) -> list[int]:
    """The partitions whose stream exists, in order (one request per 1,024 streams)."""
    found: set[int] = set()
    offset = 0
    with translated("list the process stream's partitions"):
        while True:
            body = json.dumps({"subject": topology.process_subjects_filter(), "offset": offset})
            answer = await api_request(js, "STREAM.NAMES", body.encode())
            if "error" in answer:
                raise NonRetryable(f"stream names: {answer['error']}")
            names = answer.get("streams") or []
            for name in names:
                partition = topology.partition_of_process_stream(name)
                if partition is not None:
                    found.add(partition)
            offset += len(names)
            if not names or offset >= int(answer.get("total", 0)):
                break
    return sorted(found)


async def waiting_subjects(
    js: JetStreamContext, topology: Topology, numbers: list[int]
) -> dict[str, int]:
    """Every process subject holding messages on the partitions ``numbers``, with how
    many (one stream info per partition)."""
    out: dict[str, int] = {}
    for partition in numbers:
        stream = topology.process_stream_of(partition)
        with translated(f"list subjects of {stream}"):
            try:
                info = await js.stream_info(stream, subjects_filter=">")
            except nats.js.errors.NotFoundError:
                if partition == 0:
                    raise
                continue  # deleted since it was listed: nothing waits on it
        out.update(info.state.subjects or {})
    return out


@dataclass(frozen=True)
class AccountLimits:
    """What the account lets the process stream's partitions hold."""

    #: Consumers per stream (-1: no limit of the account's).
    max_consumers: int
    #: Streams (-1: no limit).
    max_streams: int


async def account_limits(js: JetStreamContext) -> AccountLimits:
    with translated("read the account's JetStream limits"):
        limits = (await js.account_info()).limits
    return AccountLimits(limits.max_consumers, limits.max_streams)


async def consumer_count(js: JetStreamContext, topology: Topology, partition: int) -> int | None:
    """How many consumers ``partition``'s stream holds; None when it does not exist.

    The count can lag creations in flight (on a cluster, ``consumer_limit.py``): a
    partition read to have room may refuse a create after all."""
    stream = topology.process_stream_of(partition)
    with translated(f"read {stream}"):
        try:
            info = await js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            return None
    return info.state.consumer_count or 0


async def create_partition(
    js: JetStreamContext, topology: Topology, partition: int, limits: AccountLimits
) -> None:
    """Create ``partition``'s stream (an existing one is checked and kept);
    :class:`NoPartitionRoom` when the account refuses it."""
    if partition >= MAX_PARTITIONS:
        raise NoPartitionRoom(
            f"every one of the {MAX_PARTITIONS} partitions of {topology.process_stream} "
            "is full"
        )
    try:
        created = await ensure_partition(js, topology, partition)
    except NonRetryable as exc:
        streams = limits.max_streams
        raise NoPartitionRoom(
            f"no partition of {topology.process_stream} has room for another consumer "
            f"(the account caps each stream at {limits.max_consumers}), and creating "
            f"partition {partition} failed: {exc} (the account allows "
            f"{streams if streams > 0 else 'any number of'} streams; raise its JetStream "
            "limits: nats account info)"
        ) from None
    if created:
        log.warning(
            "created partition %d of the process stream (%s): the others hold %s consumers "
            "each, the account's limit",
            partition,
            topology.process_stream_of(partition),
            limits.max_consumers,
        )


async def stored_messages(
    js: JetStreamContext, stream: str, subject: str, limit: int
) -> AsyncIterator[RawStreamMsg]:
    """``subject``'s messages stored in ``stream``, oldest first, at most ``limit``: each
    read by sequence after the one before, so a consumer's ack or another reader's
    delete in between skips nothing and repeats nothing."""
    seq = 0
    for _ in range(limit):
        with translated(f"read {subject} on {stream}"):
            try:
                raw = await js.get_msg(stream, seq=seq + 1, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                return
        seq = int(raw.seq or 0)
        if seq < 1:
            return
        yield raw


async def delete_stored(js: JetStreamContext, stream: str, seq: int) -> bool:
    """Delete message ``seq`` of ``stream``; False when it was gone already (another
    delete of it came first)."""
    with translated(f"delete message {seq} of {stream}"):
        try:
            await js.delete_msg(stream, seq)
        except nats.js.errors.APIError as exc:
            if not is_no_message(exc):
                raise
            return False
    return True


async def move_waiting(
    js: JetStreamContext, topology: Topology, queue: str, source: int, target: int
) -> int:
    """Move ``queue``'s messages waiting on partition ``source`` to ``target``, oldest
    first, each copied (with its headers) before it is deleted; how many were moved."""
    stream = topology.process_stream_of(source)
    subject = topology.process_subject(queue, source)
    destination = topology.process_subject(queue, target)
    target_stream = topology.process_stream_of(target)
    moved = 0
    async for raw in stored_messages(js, stream, subject, MAX_MOVED):
        stored = raw.headers or {}
        headers = {k: v for k, v in stored.items() if not k.startswith("Nats-Expected")}
        with translated(f"move message {raw.seq} of {subject} to {target_stream}"):
            await js.publish(
                destination, raw.data or b"", stream=target_stream, headers=headers or None
            )
        # Gone already: another move of it (a second replica) deleted it first.
        if await delete_stored(js, stream, int(raw.seq or 0)):
            moved += 1
    if moved:
        log.warning(
            "moved %d waiting message(s) from partition %d to %d",
            moved,
            source,
            target,
            extra={"queue": queue},
        )
    return moved


async def room_for_refused(js: JetStreamContext, topology: Topology) -> bool:
    """Whether a queue refused for want of room might now get a consumer: the account
    has no consumer limit, may hold another stream, or a partition has room. On a
    cluster the counts can lag, so ``True`` is a reason to try, not a promise."""
    with translated("read the account's JetStream limits"):
        account = await js.account_info()
    limits = account.limits
    if limits.max_consumers <= 0:
        return True
    if limits.max_streams <= 0 or account.streams < limits.max_streams:
        return True
    for partition in await partitions(js, topology):
        count = await consumer_count(js, topology, partition)
        if count is not None and count < limits.max_consumers:
            return True
    return False

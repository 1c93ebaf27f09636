"""Entity stores remember revisions: fewer reads, and the same compare-and-set contract.

Each store instance remembers the (version, revision) of the last value it read or wrote
per key and writes straight on that revision when the caller's ``old`` matches it. These
tests count the reads and writes that reach the broker, and check that a write from
another instance on another connection still makes a stale ``old`` fail without
overwriting anything.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from nats_server import JsEnv, close, connect

from stovepipe_fsm.adapters.jetstream import KvCell, KvEntry, KvQueueStore, KvRequestStore
from stovepipe_fsm.adapters.jetstream.codec import encode_request
from stovepipe_fsm.adapters.jetstream.entity_stores import RevisionMemory
from stovepipe_fsm.domain.entities import Queue, Request
from stovepipe_fsm.domain.errors import NotFound, Retryable, VersionMismatch
from stovepipe_fsm.domain.ids import format_request_id

QUEUE = "monorepo/main"


class CountingCell(KvCell):
    """A real cell that counts the reads and conditional writes it sends to the broker."""

    def __init__(self, kv: KeyValue, bucket: str, js: JetStreamContext) -> None:
        super().__init__(kv, bucket, js)
        self.reads = 0
        self.replaces = 0

    async def read(self, key: str) -> KvEntry:
        self.reads += 1
        return await super().read(key)

    async def replace(self, key: str, value: bytes, revision: int) -> int:
        self.replaces += 1
        return await super().replace(key, value, revision)

    def reset(self) -> None:
        self.reads = self.replaces = 0


class ReplyLostCell(CountingCell):
    """Every conditional write lands on the server, but its reply is lost on the way back."""

    async def replace(self, key: str, value: bytes, revision: int) -> int:
        await super().replace(key, value, revision)
        raise Retryable(f"update {self.bucket}/{key}: reply lost")


def _request(n: int, **changes: object) -> Request:
    request = Request(
        id=format_request_id(QUEUE, n), queue=QUEUE, uri=f"commit-{n}", state="accepted"
    )
    return dataclasses.replace(request, **changes)


async def _cell(nc: Client, bucket: str, kind: type[CountingCell] = CountingCell) -> CountingCell:
    js = nc.jetstream()
    return kind(await js.key_value(bucket), bucket, js)


@pytest.fixture
async def other_nc(js_env: JsEnv) -> AsyncIterator[Client]:
    """A second connection to the same broker: another replica's view of the buckets."""
    nc = await connect(js_env.server)
    try:
        yield nc
    finally:
        await close(nc)


async def test_update_after_get_writes_without_reading(js_env: JsEnv) -> None:
    cell = await _cell(js_env.nc, js_env.topology.requests_bucket)
    store = KvRequestStore(cell)
    await KvRequestStore(await _cell(js_env.nc, cell.bucket)).create(_request(1))
    loaded = await store.get(_request(1).id)
    cell.reset()
    await store.update(dataclasses.replace(loaded, state="processing"), 1, 2)
    assert (cell.reads, cell.replaces) == (0, 1)
    # What it wrote is remembered too: the next step of the same request reads nothing.
    await store.update(dataclasses.replace(loaded, state="succeeded"), 2, 3)
    assert (cell.reads, cell.replaces) == (0, 2)
    assert await store.get(loaded.id) == dataclasses.replace(loaded, state="succeeded", version=3)


async def test_update_after_create_writes_without_reading(js_env: JsEnv) -> None:
    cell = await _cell(js_env.nc, js_env.topology.queues_bucket)
    store = KvQueueStore(cell)
    await store.create(Queue(name=QUEUE))
    await store.update(Queue(name=QUEUE).with_holder(_request(1).id), 1, 2)
    assert (cell.reads, cell.replaces) == (0, 1)


async def test_stale_old_after_another_connection_wrote_is_refused(
    js_env: JsEnv, other_nc: Client
) -> None:
    """A reads, B (another connection) claims the slot, A claims with its stale version."""
    bucket = js_env.topology.queues_bucket
    cell_a, cell_b = await _cell(js_env.nc, bucket), await _cell(other_nc, bucket)
    store_a, store_b = KvQueueStore(cell_a), KvQueueStore(cell_b)
    await store_b.create(Queue(name=QUEUE))
    row_a = await store_a.get(QUEUE)
    row_b = await store_b.get(QUEUE)
    b_wrote = row_b.with_holder(_request(1).id)
    await store_b.update(b_wrote, 1, 2)
    cell_a.reset()
    with pytest.raises(VersionMismatch, match="stored version is 2, not 1"):
        await store_a.update(row_a.with_holder(_request(2).id), 1, 2)
    # The remembered revision was refused by the server; one read then told why.
    assert (cell_a.reads, cell_a.replaces) == (1, 1)
    assert await store_b.get(QUEUE) == dataclasses.replace(b_wrote, version=2)
    assert await store_a.get(QUEUE) == dataclasses.replace(b_wrote, version=2)


async def test_old_equal_to_the_other_connections_version_succeeds_after_a_read(
    js_env: JsEnv, other_nc: Client
) -> None:
    """A reads, B updates, A updates naming B's new version: A's memory is behind, so A
    reads the row, finds B's version and writes on the revision it just read."""
    bucket = js_env.topology.requests_bucket
    cell_a, cell_b = await _cell(js_env.nc, bucket), await _cell(other_nc, bucket)
    store_a, store_b = KvRequestStore(cell_a), KvRequestStore(cell_b)
    await store_b.create(_request(1))
    await store_a.get(_request(1).id)
    await store_b.update(_request(1, state="processing"), 1, 2)
    cell_a.reset()
    await store_a.update(_request(1, state="succeeded"), 2, 3)
    assert (cell_a.reads, cell_a.replaces) == (1, 1)
    assert await store_b.get(_request(1).id) == _request(1, state="succeeded", version=3)


async def test_a_rewrite_of_the_same_version_is_retried_once_on_the_fresh_revision(
    js_env: JsEnv, other_nc: Client
) -> None:
    """Our writers always bump the version; if anything rewrote the same version, the
    remembered revision is refused, the read finds ``old`` still stored, and the write is
    retried on the fresh revision."""
    bucket = js_env.topology.requests_bucket
    cell = await _cell(js_env.nc, bucket)
    store = KvRequestStore(cell)
    await store.create(_request(1))
    raw = await other_nc.jetstream().key_value(bucket)
    await raw.put(_request(1).id, encode_request(_request(1, uri="rewritten")))
    cell.reset()
    await store.update(_request(1, state="processing"), 1, 2)
    assert (cell.reads, cell.replaces) == (1, 2)
    assert await store.get(_request(1).id) == _request(1, state="processing", version=2)


async def test_a_key_deleted_since_it_was_remembered_is_not_found_and_stays_gone(
    js_env: JsEnv, other_nc: Client
) -> None:
    bucket = js_env.topology.requests_bucket
    store = KvRequestStore(await _cell(js_env.nc, bucket))
    await store.create(_request(1))
    await (await other_nc.jetstream().key_value(bucket)).delete(_request(1).id)
    with pytest.raises(NotFound):
        await store.update(_request(1, state="processing"), 1, 2)
    with pytest.raises(NotFound):
        await store.get(_request(1).id)


async def test_concurrent_updates_on_one_remembered_revision_one_wins(js_env: JsEnv) -> None:
    cell = await _cell(js_env.nc, js_env.topology.queues_bucket)
    store = KvQueueStore(cell)
    await store.create(Queue(name=QUEUE))
    row = await store.get(QUEUE)
    writers = [row.with_holder(_request(n).id) for n in range(1, 4)]
    cell.reset()
    results = await asyncio.gather(
        *(store.update(w, 1, 2) for w in writers), return_exceptions=True
    )
    # All three write on the remembered revision; each loser reads once to learn why.
    assert (cell.reads, cell.replaces) == (2, 3)
    winners = [w for w, r in zip(writers, results, strict=True) if r is None]
    assert len(winners) == 1
    assert [type(r) for r in results if r is not None] == [VersionMismatch, VersionMismatch]
    assert await store.get(QUEUE) == dataclasses.replace(winners[0], version=2)


async def test_after_a_lost_reply_a_retry_with_the_old_version_is_refused(
    js_env: JsEnv,
) -> None:
    """The write landed but its reply was lost: the caller, told ``Retryable``, retries
    from the same ``old``. That must not write twice; the stored version already moved."""
    bucket = js_env.topology.requests_bucket
    lossy = await _cell(js_env.nc, bucket, ReplyLostCell)
    store = KvRequestStore(lossy)
    await store.create(_request(1))
    with pytest.raises(Retryable):
        await store.update(_request(1, state="processing"), 1, 2)
    lossy.reset()
    with pytest.raises(VersionMismatch, match="stored version is 2, not 1"):
        await store.update(_request(1, state="processing"), 1, 2)
    # Nothing was remembered for a write of unknown outcome: the retry read first.
    assert (lossy.reads, lossy.replaces) == (1, 0)
    assert await store.get(_request(1).id) == _request(1, state="processing", version=2)


async def test_memory_is_bounded_least_recently_used_first(js_env: JsEnv) -> None:
    cell = await _cell(js_env.nc, js_env.topology.requests_bucket)
    store = KvRequestStore(cell, remembered_keys=2)
    for n in (1, 2, 3):
        await store.create(_request(n))
    # Remembered: 2 and 3. Reading 2 again makes 3 the least recently used.
    await store.get(_request(2).id)
    await store.get(_request(1).id)
    cell.reset()
    await store.update(_request(1, state="processing"), 1, 2)
    await store.update(_request(2, state="processing"), 1, 2)
    assert cell.reads == 0
    await store.update(_request(3, state="processing"), 1, 2)
    assert cell.reads == 1
    for n in (1, 2, 3):
        assert (await store.get(_request(n).id)).version == 2


def test_memory_keeps_the_later_revision_when_answers_arrive_out_of_order() -> None:
    memory = RevisionMemory(capacity=4)
    memory.note("k", version=3, revision=12)
    memory.note("k", version=2, revision=9)  # an older read finishing late
    assert memory.get("k") == (3, 12)
    memory.forget("k", revision=9)  # a failed write on a revision already superseded
    assert memory.get("k") == (3, 12)
    memory.forget("k", revision=12)
    assert memory.get("k") is None


def test_memory_of_capacity_zero_remembers_nothing() -> None:
    memory = RevisionMemory(capacity=0)
    memory.note("k", version=1, revision=1)
    assert memory.get("k") is None
    assert len(memory) == 0
    with pytest.raises(ValueError, match="capacity"):
        RevisionMemory(capacity=-1)

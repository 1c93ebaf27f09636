"""KV store behaviour beyond the shared contract: revisions, races, damage, broker loss."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
from nats.js.kv import KeyValue
from nats_server import JsEnv, close, connect

from stovepipe_fsm.adapters.jetstream import (
    JetStreamPublisher,
    KvCell,
    KvCounter,
    KvEntry,
    KvQueueStore,
    KvRequestStore,
    NatsServer,
    Topology,
    ensure_topology,
    open_cell,
    open_kv_stores,
)
from stovepipe_fsm.adapters.jetstream.codec import encode_queue
from stovepipe_fsm.domain.entities import Queue, Request
from stovepipe_fsm.domain.errors import NonRetryable, NotFound, Retryable, VersionMismatch

QUEUE = "monorepo/main"


async def _raw(js_env: JsEnv, bucket: str) -> KeyValue:
    return await js_env.js.key_value(bucket)


class _WriterAfterRead(KvCell):
    """A cell that lets another writer in right after each read: the CAS window, forced."""

    def __init__(self, cell: KvCell, kv: KeyValue, sneak: bytes) -> None:
        super().__init__(kv, cell.bucket, cell.js)
        self._sneak = sneak
        self.sneaked = 0

    async def read(self, key: str) -> KvEntry:
        entry = await super().read(key)
        await self._kv.put(key, self._sneak)
        self.sneaked += 1
        return entry


async def test_keys_are_the_readable_encodings(js_env: JsEnv) -> None:
    stores = await open_kv_stores(js_env.js, js_env.topology)
    await stores.requests.create(
        Request(id="request/monorepo/main/1", queue=QUEUE, uri="c1", state="accepted")
    )
    await stores.queues.create(Queue(name="org/repo/release/1.2"))
    raw_requests = await _raw(js_env, js_env.topology.requests_bucket)
    raw_queues = await _raw(js_env, js_env.topology.queues_bucket)
    assert json.loads((await raw_requests.get("request/monorepo/main/1")).value)["uri"] == "c1"
    assert (await raw_queues.get("org/repo/release/1_2E2")).value is not None


async def test_revision_race_is_a_version_mismatch_not_an_overwrite(js_env: JsEnv) -> None:
    """The stored version matches, yet someone wrote after our read: the write must fail."""
    cell = await open_cell(js_env.js, js_env.topology.queues_bucket)
    raw = await _raw(js_env, js_env.topology.queues_bucket)
    plain = KvQueueStore(cell)
    await plain.create(Queue(name=QUEUE))
    intruder = encode_queue(Queue(name=QUEUE, latest_request_id="request/monorepo/main/9"))
    racing = KvQueueStore(_WriterAfterRead(cell, raw, intruder))
    with pytest.raises(VersionMismatch, match="changed since revision"):
        await racing.update(Queue(name=QUEUE).with_holder("request/monorepo/main/1"), 1, 2)
    assert await plain.get(QUEUE) == Queue(name=QUEUE, latest_request_id="request/monorepo/main/9")


async def test_deleted_keys_read_as_not_found_and_can_be_created_again(js_env: JsEnv) -> None:
    cell = await open_cell(js_env.js, js_env.topology.requests_bucket)
    store = KvRequestStore(cell)
    request = Request(id="request/monorepo/main/1", queue=QUEUE, uri="c1", state="accepted")
    await store.create(request)
    await (await _raw(js_env, js_env.topology.requests_bucket)).delete("request/monorepo/main/1")
    with pytest.raises(NotFound):
        await store.get(request.id)
    with pytest.raises(NotFound):
        await store.update(request, 1, 2)
    await store.create(dataclasses.replace(request, uri="c2"))
    assert (await store.get(request.id)).uri == "c2"


async def test_unkeyable_ids_are_plain_misses(js_env: JsEnv) -> None:
    stores = await open_kv_stores(js_env.js, js_env.topology)
    with pytest.raises(NotFound):
        await stores.requests.get("")
    with pytest.raises(NotFound):
        await stores.queues.get("not a queue name")


async def test_damaged_value_is_non_retryable(js_env: JsEnv) -> None:
    stores = await open_kv_stores(js_env.js, js_env.topology)
    raw = await _raw(js_env, js_env.topology.requests_bucket)
    await raw.put("request/monorepo/main/1", b'{"schema": 1, "kind": "request"}')
    with pytest.raises(NonRetryable, match="missing field"):
        await stores.requests.get("request/monorepo/main/1")


async def test_counter_gives_up_after_bounded_lost_races(js_env: JsEnv) -> None:
    cell = await open_cell(js_env.js, js_env.topology.counters_bucket)
    raw = await _raw(js_env, js_env.topology.counters_bucket)
    assert await KvCounter(cell).next(QUEUE) == 1
    racing = _WriterAfterRead(cell, raw, b"100")
    with pytest.raises(Retryable, match="lost 3 compare-and-set races"):
        await KvCounter(racing, max_attempts=3).next(QUEUE)
    assert racing.sneaked == 3
    assert await KvCounter(cell).next(QUEUE) == 101


async def test_counter_hands_out_the_next_value_only_after_the_one_named(js_env: JsEnv) -> None:
    cell = await open_cell(js_env.js, js_env.topology.counters_bucket)
    counter = KvCounter(cell)
    assert await counter.next_after(QUEUE, 0) == 1  # a queue's first value
    assert await counter.next_after(QUEUE, 0) is None
    assert await KvCounter(cell).next(QUEUE) == 2  # another writer takes 2
    assert await counter.next_after(QUEUE, 1) is None
    assert await counter.next_after(QUEUE, 2) == 3
    racing = _WriterAfterRead(cell, await _raw(js_env, js_env.topology.counters_bucket), b"9")
    assert await KvCounter(racing).next_after(QUEUE, 3) is None  # lost the CAS to 9
    assert await counter.next(QUEUE) == 10


async def test_counter_survives_concurrent_minters_on_separate_connections(
    js_env: JsEnv,
) -> None:
    """Replicas mint from separate connections; numbers are still never handed out twice."""
    clients = [await connect(js_env.server) for _ in range(3)]
    try:
        counters = [
            KvCounter(await open_cell(nc.jetstream(), js_env.topology.counters_bucket))
            for nc in clients
        ]
        values = await asyncio.gather(*(c.next(QUEUE) for c in counters for _ in range(10)))
        assert sorted(values) == list(range(1, 31))
    finally:
        for nc in clients:
            await nc.close()


async def test_damaged_counter_is_non_retryable(js_env: JsEnv) -> None:
    cell = await open_cell(js_env.js, js_env.topology.counters_bucket)
    await (await _raw(js_env, js_env.topology.counters_bucket)).put("monorepo/main", b"x1")
    with pytest.raises(NonRetryable, match="not a positive integer"):
        await KvCounter(cell).next(QUEUE)


async def test_missing_bucket_is_non_retryable(js_env: JsEnv) -> None:
    other = Topology.isolated("never-created")
    with pytest.raises(NonRetryable, match="ensure_topology"):
        await open_kv_stores(js_env.js, other)


async def test_closed_connection_is_retryable(js_env: JsEnv) -> None:
    nc = await connect(js_env.server)
    stores = await open_kv_stores(nc.jetstream(), js_env.topology)
    await nc.close()
    with pytest.raises(Retryable):
        await stores.requests.get("request/monorepo/main/1")
    with pytest.raises(Retryable):
        await stores.counters.next(QUEUE)


@pytest.mark.nats
async def test_broker_down_is_retryable_within_the_request_timeout(tmp_path: Path) -> None:
    async with NatsServer(tmp_path) as server:
        nc = await connect(server, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        try:
            js = nc.jetstream(timeout=1.0)
            topology = Topology.isolated("down")
            await ensure_topology(js, topology)
            stores = await open_kv_stores(js, topology)
            await asyncio.to_thread(server.stop)
            with pytest.raises(Retryable):
                await asyncio.wait_for(stores.queues.get(QUEUE), timeout=10)
            with pytest.raises(Retryable):
                await asyncio.wait_for(stores.queues.create(Queue(name=QUEUE)), timeout=10)
        finally:
            await close(nc)


async def test_worst_case_names_fit_the_servers_limits(js_env: JsEnv) -> None:
    """A 200-character queue name of 4-byte characters encodes to 2400 characters; keys,
    uri keys and subjects built from it must still fit the server's control-line limit."""
    queue = "🚀" * 200
    stores = await open_kv_stores(js_env.js, js_env.topology)
    request = Request(id=f"request/{queue}/1", queue=queue, uri="c1", state="accepted")
    await stores.requests.create(request)
    await stores.queues.create(Queue(name=queue))
    assert await stores.uris.put_if_absent(queue, "ü" * 66, request.id) == request.id
    assert await stores.uris.get(queue, "ü" * 66) == request.id
    assert await stores.counters.next(queue) == 1
    assert await stores.requests.get(request.id) == request
    publisher = JetStreamPublisher(js_env.js, js_env.topology)
    await publisher.publish_process(queue, request.id)
    await publisher.publish_build(queue, request.id)
    info = await js_env.js.stream_info(js_env.topology.process_stream)
    assert info.state.messages == 1


async def test_a_ref_cursor_moves_by_compare_and_set(js_env: JsEnv) -> None:
    """Two writers read one ref's cursor: the first to write moves it, the other is told
    and leaves it; a cursor of another queue or ref is another key."""
    from stovepipe_fsm.adapters.jetstream.ref_cursors import POLL, KvRefCursors

    cursors = KvRefCursors(await open_cell(js_env.js, js_env.topology.service_bucket))
    blank = await cursors.read(QUEUE, "main")
    assert (blank.commit, blank.revision) == ("", 0)
    assert await cursors.advance(blank, "a" * 40, reporter=POLL)
    assert not await cursors.advance(blank, "b" * 40, reporter=POLL)  # a second first write loses
    read = await cursors.read(QUEUE, "main")
    assert read.commit == "a" * 40
    assert await cursors.advance(read, "c" * 40, reporter=POLL)
    assert not await cursors.advance(read, "d" * 40, reporter=POLL)  # stale: the cursor moved since
    assert (await cursors.read(QUEUE, "main")).commit == "c" * 40
    assert (await cursors.read(QUEUE, "release")).commit == ""
    assert (await cursors.read("other/main", "main")).commit == ""


async def test_a_ref_cursor_knows_the_commits_behind_it_until_a_force_push(
    js_env: JsEnv,
) -> None:
    """``main`` and ``refs/heads/main`` are one cursor; the commits it is known to
    descend from are kept while it moves in order, bounded, and dropped on a rewrite."""
    from stovepipe_fsm.adapters.jetstream.ref_cursors import (
        MAX_BEHIND,
        WEBHOOK,
        KvRefCursors,
    )

    a, b, c, d = ("a" * 40, "b" * 40, "c" * 40, "d" * 40)
    cursors = KvRefCursors(await open_cell(js_env.js, js_env.topology.service_bucket))
    assert await cursors.advance(await cursors.read(QUEUE, "main"), b, reporter=WEBHOOK, older=[a])
    read = await cursors.read(QUEUE, "refs/heads/main")
    assert (read.commit, read.reporter, read.behind) == (b, WEBHOOK, (a,))
    assert await cursors.advance(read, d, reporter=WEBHOOK, older=[c])
    read = await cursors.read(QUEUE, "main")
    assert read.behind == (c, b, a) and read.covers(a) and read.covers(d)
    assert not read.covers("e" * 40)
    assert await cursors.advance(read, a, reporter=WEBHOOK, continues=False)
    read = await cursors.read(QUEUE, "main")
    assert (read.commit, read.behind) == (a, ())
    many = [f"{n:040x}" for n in range(1, 2 * MAX_BEHIND)]
    assert await cursors.advance(read, b, reporter=WEBHOOK, older=many)
    assert len((await cursors.read(QUEUE, "main")).behind) == MAX_BEHIND

"""Contract of the storage ports (``stovepipe_fsm.ports.stores``).

Fixtures a subclass provides (plain or async, function scoped, each a fresh empty store):

- ``request_store``: a ``RequestStore``
- ``queue_store``: a ``QueueStore``
- ``uri_index``: a ``UriIndex``
- ``counter``: a ``Counter``

The suite checks behaviour the controller relies on, not implementation details: the
compare-and-set is the only thing that keeps two writers of a Queue row (ingest
stamping the latest head, process claiming a slot) from clobbering each other.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from stovepipe_fsm.domain.entities import FULL, Queue, Request
from stovepipe_fsm.domain.errors import AlreadyExists, NotFound, VersionMismatch
from stovepipe_fsm.domain.ids import format_request_id
from stovepipe_fsm.domain.queue_names import validate_stored_queue_name
from stovepipe_fsm.ports import Counter, QueueStore, RequestStore, UriIndex

# Queue names a store may hold (the form rule: some predate the rule for new names, such
# as the mixed-script and emoji ones) that are awkward for a key-value or subject-based
# backend.
ODD_QUEUE_NAMES = (
    "monorepo/main",
    "org/repo/release/1.2",
    "dots.in.the.name",
    "trailing.dot.",
    "ünïcødé/主干",
    "emoji-🚀/main",
    "colon:at@percent%2Fplus+equals=",
    "under_score-dash~tilde",
    "UPPER/lower",
    "x" * 200,
)

# URIs as ingest sees them: URLs, scp-like remotes, escapes, unicode, a long one.
ODD_URIS = (
    "https://example.com/org/repo.git?ref=main#0123abcd",
    "git@github.com:org/repo.git@0123456789abcdef0123456789abcdef01234567",
    "file:///srv/git/repo%20with%20escapes",
    "ünïcødé://коммит/主干",
    "a.b.c...d",
    "u" * 1000,
)


def _request(queue: str, n: int, uri: str = "uri-1", **changes: object) -> Request:
    return dataclasses.replace(
        Request(id=format_request_id(queue, n), queue=queue, uri=uri, state="accepted"), **changes
    )


class StoreContract:
    """Contract tests for RequestStore, QueueStore, UriIndex and Counter."""

    def test_odd_names_are_valid_queue_names(self) -> None:
        # Guard for the suite itself: the names must be odd but *storable*.
        for name in ODD_QUEUE_NAMES:
            assert validate_stored_queue_name(name) == name

    # -- RequestStore -------------------------------------------------------------

    async def test_request_create_get_round_trip(self, request_store: RequestStore) -> None:
        request = _request("monorepo/main", 1, uri="commit-a")
        await request_store.create(request)
        assert await request_store.get(request.id) == request

    async def test_request_get_missing_raises_not_found(self, request_store: RequestStore) -> None:
        with pytest.raises(NotFound):
            await request_store.get(format_request_id("monorepo/main", 404))

    async def test_request_get_many_returns_the_stored_ones_by_id(
        self, request_store: RequestStore
    ) -> None:
        queue = "monorepo/main"
        stored = [_request(queue, n, uri=f"commit-{n}") for n in (2, 5, 1000)]
        for request in stored:
            await request_store.create(request)
        updated = dataclasses.replace(stored[1], state="processing")
        await request_store.update(updated, updated.version, updated.version + 1)
        # As many ids as a decision reads at once, most of them never written.
        ids = [format_request_id(queue, n) for n in range(1, 1025)] + ["request/other/q/2"]
        found = await request_store.get_many(ids)
        assert dict(found) == {
            stored[0].id: stored[0],
            stored[1].id: dataclasses.replace(updated, version=updated.version + 1),
            stored[2].id: stored[2],
        }
        assert dict(await request_store.get_many([])) == {}
        assert dict(await request_store.get_many([stored[0].id, stored[0].id])) == {
            stored[0].id: stored[0]
        }

    async def test_request_create_existing_raises_and_keeps_first(
        self, request_store: RequestStore
    ) -> None:
        first = _request("monorepo/main", 1, uri="commit-a")
        await request_store.create(first)
        with pytest.raises(AlreadyExists):
            await request_store.create(dataclasses.replace(first, uri="commit-b"))
        assert await request_store.get(first.id) == first

    async def test_request_update_missing_raises_not_found(
        self, request_store: RequestStore
    ) -> None:
        with pytest.raises(NotFound):
            await request_store.update(_request("monorepo/main", 7), 1, 2)
        with pytest.raises(NotFound):
            await request_store.get(format_request_id("monorepo/main", 7))

    async def test_request_update_writes_entity_with_new_version(
        self, request_store: RequestStore
    ) -> None:
        request = _request("monorepo/main", 1)
        await request_store.create(request)
        admitted = dataclasses.replace(
            request, state="processing", build_strategy=FULL, base_uri=""
        )
        await request_store.update(admitted, 1, 2)
        assert await request_store.get(request.id) == dataclasses.replace(admitted, version=2)

    async def test_request_update_does_no_version_arithmetic(
        self, request_store: RequestStore
    ) -> None:
        request = _request("monorepo/main", 1)
        await request_store.create(request)
        await request_store.update(request, 1, 5)
        assert (await request_store.get(request.id)).version == 5
        # The guard is now the written version, not old + 1.
        with pytest.raises(VersionMismatch):
            await request_store.update(request, 2, 3)
        await request_store.update(request, 5, 6)
        assert (await request_store.get(request.id)).version == 6

    async def test_request_stale_update_raises_and_keeps_stored_value(
        self, request_store: RequestStore
    ) -> None:
        request = _request("monorepo/main", 1)
        await request_store.create(request)
        winner = dataclasses.replace(request, state="processing")
        await request_store.update(winner, 1, 2)
        loser = dataclasses.replace(request, state="superseded")
        with pytest.raises(VersionMismatch):
            await request_store.update(loser, 1, 2)
        with pytest.raises(VersionMismatch):
            await request_store.update(loser, 3, 4)
        assert await request_store.get(request.id) == dataclasses.replace(winner, version=2)

    async def test_request_update_leaves_callers_value_and_old_snapshots_alone(
        self, request_store: RequestStore
    ) -> None:
        request = _request("monorepo/main", 1)
        await request_store.create(request)
        before = await request_store.get(request.id)
        change = dataclasses.replace(request, state="processing")
        change_copy = dataclasses.replace(change)
        await request_store.update(change, 1, 2)
        # The caller assigns the version itself, after success; the store must not.
        assert change == change_copy
        assert change.version == 1
        assert request.version == 1
        # A snapshot read earlier is a value, not a live view of the key.
        assert before == request
        assert (await request_store.get(request.id)).version == 2

    async def test_request_concurrent_updates_from_same_version_one_wins(
        self, request_store: RequestStore
    ) -> None:
        request = _request("monorepo/main", 1)
        await request_store.create(request)
        a = dataclasses.replace(request, state="processing")
        b = dataclasses.replace(request, state="superseded")
        results = await asyncio.gather(
            request_store.update(a, 1, 2),
            request_store.update(b, 1, 2),
            return_exceptions=True,
        )
        assert sorted(type(r).__name__ for r in results) == ["NoneType", "VersionMismatch"]
        winner = a if results[0] is None else b
        assert await request_store.get(request.id) == dataclasses.replace(winner, version=2)

    @pytest.mark.parametrize("queue", ODD_QUEUE_NAMES)
    async def test_request_odd_queue_names_round_trip(
        self, request_store: RequestStore, queue: str
    ) -> None:
        request = _request(queue, 3, uri=f"uri-of-{queue}")
        await request_store.create(request)
        await request_store.update(dataclasses.replace(request, state="processing"), 1, 2)
        stored = await request_store.get(request.id)
        assert (stored.id, stored.queue, stored.state, stored.version) == (
            request.id,
            queue,
            "processing",
            2,
        )

    async def test_requests_of_neighbouring_queues_are_distinct_keys(
        self, request_store: RequestStore
    ) -> None:
        # Encodings that squash '/' or '.' would make these collide.
        queues = ("a/b", "a.b", "a_b", "a-b", "a/b/c", "a/b.c")
        for index, queue in enumerate(queues):
            await request_store.create(_request(queue, 1, uri=f"uri-{index}"))
        for index, queue in enumerate(queues):
            stored = await request_store.get(format_request_id(queue, 1))
            assert (stored.queue, stored.uri) == (queue, f"uri-{index}")

    # -- QueueStore ---------------------------------------------------------------

    async def test_queue_create_get_round_trip(self, queue_store: QueueStore) -> None:
        queue = Queue(
            name="monorepo/main",
            last_green_uri="green-1",
            last_green_request_id=format_request_id("monorepo/main", 1),
            latest_request_id=format_request_id("monorepo/main", 3),
            slot_holders=(format_request_id("monorepo/main", 2),),
        )
        await queue_store.create(queue)
        assert await queue_store.get(queue.name) == queue

    async def test_queue_get_missing_raises_not_found(self, queue_store: QueueStore) -> None:
        with pytest.raises(NotFound):
            await queue_store.get("nobody/here")

    async def test_queue_create_existing_raises_and_keeps_first(
        self, queue_store: QueueStore
    ) -> None:
        first = Queue(name="monorepo/main", last_green_uri="green-1")
        await queue_store.create(first)
        with pytest.raises(AlreadyExists):
            await queue_store.create(Queue(name="monorepo/main"))
        assert await queue_store.get("monorepo/main") == first

    async def test_queue_update_missing_raises_not_found(self, queue_store: QueueStore) -> None:
        with pytest.raises(NotFound):
            await queue_store.update(Queue(name="nobody/here"), 1, 2)

    async def test_queue_cas_claim_and_release(self, queue_store: QueueStore) -> None:
        name = "monorepo/main"
        holder = format_request_id(name, 1)
        await queue_store.create(Queue(name=name))
        row = await queue_store.get(name)
        await queue_store.update(row.with_holder(holder), row.version, row.version + 1)
        claimed = await queue_store.get(name)
        assert (claimed.slot_holders, claimed.in_flight_count, claimed.version) == (
            (holder,),
            1,
            2,
        )
        await queue_store.update(claimed.without_holder(holder), 2, 3)
        released = await queue_store.get(name)
        assert (released.slot_holders, released.version) == ((), 3)

    async def test_queue_stale_update_raises_and_keeps_stored_value(
        self, queue_store: QueueStore
    ) -> None:
        name = "monorepo/main"
        await queue_store.create(Queue(name=name))
        ingest_view = await queue_store.get(name)
        process_view = await queue_store.get(name)
        stamped = dataclasses.replace(ingest_view, latest_request_id=format_request_id(name, 9))
        await queue_store.update(stamped, 1, 2)
        with pytest.raises(VersionMismatch):
            await queue_store.update(process_view.with_holder(format_request_id(name, 8)), 1, 2)
        assert await queue_store.get(name) == dataclasses.replace(stamped, version=2)

    async def test_queue_concurrent_updates_from_same_version_one_wins(
        self, queue_store: QueueStore
    ) -> None:
        name = "monorepo/main"
        await queue_store.create(Queue(name=name))
        row = await queue_store.get(name)
        writers = [row.with_holder(format_request_id(name, n)) for n in range(1, 6)]
        results = await asyncio.gather(
            *(queue_store.update(w, 1, 2) for w in writers), return_exceptions=True
        )
        winners = [w for w, r in zip(writers, results, strict=True) if r is None]
        losers = [r for r in results if r is not None]
        assert len(winners) == 1
        assert all(isinstance(r, VersionMismatch) for r in losers)
        assert len(losers) == 4
        assert await queue_store.get(name) == dataclasses.replace(winners[0], version=2)

    @pytest.mark.parametrize("name", ODD_QUEUE_NAMES)
    async def test_queue_odd_names_round_trip(self, queue_store: QueueStore, name: str) -> None:
        queue = Queue(name=name, latest_request_id=format_request_id(name, 1))
        await queue_store.create(queue)
        assert await queue_store.get(name) == queue
        await queue_store.update(queue.with_holder(queue.latest_request_id), 1, 2)
        assert (await queue_store.get(name)).slot_holders == (queue.latest_request_id,)

    async def test_queues_with_similar_names_are_distinct_keys(
        self, queue_store: QueueStore
    ) -> None:
        names = ("a/b", "a.b", "a_b", "a-b", "A/b", "a/b/c")
        for index, name in enumerate(names):
            await queue_store.create(Queue(name=name, last_green_uri=f"green-{index}"))
        for index, name in enumerate(names):
            assert (await queue_store.get(name)).last_green_uri == f"green-{index}"

    # -- UriIndex -----------------------------------------------------------------

    async def test_uri_index_get_missing_is_none(self, uri_index: UriIndex) -> None:
        assert await uri_index.get("monorepo/main", "commit-a") is None

    async def test_uri_index_first_put_wins(self, uri_index: UriIndex) -> None:
        queue = "monorepo/main"
        first, second = format_request_id(queue, 1), format_request_id(queue, 2)
        assert await uri_index.put_if_absent(queue, "commit-a", first) == first
        assert await uri_index.put_if_absent(queue, "commit-a", second) == first
        assert await uri_index.get(queue, "commit-a") == first

    async def test_uri_index_repoint_replaces_only_the_expected_id(
        self, uri_index: UriIndex
    ) -> None:
        queue = "monorepo/main"
        first, back, late = (format_request_id(queue, n) for n in (1, 5, 6))
        await uri_index.put_if_absent(queue, "commit-a", first)
        assert await uri_index.repoint(queue, "commit-a", first, back) == back
        assert await uri_index.get(queue, "commit-a") == back
        # A second return that read the old id loses to the first and learns its id.
        assert await uri_index.repoint(queue, "commit-a", first, late) == back
        assert await uri_index.get(queue, "commit-a") == back
        # An absent entry is simply created.
        assert await uri_index.repoint(queue, "commit-z", first, late) == late

    async def test_uri_index_is_per_queue_and_per_uri(self, uri_index: UriIndex) -> None:
        main, release = "monorepo/main", "monorepo/release"
        assert await uri_index.put_if_absent(main, "c", format_request_id(main, 1)) == (
            format_request_id(main, 1)
        )
        assert await uri_index.put_if_absent(release, "c", format_request_id(release, 1)) == (
            format_request_id(release, 1)
        )
        assert await uri_index.put_if_absent(main, "d", format_request_id(main, 2)) == (
            format_request_id(main, 2)
        )
        assert await uri_index.get(main, "c") == format_request_id(main, 1)
        assert await uri_index.get(release, "c") == format_request_id(release, 1)
        assert await uri_index.get(release, "d") is None

    async def test_uri_index_concurrent_puts_agree_on_one_id(self, uri_index: UriIndex) -> None:
        queue = "monorepo/main"
        ids = [format_request_id(queue, n) for n in range(1, 9)]
        returned = await asyncio.gather(
            *(uri_index.put_if_absent(queue, "commit-a", rid) for rid in ids)
        )
        assert len(set(returned)) == 1
        assert returned[0] in ids
        assert await uri_index.get(queue, "commit-a") == returned[0]

    @pytest.mark.parametrize("uri", ODD_URIS)
    @pytest.mark.parametrize("queue", ODD_QUEUE_NAMES[:5])
    async def test_uri_index_odd_keys_round_trip(
        self, uri_index: UriIndex, queue: str, uri: str
    ) -> None:
        rid = format_request_id(queue, 1)
        assert await uri_index.put_if_absent(queue, uri, rid) == rid
        assert await uri_index.get(queue, uri) == rid
        assert await uri_index.get(queue, uri + "x") is None

    # -- Counter ------------------------------------------------------------------

    async def test_counter_starts_at_one_and_increments(self, counter: Counter) -> None:
        assert [await counter.next("monorepo/main") for _ in range(5)] == [1, 2, 3, 4, 5]

    async def test_counter_is_per_queue(self, counter: Counter) -> None:
        assert await counter.next("a/b") == 1
        assert await counter.next("a/b") == 2
        assert await counter.next("a.b") == 1
        assert await counter.next("a/b") == 3
        assert await counter.next("a.b") == 2

    async def test_counter_concurrent_values_are_distinct(self, counter: Counter) -> None:
        values = await asyncio.gather(*(counter.next("monorepo/main") for _ in range(25)))
        assert sorted(values) == list(range(1, 26))
        assert await counter.next("monorepo/main") == 26

    @pytest.mark.parametrize("queue", ODD_QUEUE_NAMES)
    async def test_counter_odd_queue_names(self, counter: Counter, queue: str) -> None:
        assert await counter.next(queue) == 1
        assert await counter.next(queue) == 2
        assert await counter.next("monorepo/other") == 1
        assert await counter.next(queue) == 3

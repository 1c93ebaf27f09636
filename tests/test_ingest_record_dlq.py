"""Ingest, record and the dead-letter reconciler: the other writers of Request and Queue.

Process relies on them for three things the spec states outright: ingest dedups on
(queue, uri) and moves ``latest_request_id`` forward only; record and the reconciler
free a slot on every terminal transition; record advances last green monotonically by
ingest order. Each is checked here together with the crash and retry windows between
their writes.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from memory_stages import memory_stages

from stovepipe_fsm.adapters.memory import (
    MemoryCounter,
    MemoryPublisher,
    MemoryQueueStore,
    MemoryRequestStore,
    MemoryUriIndex,
)
from stovepipe_fsm.domain.entities import FULL, Queue, Request
from stovepipe_fsm.domain.errors import NonRetryable, NotYetAdmitted, Retryable, VersionMismatch
from stovepipe_fsm.domain.ids import parse_request_id
from stovepipe_fsm.domain.queue_names import InvalidQueueName
from stovepipe_fsm.pipeline.ingest import Ingest, InvalidUri
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.process.lifecycle import QUEUE_CAS_ATTEMPTS

ROOT = Path(__file__).resolve().parent.parent
MACHINES = load_process_machines(ROOT / "machines")
Q = "monorepo/main"


def rid(n: int, queue: str = Q) -> str:
    return f"request/{queue}/{n}"


class FlakyRequestStore(MemoryRequestStore):
    """Loses the next ``conflicts`` updates to a concurrent writer (version bumped)."""

    def __init__(self) -> None:
        super().__init__()
        self.conflicts = 0

    async def update(self, request: Request, old_version: int, new_version: int) -> None:
        if self.conflicts:
            self.conflicts -= 1
            stored = await self.get(request.id)
            await super().update(stored, stored.version, stored.version + 1)
        await super().update(request, old_version, new_version)


class ContendedQueueStore(MemoryQueueStore):
    """Every update loses while ``contended`` is set."""

    contended = False

    async def update(self, queue: Queue, old_version: int, new_version: int) -> None:
        if self.contended:
            raise VersionMismatch(f"queue {queue.name!r} contended")
        await super().update(queue, old_version, new_version)


@dataclass
class Pipeline:
    requests: FlakyRequestStore = field(default_factory=FlakyRequestStore)
    queues: ContendedQueueStore = field(default_factory=ContendedQueueStore)
    uri_index: MemoryUriIndex = field(default_factory=MemoryUriIndex)
    counter: MemoryCounter = field(default_factory=MemoryCounter)
    publisher: MemoryPublisher = field(default_factory=MemoryPublisher)

    def __post_init__(self) -> None:
        stages = memory_stages(
            MACHINES,
            requests=self.requests,
            queues=self.queues,
            uri_index=self.uri_index,
            counter=self.counter,
            publisher=self.publisher,
        )
        self.lifecycle = stages.lifecycle
        self.ingester = stages.ingest
        self.record = stages.record
        self.dlq = stages.reconciler

    async def queue(self, name: str = Q) -> Queue:
        return await self.queues.get(name)

    async def request(self, n: int, queue: str = Q) -> Request:
        return await self.requests.get(rid(n, queue))

    async def admit(self, n: int, strategy: str = FULL, base: str = "") -> Request:
        """What process does on admit: claim the slot, then mark processing."""
        request = await self.request(n)
        await self.lifecycle.claim_slot(await self.queue(request.queue), request, "admit")
        return await self.lifecycle.apply(request, "admit", build_strategy=strategy, base_uri=base)

    def processes(self) -> list[str]:
        return [p.request_id for p in self.publisher.processes()]


# --- ingest -------------------------------------------------------------------------


async def test_first_ingest_creates_queue_request_pointer_and_message() -> None:
    p = Pipeline()
    result = await p.ingester.ingest(Q, "A")
    assert (result.request_id, result.created, result.published) == (rid(1), True, True)
    assert await p.request(1) == Request(id=rid(1), queue=Q, uri="A", state="accepted")
    queue = await p.queue()
    assert (queue.latest_request_id, queue.in_flight_count, queue.last_green_uri) == (
        rid(1),
        0,
        "",
    )
    assert p.processes() == [rid(1)]


async def test_a_return_to_a_head_trunk_had_left_is_a_new_head_only_when_seen_at_the_ref() -> None:
    """A validated, trunk moved to B, then a force-push put A back. A late event for A
    (no ``at_head``) changes nothing; the poller's observation of A at the ref ingests it
    as a new head: the newest request, so B is coalesced away and A is validated again."""
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    await p.admit(1)
    await p.record.complete(rid(1), "succeeded")
    await p.ingester.ingest(Q, "B")

    late = await p.ingester.ingest(Q, "A")
    assert (late.request_id, late.created, late.published) == (rid(1), False, False)
    assert (await p.queue()).latest_request_id == rid(2), "a late event never moves latest back"

    back = await p.ingester.ingest(Q, "A", at_head=True)
    assert (back.request_id, back.created, back.published, back.returned) == (
        rid(3),
        True,
        True,
        True,
    )
    assert await p.request(3) == Request(id=rid(3), queue=Q, uri="A", state="accepted")
    assert (await p.queue()).latest_request_id == rid(3)
    assert await p.uri_index.get(Q, "A") == rid(3)
    assert (await p.request(1)).state == "succeeded", "the first validation stays as it was"
    # Seen at the ref again while it is the latest: the same head, nothing new.
    again = await p.ingester.ingest(Q, "A", at_head=True)
    assert (again.request_id, again.created, again.returned) == (rid(3), False, False)
    assert p.processes() == [rid(1), rid(2), rid(3), rid(3)]  # the waiting A3 is re-published


async def test_the_head_at_the_ref_that_is_still_the_latest_is_never_ingested_twice() -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    await p.admit(1)
    result = await p.ingester.ingest(Q, "A", at_head=True)
    assert (result.request_id, result.created, result.published) == (rid(1), False, False)
    assert p.counter.peek(Q) == 1


async def test_reingest_returns_the_same_id_and_creates_nothing() -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    before = (p.requests.snapshot(), p.queues.snapshot(), p.uri_index.snapshot())
    again = await p.ingester.ingest(Q, "A")
    assert (again.request_id, again.created) == (rid(1), False)
    assert (p.requests.snapshot(), p.queues.snapshot(), p.uri_index.snapshot()) == before
    assert p.counter.peek(Q) == 1, "a re-ingest must not spend a counter value"


async def test_same_uri_in_two_queues_is_two_requests() -> None:
    p = Pipeline()
    a = await p.ingester.ingest(Q, "A")
    b = await p.ingester.ingest("mobile/ios", "A")
    assert (a.request_id, b.request_id) == (rid(1), rid(1, "mobile/ios"))
    assert len(p.requests) == 2


async def test_latest_request_id_only_moves_forward() -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    await p.ingester.ingest(Q, "B")
    # A is still accepted: its re-ingest re-publishes but must not pull the pointer back.
    again = await p.ingester.ingest(Q, "A")
    assert again.published
    assert (await p.queue()).latest_request_id == rid(2)
    await p.ingester.ingest(Q, "C")
    assert (await p.queue()).latest_request_id == rid(3)


async def test_latest_request_id_compares_by_counter_not_by_text() -> None:
    """request/q/10 is newer than request/q/9 although it sorts before it as a string."""
    p = Pipeline()
    for n in range(1, 11):
        await p.ingester.ingest(Q, f"C{n}")
    assert (await p.queue()).latest_request_id == rid(10)
    await p.ingester.ingest(Q, "C9")
    assert (await p.queue()).latest_request_id == rid(10)


async def test_reingest_of_an_accepted_uri_heals_a_lost_publish() -> None:
    p = Pipeline()
    p.publisher.fail_next("process")
    with pytest.raises(Retryable):
        await p.ingester.ingest(Q, "A")
    # Everything before the publish is durable, so the consumer will find it ...
    assert (await p.request(1)).state == "accepted"
    assert (await p.queue()).latest_request_id == rid(1)
    assert p.processes() == []
    # ... and the poller's next report of the same head publishes it.
    again = await p.ingester.ingest(Q, "A")
    assert (again.request_id, again.created, again.published) == (rid(1), False, True)
    assert p.processes() == [rid(1)]


async def test_ingest_heals_a_crash_between_the_index_claim_and_the_request_create() -> None:
    p = Pipeline()
    await p.uri_index.put_if_absent(Q, "A", rid(7))
    result = await p.ingester.ingest(Q, "A")
    assert result.request_id == rid(7)
    assert (await p.request(7)).uri == "A"
    assert (await p.queue()).latest_request_id == rid(7)
    assert p.processes() == [rid(7)]


@pytest.mark.parametrize("state", ["superseded", "processing", "succeeded", "failed"])
async def test_reingest_past_accepted_publishes_nothing(state: str) -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    stored = await p.request(1)
    await p.requests.update(replace(stored, state=state), stored.version, stored.version + 1)
    result = await p.ingester.ingest(Q, "A")
    assert (result.request_id, result.published) == (rid(1), False)
    assert p.processes() == [rid(1)]
    assert (await p.request(1)).state == state


@pytest.mark.parametrize("uri", ["", " A", "A\nB", "x" * 1025, None])
async def test_invalid_uri_writes_nothing(uri: object) -> None:
    p = Pipeline()
    with pytest.raises(InvalidUri):
        await p.ingester.ingest(Q, uri)  # type: ignore[arg-type]
    assert len(p.requests) == 0 and len(p.queues) == 0 and p.publisher.records == ()


async def test_invalid_queue_name_writes_nothing() -> None:
    p = Pipeline()
    with pytest.raises(InvalidQueueName):
        await p.ingester.ingest("bad queue", "A")
    assert len(p.requests) == 0 and len(p.queues) == 0


# --- record -------------------------------------------------------------------------


async def test_success_frees_the_slot_and_advances_last_green() -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    await p.admit(1)
    request = await p.record.complete(rid(1), "succeeded")
    assert request.state == "succeeded"
    queue = await p.queue()
    assert (queue.slot_holders, queue.last_green_uri, queue.last_green_request_id) == (
        (),
        "A",
        rid(1),
    )


@pytest.mark.parametrize("outcome", ["failed", "cancelled"])
async def test_failure_and_cancel_free_the_slot_and_keep_last_green(outcome: str) -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    await p.admit(1)
    await p.record.complete(rid(1), "succeeded")
    await p.ingester.ingest(Q, "B")
    await p.admit(2)
    request = await p.record.complete(rid(2), outcome)
    assert request.state == outcome
    queue = await p.queue()
    assert (queue.slot_holders, queue.last_green_uri) == ((), "A")


async def test_a_late_green_of_an_older_head_never_moves_last_green_back() -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    await p.admit(1)
    await p.ingester.ingest(Q, "B")
    await p.admit(2)
    await p.record.complete(rid(2), "succeeded")
    await p.record.complete(rid(1), "succeeded")
    queue = await p.queue()
    assert (queue.last_green_uri, queue.last_green_request_id) == ("B", rid(2))
    assert queue.slot_holders == ()


async def test_recording_the_same_outcome_again_is_idempotent() -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    await p.admit(1)
    first = await p.record.complete(rid(1), "succeeded")
    queue = await p.queue()
    again = await p.record.complete(rid(1), "succeeded")
    assert again == first
    assert await p.request(1) == first
    assert await p.queue() == queue, "a repeated record must not write the queue row"


@pytest.mark.parametrize(
    ("first", "second"),
    [("succeeded", "failed"), ("failed", "cancelled"), ("cancelled", "succeeded")],
)
async def test_recording_another_outcome_on_a_terminal_request_fails(
    first: str, second: str
) -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    await p.admit(1)
    await p.record.complete(rid(1), first)
    with pytest.raises(NonRetryable, match=f"already {first}; cannot record {second}"):
        await p.record.complete(rid(1), second)
    assert (await p.request(1)).state == first


async def test_recording_on_a_superseded_request_fails() -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    await p.lifecycle.apply(await p.request(1), "supersede")
    with pytest.raises(NonRetryable, match="already superseded"):
        await p.record.complete(rid(1), "succeeded")


async def test_recording_before_admit_is_not_applied_and_retryable() -> None:
    """An outcome for a head not yet admitted is early, not wrong: retried, never applied
    to the accepted head."""
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    with pytest.raises(NotYetAdmitted, match="is accepted, not yet admitted; succeeded is kept"):
        await p.record.complete(rid(1), "succeeded")
    assert (await p.request(1)).state == "accepted"


async def test_unknown_outcome_is_rejected() -> None:
    p = Pipeline()
    with pytest.raises(ValueError, match="outcome 'green'"):
        await p.record.complete(rid(1), "green")


async def test_repeated_record_finishes_a_crash_between_its_two_writes() -> None:
    """Request written succeeded, queue row not yet: the retry frees and advances."""
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    admitted = await p.admit(1)
    await p.requests.update(
        replace(admitted, state="succeeded"), admitted.version, admitted.version + 1
    )
    assert (await p.queue()).slot_holders == (rid(1),)
    await p.record.complete(rid(1), "succeeded")
    queue = await p.queue()
    assert (queue.slot_holders, queue.last_green_uri) == ((), "A")


async def test_record_under_permanent_queue_contention_gives_up_retryably() -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    await p.admit(1)
    p.queues.contended = True
    with pytest.raises(Retryable, match=f"gave up after {QUEUE_CAS_ATTEMPTS} CAS"):
        await p.record.complete(rid(1), "succeeded")
    p.queues.contended = False
    await p.record.complete(rid(1), "succeeded")
    assert (await p.queue()).slot_holders == ()


# --- dead-letter reconciler -----------------------------------------------------------


async def test_reconciler_fails_a_processing_request_and_frees_its_slot() -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    admitted = await p.admit(1)
    request = await p.dlq.reconcile(rid(1))
    assert request is not None
    assert (request.state, request.build_strategy) == ("failed", admitted.build_strategy)
    queue = await p.queue()
    assert (queue.slot_holders, queue.last_green_uri) == ((), "")


async def test_reconciler_frees_the_slot_of_an_accepted_holder() -> None:
    """Crash after the slot claim: accepted but holding; failing it closed frees it."""
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    await p.lifecycle.claim_slot(await p.queue(), await p.request(1), "admit")
    assert (await p.queue()).slot_holders == (rid(1),)
    request = await p.dlq.reconcile(rid(1))
    assert request is not None and request.state == "failed"
    assert (await p.queue()).slot_holders == ()


async def test_reconciler_on_an_accepted_non_holder_leaves_the_slots_alone() -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    await p.admit(1)
    await p.ingester.ingest(Q, "B")
    request = await p.dlq.reconcile(rid(2))
    assert request is not None and request.state == "failed"
    assert (await p.queue()).slot_holders == (rid(1),)


async def test_reconciler_on_a_terminal_request_only_releases_a_leftover_slot() -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    admitted = await p.admit(1)
    done = replace(admitted, state="succeeded")
    await p.requests.update(done, admitted.version, admitted.version + 1)
    request = await p.dlq.reconcile(rid(1))
    assert request is not None and request.state == "succeeded"
    assert (await p.queue()).slot_holders == ()
    # Once more: nothing left to do, nothing written.
    queue = await p.queue()
    await p.dlq.reconcile(rid(1))
    assert await p.queue() == queue
    assert (await p.request(1)).state == "succeeded"


async def test_reconciler_of_a_missing_request_returns_none() -> None:
    assert await Pipeline().dlq.reconcile(rid(1)) is None


async def test_reconciler_retries_a_request_that_changes_underneath() -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    await p.admit(1)
    p.requests.conflicts = 2
    request = await p.dlq.reconcile(rid(1))
    assert request is not None and request.state == "failed"
    assert (await p.queue()).slot_holders == ()


async def test_reconciler_gives_up_when_the_request_never_settles() -> None:
    p = Pipeline()
    await p.ingester.ingest(Q, "A")
    p.requests.conflicts = 1_000
    with pytest.raises(VersionMismatch, match="kept changing"):
        await p.dlq.reconcile(rid(1))


class Crashed(Exception):
    """The ingesting process died here: this write and everything after it is lost."""


@dataclass
class Budget:
    writes_left: int

    def spend(self) -> None:
        if self.writes_left == 0:
            raise Crashed
        self.writes_left -= 1


def crashing_pipeline(budget: Budget) -> Pipeline:
    """A pipeline whose every broker write first spends one unit of ``budget``."""

    class Requests(FlakyRequestStore):
        async def create(self, request: Request) -> None:
            budget.spend()
            await super().create(request)

    class Queues(ContendedQueueStore):
        async def create(self, queue: Queue) -> None:
            budget.spend()
            await super().create(queue)

        async def update(self, queue: Queue, old_version: int, new_version: int) -> None:
            budget.spend()
            await super().update(queue, old_version, new_version)

    class Uris(MemoryUriIndex):
        async def put_if_absent(self, queue: str, uri: str, request_id: str) -> str:
            budget.spend()
            return await super().put_if_absent(queue, uri, request_id)

    class Counter(MemoryCounter):
        async def reserve(self, queue: str, count: int) -> int:
            budget.spend()
            return await super().reserve(queue, count)

    class Publisher(MemoryPublisher):
        async def publish_process(self, queue: str, request_id: str, partition: int = 0) -> None:
            budget.spend()
            await super().publish_process(queue, request_id, partition)

    return Pipeline(
        requests=Requests(),
        queues=Queues(),
        uri_index=Uris(),
        counter=Counter(),
        publisher=Publisher(),
    )


@pytest.mark.parametrize("earlier_head", [False, True])
@pytest.mark.parametrize("crash_after", range(6))
async def test_a_crash_at_any_write_of_an_ingest_is_healed_by_the_next_ingest(
    crash_after: int, earlier_head: bool
) -> None:
    """Every guarantee holds after a crash at each write of a new head's ingest and a
    re-ingest by a restarted ingester (which remembers nothing)."""
    budget = Budget(writes_left=-1)
    p = crashing_pipeline(budget)
    if earlier_head:
        await p.ingester.ingest(Q, "before")
    budget.writes_left = crash_after
    with contextlib.suppress(Crashed):
        await p.ingester.ingest(Q, "A")
    budget.writes_left = -1
    restarted = replace_ingester(p)
    result = await restarted.ingest(Q, "A")
    again = await restarted.ingest(Q, "A")
    assert again.request_id == result.request_id and not again.created
    request = await p.requests.get(result.request_id)
    assert (request.uri, request.state) == ("A", "accepted")
    assert await p.uri_index.get(Q, "A") == result.request_id
    assert (await p.queue()).latest_request_id == result.request_id
    assert result.request_id in p.processes()
    if earlier_head:
        first = await p.uri_index.get(Q, "before")
        assert first is not None
        assert parse_request_id(first).counter < parse_request_id(result.request_id).counter
    # A newer head after the healed one still gets a larger id.
    newer = await restarted.ingest(Q, "B")
    assert parse_request_id(newer.request_id).counter > parse_request_id(result.request_id).counter
    assert (await p.queue()).latest_request_id == newer.request_id


def replace_ingester(p: Pipeline) -> Ingest:
    old = p.ingester
    return Ingest(
        initial_state=old.initial_state,
        requests=old.requests,
        queues=old.queues,
        publisher=old.publisher,
        uri_index=old.uri_index,
        counter=old.counter,
        clock=old.clock,
        trail=old.trail,
    )

"""The process controller on in-memory adapters, one delivery at a time.

These cover what a timeline cannot express: rows seeded in states ingest would never
leave behind (missing rows, an unstamped latest pointer, a head equal to the last green,
a terminal slot holder), injected publish failures and compare-and-set races, and the
exact shape and ordering of what gets published.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from memory_stages import memory_stages, settled

from stovepipe_fsm.adapters.memory import (
    ACKED,
    HELD,
    ManualClock,
    MemoryDelivery,
    MemoryPublisher,
    MemoryQueueStore,
    MemoryRequestStore,
    MemorySourceControl,
    MemorySourceControlProvider,
)
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.domain.entities import FULL, INCREMENTAL_SINCE_GREEN, Queue, QueueConfig, Request
from stovepipe_fsm.domain.errors import NonRetryable, Retryable
from stovepipe_fsm.domain.hooks import HookEvent, admission_event_id
from stovepipe_fsm.ports.config import ConfigStore
from stovepipe_fsm.process.catalog import ProcessMachines, load_process_machines

ROOT = Path(__file__).resolve().parent.parent
MACHINES = load_process_machines(ROOT / "machines")
Q = "monorepo/main"


def rid(n: int, queue: str = Q) -> str:
    return f"request/{queue}/{n}"


class RacingQueueStore(MemoryQueueStore):
    """A queue store where another writer gets in just before the next update.

    ``race`` is applied to the stored row (version bumped) right before the caller's
    compare-and-set, which then loses exactly as it would against a real backend.
    """

    def __init__(self) -> None:
        super().__init__()
        self.races: list[Callable[[Queue], Queue]] = []
        self.updates = 0

    async def update(self, queue: Queue, old_version: int, new_version: int) -> None:
        self.updates += 1
        if self.races:
            race = self.races.pop(0)
            current = await self.get(queue.name)
            await super().update(race(current), current.version, current.version + 1)
        await super().update(queue, old_version, new_version)


class MutableConfigStore:
    """A config store whose knobs a test changes between deliveries."""

    def __init__(self, config: QueueConfig) -> None:
        self.config = config

    def get(self, queue: str) -> QueueConfig:
        return self.config

    def configured_queues(self) -> tuple[str, ...]:
        return ()


@dataclass
class Stage:
    """A controller wired to in-memory adapters a test can seed and inspect."""

    machines: ProcessMachines = MACHINES
    config: ConfigStore = field(
        default_factory=lambda: StaticConfigStore(
            QueueConfig.of(max_concurrent=1, gate_wait_delay_ms=1000)
        )
    )
    history: dict[str, list[str]] = field(default_factory=dict)
    with_source_control: bool = True
    requests: MemoryRequestStore = field(default_factory=MemoryRequestStore)
    queues: MemoryQueueStore = field(default_factory=RacingQueueStore)
    publisher: MemoryPublisher = field(default_factory=MemoryPublisher)
    clock: ManualClock = field(default_factory=lambda: ManualClock(1_000))

    def __post_init__(self) -> None:
        self.graph = MemorySourceControl(self.history)
        provider = MemorySourceControlProvider(
            default=self.graph if self.with_source_control else None
        )
        self.controller = memory_stages(
            self.machines,
            requests=self.requests,
            queues=self.queues,
            config=self.config,
            source_control=provider,
            publisher=self.publisher,
            clock=self.clock,
        ).controller

    async def seed(self, queue: Queue, *requests: Request) -> None:
        await self.queues.create(queue)
        for request in requests:
            await self.requests.create(request)

    async def deliver(self, request_id: str, queue: str = Q) -> MemoryDelivery:
        return await settled(self.controller, MemoryDelivery(queue, request_id))

    async def request(self, n: int) -> Request:
        return await self.requests.get(rid(n))

    async def queue(self, name: str = Q) -> Queue:
        return await self.queues.get(name)

    def hooks(self) -> list[HookEvent]:
        return [p.event() for p in self.publisher.hooks()]

    def builds(self) -> list[str]:
        return [p.request_id for p in self.publisher.builds()]


def accepted(n: int, uri: str, queue: str = Q) -> Request:
    return Request(id=rid(n, queue), queue=queue, uri=uri, state="accepted")


# --- step 1: load -------------------------------------------------------------------


async def test_missing_request_is_non_retryable() -> None:
    stage = Stage()
    await stage.seed(Queue(Q, latest_request_id=rid(1)))
    delivery = MemoryDelivery(Q, rid(1))
    with pytest.raises(NonRetryable, match="not found"):
        await stage.controller.handle(delivery)
    assert delivery.outcome is None
    assert stage.publisher.records == ()


async def test_request_of_another_queue_is_non_retryable() -> None:
    stage = Stage()
    other = "mobile/ios"
    await stage.seed(Queue(other, latest_request_id=rid(1, other)), accepted(1, "A", other))
    await stage.queues.create(Queue(Q))
    delivery = MemoryDelivery(Q, rid(1, other))
    with pytest.raises(NonRetryable, match="belongs to queue 'mobile/ios'"):
        await stage.controller.handle(delivery)
    assert delivery.outcome is None
    assert (await stage.requests.get(rid(1, other))).state == "accepted"
    assert (await stage.queue(other)).slot_holders == ()


async def test_missing_queue_row_is_non_retryable() -> None:
    stage = Stage()
    await stage.requests.create(accepted(1, "A"))
    delivery = MemoryDelivery(Q, rid(1))
    with pytest.raises(NonRetryable, match="queue row 'monorepo/main' not found"):
        await stage.controller.handle(delivery)
    assert delivery.outcome is None
    assert (await stage.request(1)).state == "accepted"
    assert stage.publisher.records == ()


# --- steps 2-3: terminal and processing ---------------------------------------------


@pytest.mark.parametrize("state", ["superseded", "succeeded", "failed", "cancelled"])
async def test_terminal_request_is_acked_without_any_write(state: str) -> None:
    stage = Stage()
    request = Request(id=rid(1), queue=Q, uri="A", state=state, version=3)
    # Record finished: the green end already advanced last green.
    green = {"last_green_uri": "A", "last_green_request_id": rid(1)} if state == "succeeded" else {}
    await stage.seed(Queue(Q, latest_request_id=rid(1), version=7, **green), request)
    delivery = await stage.deliver(rid(1))
    assert delivery.outcome == ACKED
    assert await stage.request(1) == request
    assert (await stage.queue()).version == 7
    assert stage.publisher.records == ()


async def test_a_redelivered_green_request_finishes_the_end_record_did_not_write() -> None:
    """Record wrote the request succeeded but not the queue row: the slot is freed and last
    green advanced by the process redelivery, in one write, as record would have."""
    stage = Stage()
    ended = Request(id=rid(1), queue=Q, uri="A", state="succeeded", build_strategy=FULL, version=3)
    await stage.seed(Queue(Q, latest_request_id=rid(1), slot_holders=(rid(1),), version=7), ended)
    delivery = await stage.deliver(rid(1))
    assert delivery.outcome == ACKED
    queue = await stage.queue()
    assert (queue.slot_holders, queue.last_green_uri, queue.version) == ((), "A", 8)


async def test_a_head_gated_between_records_two_writes_builds_on_the_new_green(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A succeeded (request written, queue row not yet) while B waits for the only slot:
    the gate finishes A's end (slot and last green) and admits B incrementally on A,
    with no warning: the window is in progress, not damage."""
    stage = Stage(history={"A": [], "B": ["A"]})
    ended = Request(id=rid(1), queue=Q, uri="A", state="succeeded", build_strategy=FULL, version=3)
    await stage.seed(
        Queue(Q, latest_request_id=rid(2), slot_holders=(rid(1),)), ended, accepted(2, "B")
    )
    with caplog.at_level(logging.INFO):
        delivery = await stage.deliver(rid(2))
    assert delivery.outcome == ACKED
    admitted = await stage.request(2)
    assert (admitted.state, admitted.build_strategy, admitted.base_uri) == (
        "processing",
        INCREMENTAL_SINCE_GREEN,
        "A",
    )
    queue = await stage.queue()
    assert (queue.slot_holders, queue.last_green_uri) == ((rid(2),), "A")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_processing_request_is_never_preempted_by_a_newer_head() -> None:
    stage = Stage()
    running = Request(id=rid(1), queue=Q, uri="A", state="processing", build_strategy=FULL)
    await stage.seed(
        Queue(Q, latest_request_id=rid(2), slot_holders=(rid(1),)),
        running,
        accepted(2, "B"),
    )
    delivery = await stage.deliver(rid(1))
    assert delivery.outcome == ACKED
    assert (await stage.request(1)).state == "processing"
    assert stage.builds() == [rid(1)]
    assert [h.payload["request_id"] for h in stage.hooks()] == [rid(1)]


async def test_strategy_and_base_are_not_rederived_on_redelivery() -> None:
    """Last green moved after admit: a redelivery keeps the admitted strategy and base."""
    stage = Stage(history={"A": [], "B": ["A"], "C": ["B"]})
    admitted = Request(id=rid(2), queue=Q, uri="C", state="processing", build_strategy=FULL)
    await stage.seed(
        Queue(Q, last_green_uri="B", latest_request_id=rid(2), slot_holders=(rid(2),)),
        admitted,
    )
    delivery = await stage.deliver(rid(2))
    assert delivery.outcome == ACKED
    assert await stage.request(2) == admitted
    assert stage.graph.calls == 0, "a processing request must not ask source control again"
    assert stage.builds() == [rid(2)]


# --- step 5: coalesce ---------------------------------------------------------------


@pytest.mark.parametrize("latest", ["", "request/monorepo/main/1"])
async def test_unstamped_latest_holds_and_never_admits(latest: str) -> None:
    """latest_request_id empty or older than R: ingest has not stamped R yet."""
    stage = Stage()
    await stage.seed(Queue(Q, latest_request_id=latest), accepted(2, "B"))
    delivery = await stage.deliver(rid(2))
    assert delivery.outcome == HELD
    assert delivery.delay_ms == 1000
    assert (await stage.request(2)).state == "accepted"
    assert (await stage.queue()).slot_holders == ()
    assert stage.publisher.records == ()


async def test_stale_head_is_superseded_and_names_the_newer_head() -> None:
    stage = Stage()
    await stage.seed(Queue(Q, latest_request_id=rid(3)), accepted(2, "B"), accepted(3, "C"))
    delivery = await stage.deliver(rid(2))
    assert delivery.outcome == ACKED
    superseded = await stage.request(2)
    assert superseded.state == "superseded"
    assert superseded.superseded_by == rid(3)
    assert superseded.build_strategy == ""
    assert (await stage.queue()).slot_holders == ()
    assert stage.publisher.records == ()


# --- step 6: gate -------------------------------------------------------------------


async def test_gate_reads_max_concurrent_at_check_time() -> None:
    config = MutableConfigStore(QueueConfig.of(max_concurrent=1, gate_wait_delay_ms=250))
    stage = Stage(config=config)
    running = Request(id=rid(1), queue=Q, uri="A", state="processing", build_strategy=FULL)
    await stage.seed(
        Queue(Q, latest_request_id=rid(2), slot_holders=(rid(1),)), running, accepted(2, "B")
    )
    held = await stage.deliver(rid(2))
    assert (held.outcome, held.delay_ms) == (HELD, 250)
    config.config = QueueConfig.of(max_concurrent=2, gate_wait_delay_ms=250)
    admitted = await stage.deliver(rid(2))
    assert admitted.outcome == ACKED
    assert (await stage.queue()).slot_holders == (rid(1), rid(2))


async def test_accepted_holder_of_an_older_request_keeps_the_gate_closed() -> None:
    """An older head mid-admit (crashed after its claim) still counts: it is not stale
    until its own redelivery supersedes it, so the newer head waits rather than
    overrunning max_concurrent."""
    stage = Stage()
    await stage.seed(
        Queue(Q, latest_request_id=rid(2), slot_holders=(rid(1),)),
        accepted(1, "A"),
        accepted(2, "B"),
    )
    delivery = await stage.deliver(rid(2))
    assert delivery.outcome == HELD
    assert (await stage.queue()).slot_holders == (rid(1),)
    # The older head's own redelivery supersedes it and frees the slot ...
    assert (await stage.deliver(rid(1))).outcome == ACKED
    assert (await stage.request(1)).state == "superseded"
    assert (await stage.queue()).slot_holders == ()
    # ... and the newer head is admitted at its next re-check.
    assert (await stage.deliver(rid(2))).outcome == ACKED
    assert (await stage.queue()).slot_holders == (rid(2),)


async def test_terminal_holder_left_by_a_crash_is_released_at_the_gate() -> None:
    """A crash between a terminal write and its slot release leaves a terminal holder;
    the gate reclaims it instead of waiting on it forever."""
    stage = Stage()
    done = Request(id=rid(1), queue=Q, uri="A", state="succeeded", build_strategy=FULL)
    await stage.seed(
        Queue(Q, latest_request_id=rid(2), slot_holders=(rid(1),)), done, accepted(2, "B")
    )
    delivery = await stage.deliver(rid(2))
    assert delivery.outcome == ACKED
    assert (await stage.request(2)).state == "processing"
    assert (await stage.queue()).slot_holders == (rid(2),)


async def test_own_slot_from_a_crashed_admit_is_reused() -> None:
    stage = Stage()
    await stage.seed(Queue(Q, latest_request_id=rid(1), slot_holders=(rid(1),)), accepted(1, "A"))
    queue_before = await stage.queue()
    delivery = await stage.deliver(rid(1))
    assert delivery.outcome == ACKED
    queue = await stage.queue()
    assert queue.slot_holders == (rid(1),)
    assert queue.version == queue_before.version, "an idempotent claim writes nothing"


# --- step 7a: build strategy --------------------------------------------------------


async def test_cold_start_is_full_without_asking_source_control() -> None:
    stage = Stage(history={"A": []})
    await stage.seed(Queue(Q, latest_request_id=rid(1)), accepted(1, "A"))
    await stage.deliver(rid(1))
    request = await stage.request(1)
    assert (request.build_strategy, request.base_uri) == (FULL, "")
    assert stage.graph.calls == 0


@pytest.mark.parametrize(
    ("history", "head", "strategy", "base"),
    [
        ({"G": [], "H": ["G"]}, "H", INCREMENTAL_SINCE_GREEN, "G"),  # fast-forward
        ({"G": [], "H": []}, "H", FULL, ""),  # rewrite: new root
        ({"G": [], "H": ["G"]}, "G2", FULL, ""),  # head not on the ref
        ({"H": []}, "H", FULL, ""),  # last green not on the ref any more
        ({"G": []}, "G", INCREMENTAL_SINCE_GREEN, "G"),  # head equals last green
    ],
    ids=["fast_forward", "rewrite", "unknown_head", "unknown_green", "head_is_green"],
)
async def test_build_strategy_branches(
    history: dict[str, list[str]], head: str, strategy: str, base: str
) -> None:
    stage = Stage(history=history)
    await stage.seed(Queue(Q, last_green_uri="G", latest_request_id=rid(5)), accepted(5, head))
    delivery = await stage.deliver(rid(5))
    assert delivery.outcome == ACKED
    request = await stage.request(5)
    assert (request.state, request.build_strategy, request.base_uri) == (
        "processing",
        strategy,
        base,
    )
    assert stage.graph.calls == 1


async def test_unknown_ancestry_logs_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    stage = Stage(history={"G": []})
    await stage.seed(Queue(Q, last_green_uri="G", latest_request_id=rid(1)), accepted(1, "X"))
    with caplog.at_level(logging.WARNING, logger="stovepipe_fsm.process"):
        await stage.deliver(rid(1))
    assert any("ancestry of G unknown" in r.getMessage() for r in caplog.records)


async def test_transient_source_control_error_is_raised_raw_and_claims_nothing() -> None:
    stage = Stage(history={"G": [], "H": ["G"]})
    await stage.seed(Queue(Q, last_green_uri="G", latest_request_id=rid(1)), accepted(1, "H"))
    stage.graph.set_available(False)
    delivery = MemoryDelivery(Q, rid(1))
    with pytest.raises(Retryable, match="unavailable"):
        await stage.controller.handle(delivery)
    assert delivery.outcome is None
    assert (await stage.request(1)).state == "accepted"
    assert (await stage.queue()).slot_holders == ()
    assert stage.publisher.records == ()


async def test_queue_without_source_control_builds_full_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stage = Stage(with_source_control=False)
    await stage.seed(
        Queue(Q, last_green_uri="G", latest_request_id=rid(1)), accepted(1, "H"), accepted(2, "I")
    )
    lifecycle = stage.controller.services.lifecycle
    with caplog.at_level(logging.WARNING, logger="stovepipe_fsm.process"):
        await stage.deliver(rid(1))
        await lifecycle.apply(await stage.request(1), "succeed")
        await lifecycle.update_queue(Q, lambda row: replace(row, latest_request_id=rid(2)))
        await stage.deliver(rid(2))
    assert (await stage.request(1)).build_strategy == FULL
    assert (await stage.request(2)).build_strategy == FULL
    warnings = [r for r in caplog.records if "no repository configured" in r.getMessage()]
    assert len(warnings) == 1


# --- step 7b: a lost compare-and-set on the queue row --------------------------------


async def test_lost_slot_claim_reloads_and_admits_once() -> None:
    stage = Stage()
    await stage.seed(Queue(Q, latest_request_id=rid(1)), accepted(1, "A"))
    queues = stage.queues
    assert isinstance(queues, RacingQueueStore)
    # Another writer (say, record moving the bookmark) changes an unrelated field.
    queues.races.append(lambda row: replace(row, last_green_uri="elsewhere"))
    delivery = await stage.deliver(rid(1))
    assert delivery.outcome == ACKED
    assert (await stage.queue()).slot_holders == (rid(1),)
    assert (await stage.request(1)).state == "processing"
    assert stage.builds() == [rid(1)]


async def test_lost_slot_claim_to_a_newer_head_supersedes_on_reload() -> None:
    """Ingest stamps a newer head while R is claiming: the reload re-runs coalesce."""
    stage = Stage()
    await stage.seed(Queue(Q, latest_request_id=rid(1)), accepted(1, "A"), accepted(2, "B"))
    queues = stage.queues
    assert isinstance(queues, RacingQueueStore)
    queues.races.append(lambda row: replace(row, latest_request_id=rid(2)))
    delivery = await stage.deliver(rid(1))
    assert delivery.outcome == ACKED
    assert (await stage.request(1)).state == "superseded"
    assert (await stage.queue()).slot_holders == ()
    assert stage.publisher.records == ()


async def test_queue_row_contended_on_every_claim_gives_up_retryably() -> None:
    stage = Stage()
    await stage.seed(Queue(Q, latest_request_id=rid(1)), accepted(1, "A"))
    queues = stage.queues
    assert isinstance(queues, RacingQueueStore)
    queues.races.extend([lambda row: row] * 1000)
    with pytest.raises(Retryable):
        await stage.controller.handle(MemoryDelivery(Q, rid(1)))
    assert (await stage.request(1)).state == "accepted"
    assert rid(1) not in (await stage.queue()).slot_holders


# --- steps 7c-7e: persist, announce, publish ------------------------------------------


class InspectingPublisher(MemoryPublisher):
    """Records what the request store held at the moment of every publish."""

    def __init__(self, requests: MemoryRequestStore, queues: MemoryQueueStore) -> None:
        super().__init__()
        self.stores = (requests, queues)
        self.seen: list[tuple[str, Request, Queue]] = []

    async def _look(self, kind: str, request_id: str, queue: str) -> None:
        requests, queues = self.stores
        self.seen.append((kind, await requests.get(request_id), await queues.get(queue)))

    async def publish_hook(self, event: HookEvent) -> None:
        await self._look("hook", event.payload["request_id"], event.payload["queue"])
        await super().publish_hook(event)

    async def publish_build(self, queue: str, request_id: str) -> None:
        await self._look("build", request_id, queue)
        await super().publish_build(queue, request_id)


async def test_state_is_persisted_before_the_announce_and_the_build() -> None:
    requests, queues = MemoryRequestStore(), MemoryQueueStore()
    publisher = InspectingPublisher(requests, queues)
    stage = Stage(
        requests=requests, queues=queues, publisher=publisher, history={"G": [], "H": ["G"]}
    )
    await stage.seed(Queue(Q, last_green_uri="G", latest_request_id=rid(1)), accepted(1, "H"))
    await stage.deliver(rid(1))
    assert [kind for kind, _, _ in publisher.seen] == ["hook", "build"]
    for _, request, queue in publisher.seen:
        assert request.state == "processing"
        assert (request.build_strategy, request.base_uri) == (INCREMENTAL_SINCE_GREEN, "G")
        assert queue.holds(rid(1))


async def test_start_event_envelope() -> None:
    stage = Stage()
    await stage.seed(Queue(Q, latest_request_id=rid(1)), accepted(1, "A"))
    await stage.deliver(rid(1))
    (event,) = stage.hooks()
    assert event.as_dict() == {
        "id": admission_event_id(rid(1), (await stage.request(1)).version),
        "source": "stovepipe",
        "type": "validation.repository.started",
        "timestamp_ms": 1_000,
        "version": 1,
        "payload": {"queue": Q, "request_id": rid(1)},
    }


async def test_reannounce_keeps_the_event_id_and_takes_the_current_time() -> None:
    stage = Stage()
    await stage.seed(Queue(Q, latest_request_id=rid(1)), accepted(1, "A"))
    await stage.deliver(rid(1))
    stage.clock.advance(5_000)
    await stage.deliver(rid(1))
    first, second = stage.hooks()
    assert first.id == second.id
    assert (first.timestamp_ms, second.timestamp_ms) == (1_000, 6_000)
    assert (await stage.queue()).slot_holders == (rid(1),)


async def test_failed_announce_publishes_no_build_and_redelivery_recovers() -> None:
    stage = Stage()
    await stage.seed(Queue(Q, latest_request_id=rid(1)), accepted(1, "A"))
    stage.publisher.fail_next("hook")
    delivery = MemoryDelivery(Q, rid(1))
    with pytest.raises(Retryable):
        await stage.controller.handle(delivery)
    assert delivery.outcome is None
    assert (await stage.request(1)).state == "processing"
    assert stage.builds() == []
    assert (await stage.deliver(rid(1))).outcome == ACKED
    assert [h.payload["request_id"] for h in stage.hooks()] == [rid(1)]
    assert stage.builds() == [rid(1)]


async def test_failed_build_publish_is_retried_with_the_same_event_id() -> None:
    stage = Stage()
    await stage.seed(Queue(Q, latest_request_id=rid(1)), accepted(1, "A"))
    stage.publisher.fail_next("build")
    with pytest.raises(Retryable):
        await stage.controller.handle(MemoryDelivery(Q, rid(1)))
    assert stage.builds() == []
    await stage.deliver(rid(1))
    assert stage.builds() == [rid(1)]
    first, second = stage.hooks()
    assert first.id == second.id
    assert (await stage.queue()).slot_holders == (rid(1),)

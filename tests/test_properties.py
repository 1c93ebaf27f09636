"""Invariants of the process stage over random timelines.

Hypothesis drives a :class:`World` (the real controller, ingest, record and dead-letter
reconciler on in-memory adapters) through short random timelines over two queues and a
handful of heads. Every rule is one ``simulate`` step kind: ingests, deliveries, clock
moves, outcomes, duplicates, crashes at every crash point, source-control outages and
dead-letters. After every step the slot bookkeeping and the coalescing guarantees of the
behaviour spec must hold; a failure prints the shrunk steps, which read as a timeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.domain.entities import QueueConfig, Request
from stovepipe_fsm.domain.hooks import VALIDATION_STARTED
from stovepipe_fsm.domain.ids import parse_request_id
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.broker import run_sync
from stovepipe_fsm.simulation.world import ADMIT_CRASH_POINTS, World

ROOT = Path(__file__).resolve().parent.parent
MACHINES = load_process_machines(ROOT / "machines")
QUEUES = ("monorepo/main", "mobile/ios")
HEADS = tuple(f"H{i}" for i in range(6))
DELAY_MS = 1000
TERMINAL = frozenset({"superseded", "succeeded", "failed", "cancelled"})


@st.composite
def histories(draw: st.DrawFn) -> dict[str, list[str]]:
    """A commit graph over HEADS: each head is a root or a child of an earlier head.

    Roots after the first are history rewrites; a head left out of the graph exercises
    ancestry NotFound.
    """
    graph: dict[str, list[str]] = {}
    for index, head in enumerate(HEADS):
        known = [h for h in HEADS[:index] if h in graph]
        choice = draw(st.sampled_from(["child", "child", "child", "root", "absent"]))
        if choice == "absent":
            continue
        if choice == "child" and known:
            graph[head] = [draw(st.sampled_from(known))]
        else:
            graph[head] = []
    return graph


def requests(world: World) -> list[Request]:
    """Every request, in queue then ingest order."""
    return sorted(world.requests.snapshot(), key=lambda r: (r.queue, parse_request_id(r.id)))


def drain(world: World) -> None:
    """Deliver until nothing is due now (the ``run`` step)."""
    for _ in range(1000):
        report = world.deliver_next()
        if report is None:
            return
        event(f"delivery: {report.outcome}")
    raise AssertionError("run did not settle")


@dataclass
class Observed:
    """What earlier steps showed, for invariants about history rather than one state."""

    pinned: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> strategy, base
    terminal: dict[str, str] = field(default_factory=dict)  # id -> terminal state
    newest: dict[str, int] = field(default_factory=dict)  # queue -> newest counter so far
    # accepted id -> heads newer than it not yet terminal (the latest always counted)
    newer_live: dict[str, int] = field(default_factory=dict)


def check_invariants(world: World, max_concurrent: int, seen: Observed) -> None:
    by_id = {r.id: r for r in requests(world)}
    pending = {m.request_id for m in world.broker.messages}
    starts = [p for p in world.published.hooks() if p.event_type == VALIDATION_STARTED]
    started = {p.request_id for p in starts}
    built = {p.request_id for p in world.published.builds()}
    holders_everywhere: set[str] = set()
    for queue in world.queues.snapshot():
        holders = queue.slot_holders
        assert len(set(holders)) == len(holders), f"{queue.name}: duplicate holder {holders}"
        assert len(holders) <= max_concurrent, f"{queue.name}: {holders} > {max_concurrent}"
        for holder in holders:
            request = by_id[holder]
            assert request.queue == queue.name
            # A holder is processing, or accepted mid-admit (crash after the claim) with
            # its message still pending so the redelivery finishes or supersedes it.
            if request.state != "processing":
                assert request.state == "accepted", f"{holder} holds a slot while {request.state}"
                assert holder in pending, f"accepted holder {holder} has no pending message"
        holders_everywhere.update(holders)
    newest: dict[str, Request] = {}
    for request in by_id.values():
        if request.state == "processing":
            assert request.id in holders_everywhere, f"processing {request.id} holds no slot"
            assert request.build_strategy in ("full", "incremental_since_green")
            assert (request.build_strategy == "full") == (request.base_uri == "")
        if request.state in TERMINAL:
            # Released when it went terminal, whatever state it came from.
            assert request.id not in holders_everywhere, f"terminal {request.id} holds a slot"
        if request.state == "superseded":
            assert request.id not in started, f"superseded {request.id} was announced"
            assert request.id not in built, f"superseded {request.id} was built"
        if request.id in started or request.id in built:
            assert request.id in seen.pinned or request.state == "processing"
        newest[request.queue] = request  # ingest order: the last one wins
        # Strategy and base are written once, by the admit; nothing changes them.
        if request.state == "processing" and request.id not in seen.pinned:
            seen.pinned[request.id] = (request.build_strategy, request.base_uri)
            # Admitted during the last step: it was among the newest max_concurrent heads
            # not yet terminal when that step began (a stale head is superseded, never
            # admitted); with one slot, no newer head had been ingested.
            newer = seen.newer_live.get(request.id, 0)
            assert newer < max_concurrent, f"stale {request.id} admitted ({newer} newer)"
        if request.id in seen.pinned:
            assert (request.build_strategy, request.base_uri) == seen.pinned[request.id]
        # Terminal states are absorbing.
        if request.id in seen.terminal:
            assert request.state == seen.terminal[request.id]
        elif request.state in TERMINAL:
            seen.terminal[request.id] = request.state
    seen.newer_live = {
        r.id: sum(
            1
            for other in by_id.values()
            if other.queue == r.queue
            and parse_request_id(other.id).counter > parse_request_id(r.id).counter
            and (other.state not in TERMINAL or other is newest[r.queue])
        )
        for r in by_id.values()
        if r.state == "accepted"
    }
    for queue_name, request in newest.items():
        seen.newest[queue_name] = parse_request_id(request.id).counter
        assert request.state != "superseded", f"newest head of {queue_name} was superseded"
        assert run_sync(world.queues.get(queue_name)).latest_request_id == request.id
    # The start is announced before the build is published, every time it is.
    announced: set[str] = set()
    for record in world.published.records:
        if record.kind == "hook" and record.event_type == VALIDATION_STARTED:
            announced.add(record.request_id)
        elif record.kind == "build":
            assert record.request_id in announced, f"{record.request_id} built before announce"
    # Every announce of one request carries the same event id (one admission each), and
    # so does every announce of its end (one terminal write each); an end follows a start.
    ids_by_request: dict[tuple[str, bool], set[str]] = {}
    for hook in world.published.hooks():
        start = hook.event_type == VALIDATION_STARTED
        ids_by_request.setdefault((hook.request_id, start), set()).add(hook.dedup_id)
        if not start:
            assert hook.request_id in started, f"{hook.request_id} ended without a start"
    assert all(len(ids) == 1 for ids in ids_by_request.values()), ids_by_request


class TimelineMachine(RuleBasedStateMachine):
    """One random timeline: every rule is a ``simulate`` step kind, checked after each."""

    def __init__(self) -> None:
        super().__init__()
        self.world: World | None = None
        self.max_concurrent = 1
        self.seen = Observed()

    @initialize(max_concurrent=st.sampled_from([1, 2]), history=histories())
    def start(self, max_concurrent: int, history: dict[str, list[str]]) -> None:
        config = StaticConfigStore(
            QueueConfig.of(max_concurrent=max_concurrent, gate_wait_delay_ms=DELAY_MS)
        )
        self.world = World(MACHINES, config, history)
        self.max_concurrent = max_concurrent

    @property
    def w(self) -> World:
        assert self.world is not None
        return self.world

    @rule(queue=st.sampled_from(QUEUES), head=st.sampled_from(HEADS))
    def ingest(self, queue: str, head: str) -> None:
        self.w.ingest(queue, head)

    @rule(queue=st.sampled_from(QUEUES), head=st.sampled_from(HEADS))
    def ingest_and_run(self, queue: str, head: str) -> None:
        """The poller reports a head and the consumer catches up before the next one."""
        self.w.ingest(queue, head)
        drain(self.w)

    @rule()
    def deliver(self) -> None:
        report = self.w.deliver_next()
        event(f"delivery: {report.outcome if report else 'nothing due'}")

    @rule()
    def run(self) -> None:
        drain(self.w)

    @rule(ms=st.sampled_from([1, 500, 999, 1000, 5000]))
    def advance_ms(self, ms: int) -> None:
        self.w.advance(ms)

    @rule(data=st.data(), outcome=st.sampled_from(["succeeded", "failed", "cancelled"]))
    def complete(self, data: st.DataObject, outcome: str) -> None:
        processing = [r.id for r in requests(self.w) if r.state == "processing"]
        if processing:
            self.w.complete(data.draw(st.sampled_from(processing)), outcome)

    # The four faults share one rule so that, together, they are as frequent as one
    # ordinary step: a timeline made mostly of faults rarely reaches a held head.
    @rule(data=st.data(), kind=st.sampled_from(["redeliver", "crash", "outage", "dead_letter"]))
    def fault(self, data: st.DataObject, kind: str) -> None:
        world = self.w
        if kind == "crash":
            world.armed_crash = data.draw(st.sampled_from(ADMIT_CRASH_POINTS))
        elif kind == "outage":
            world.graph.set_available(data.draw(st.booleans()))
        elif kind == "redeliver":
            every = [r.id for r in requests(world)]
            if every:
                world.redeliver(data.draw(st.sampled_from(every)))
        else:
            live = [r.id for r in requests(world) if r.state not in TERMINAL]
            if live:
                world.dead_letter(data.draw(st.sampled_from(live)))

    @invariant()
    def invariants_hold(self) -> None:
        if self.world is None:
            return
        check_invariants(self.world, self.max_concurrent, self.seen)
        # Coverage labels (shown by --hypothesis-show-statistics), not assertions.
        for queue in self.world.queues.snapshot():
            if queue.in_flight_count == 2:
                event("two slots held")
            for holder in queue.slot_holders:
                if run_sync(self.world.requests.get(holder)).state == "accepted":
                    event("accepted holder (crash mid-admit)")
        if any(r.state == "superseded" for r in requests(self.world)):
            event("supersede seen")


TimelineMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTimelineInvariants = TimelineMachine.TestCase


@settings(max_examples=100, deadline=None)
@given(
    max_concurrent=st.sampled_from([1, 2]),
    heads=st.lists(st.sampled_from(HEADS), min_size=1, max_size=6, unique=True),
)
def test_a_backlog_drains_to_its_newest_head(max_concurrent: int, heads: list[str]) -> None:
    """Progress: with nothing in flight, any backlog ends with only the newest
    max_concurrent admitted."""
    config = StaticConfigStore(
        QueueConfig.of(max_concurrent=max_concurrent, gate_wait_delay_ms=DELAY_MS)
    )
    world = World(MACHINES, config, {h: [] for h in HEADS})
    for head in heads:
        world.ingest(QUEUES[0], head)
    drain(world)
    states = [r.state for r in requests(world)]
    kept = min(max_concurrent, len(heads))
    assert states == ["superseded"] * (len(heads) - kept) + ["processing"] * kept
    newest = [r.id for r in requests(world)[-kept:]]
    assert sorted(p.request_id for p in world.published.builds()) == sorted(newest)
    assert world.holds == 0
    assert not world.broker.messages


@pytest.mark.parametrize("end", ["complete", "dead_letter"])
def test_an_end_before_the_redelivery_that_announces_the_start_follows_a_start(end: str) -> None:
    """A crash after the admission is written, before its start is announced; the head's
    end (an outcome reported for it, or its dead letter) comes before the redelivery that
    would announce the start. The start is announced first, once, with the admission's
    own event id, and the redelivery announces nothing more."""
    world = World(MACHINES, StaticConfigStore(QueueConfig.of(max_concurrent=1)), {"A": []})
    world.ingest("monorepo/main", "A")
    world.armed_crash = "after_mark_processing"
    world.deliver_next()
    [request] = requests(world)
    assert request.state == "processing" and not world.published.hooks()
    seen = Observed()
    check_invariants(world, 1, seen)
    if end == "complete":
        world.complete(request.id, "succeeded")
    else:
        world.dead_letter(request.id)
    check_invariants(world, 1, seen)
    while world.deliver_next() is not None:
        check_invariants(world, 1, seen)
    types = [h.event_type for h in world.published.hooks()]
    assert types[0] == VALIDATION_STARTED and types.count(VALIDATION_STARTED) == 1
    assert len(types) == 2

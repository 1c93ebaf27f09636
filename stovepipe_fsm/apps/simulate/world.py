"""A whole pipeline on in-memory adapters and a simulated clock, step by step.

The :class:`World` runs the real controller, ingest, record and reconciler against
in-memory stores and a simulated process topic (:class:`SimBroker`) that behaves like
the JetStream runtime: one message in flight per queue, a held or failed message stays
at the head of its queue (a barrier for that queue only) and falls due again later.

Because in-memory adapters never suspend, every coroutine completes in one
``send(None)``; :func:`run_sync` exploits that so a step is an ordinary function call.
That keeps ``simulate`` deterministic and lets ``check`` fork a world (``clone``) and
explore thousands of interleavings without an event loop.

Overlapping deliveries (``docs/jetstream.md``, fact H): :meth:`World.stall` delivers the
head and stops that delivery after a named action, *in hand*. Its ack deadline is taken
to have lapsed, so the message stays at the head and is due again at once: the next
``deliver`` is its redelivery, running while the stalled one is still in hand, and
whichever of the two settles first removes the message (a stale ack), so the queue's
next message can start under the stalled one. :meth:`World.resume` runs the rest of
the stalled delivery; its ack or hold of a message already settled is a no-op, as on
the server. Two stalls of one message give the exact shape of fact H (delivery 1
stalled, delivery 2 stalled, delivery 1 resumes and acks, delivery 2 still in hand).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ...adapters.memory import (
    ManualClock,
    MemoryCounter,
    MemoryPublisher,
    MemoryQueueStore,
    MemoryRequestStore,
    MemorySourceControl,
    MemoryUriIndex,
)
from ...domain.entities import QueueConfig, Request
from ...domain.errors import NonRetryable, NotFound
from ...domain.hooks import HookEvent
from ...domain.ids import parse_request_id
from ...pipeline.ingest import IngestResult
from ...pipeline.wiring import Ports, build_stages
from ...ports.config import ConfigStore
from ...process.catalog import ProcessMachines
from ...process.controller import PausedDelivery
from ...process.lifecycle import RequestLifecycle
from ...process.services import LifecycleFactory

T = TypeVar("T")

CRASH_POINTS = (
    "after_claim_slot",
    "after_mark_processing",
    "after_announce",
    "after_publish_build",
)
# Where a delivery can be stalled in hand: after loading the queue (the coalesce and
# gate decisions are then taken on what it loaded), after deriving the strategy, and at
# every crash point of the admit path.
STALL_POINTS = ("after_load_queue", "after_derive_strategy", *CRASH_POINTS)
RETRY_DELAY_MS = 1000


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (in-memory adapters) to completion."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("an in-memory step awaited real I/O")


class Crash(Exception):
    """The simulated process died at a crash point; nothing after it ran."""


@dataclass
class Message:
    """One process message on the simulated topic."""

    seq: int
    queue: str
    request_id: str
    due_ms: int
    deliveries: int = 0


@dataclass
class SimBroker:
    """The process topic: per-queue order, one in flight, holds and retries in place."""

    messages: list[Message] = field(default_factory=list)
    next_seq: int = 1

    def publish(self, queue: str, request_id: str, now_ms: int) -> None:
        self.messages.append(Message(self.next_seq, queue, request_id, now_ms))
        self.next_seq += 1

    def heads(self) -> list[Message]:
        """The first pending message of every queue (the only deliverable one)."""
        seen: dict[str, Message] = {}
        for message in self.messages:
            seen.setdefault(message.queue, message)
        return list(seen.values())

    def due(self, now_ms: int) -> list[Message]:
        return sorted((m for m in self.heads() if m.due_ms <= now_ms), key=lambda m: m.seq)

    def next_due_ms(self) -> int | None:
        times = [m.due_ms for m in self.heads()]
        return min(times) if times else None

    def remove(self, message: Message) -> None:
        self.messages = [m for m in self.messages if m.seq != message.seq]

    def find(self, seq: int) -> Message | None:
        """The pending message ``seq``; ``None`` once it was settled."""
        for message in self.messages:
            if message.seq == seq:
                return message
        return None

    def clone(self) -> SimBroker:
        return SimBroker([dataclasses.replace(m) for m in self.messages], self.next_seq)


class SimPublisher:
    """Process messages go to the simulated topic; build and hook publishes are recorded."""

    def __init__(self, broker: SimBroker, clock: ManualClock, record: MemoryPublisher) -> None:
        self.broker = broker
        self.clock = clock
        self.record = record

    async def publish_process(self, queue: str, request_id: str) -> None:
        await self.record.publish_process(queue, request_id)
        self.broker.publish(queue, request_id, self.clock.now_ms())

    async def publish_build(self, queue: str, request_id: str) -> None:
        await self.record.publish_build(queue, request_id)

    async def publish_hook(self, event: HookEvent) -> None:
        await self.record.publish_hook(event)


class SimDelivery:
    """A delivery of one :class:`Message`; ack removes it, hold postpones it in place."""

    def __init__(self, world: World, message: Message) -> None:
        self.world = world
        self.message = message
        self.outcome = ""

    @property
    def queue(self) -> str:
        return self.message.queue

    @property
    def request_id(self) -> str:
        return self.message.request_id

    async def ack(self) -> None:
        self.world.broker.remove(self.message)
        self.outcome = "acked"

    async def hold(self, delay_ms: int) -> None:
        self.outcome = "held"
        if self.world.broker.find(self.message.seq) is None:
            return  # settled by another delivery of it: a late nak changes nothing
        self.message.due_ms = self.world.clock.now_ms() + delay_ms
        self.world.holds += 1

    async def in_progress(self) -> None:
        return None


class OverrideConfigStore:
    """A config store with the same knob overrides applied to every queue."""

    def __init__(self, base: ConfigStore, overrides: Mapping[str, Any]) -> None:
        self.base = base
        self.overrides = dict(overrides)

    def get(self, queue: str) -> QueueConfig:
        return dataclasses.replace(self.base.get(queue), **self.overrides)

    def configured_queues(self) -> tuple[str, ...]:
        return self.base.configured_queues()


@dataclass(frozen=True)
class DeliveryReport:
    message_seq: int
    request_id: str
    outcome: str  # acked | held | crashed | retry | dead_letter
    detail: str = ""
    state_before: str = ""  # the request's state when the delivery started ("" if none)


@dataclass(frozen=True)
class InHand:
    """A stalled delivery: the message it carries, its delivery and its paused flow."""

    delivery: SimDelivery
    paused: PausedDelivery
    point: str
    state_before: str

    @property
    def message(self) -> Message:
        return self.delivery.message

    def rebind(self, twin: World) -> InHand:
        """The same delivery in ``twin``: its message, its controller, its stores."""
        message = twin.broker.find(self.message.seq) or dataclasses.replace(self.message)
        delivery = SimDelivery(twin, message)
        delivery.outcome = self.delivery.outcome
        ctx = dataclasses.replace(
            self.paused.ctx, services=twin.controller.services, delivery=delivery
        )
        return dataclasses.replace(
            self, delivery=delivery, paused=dataclasses.replace(self.paused, ctx=ctx)
        )


class SingleSourceControl:
    """Every queue asks the same in-memory commit graph."""

    def __init__(self, graph: MemorySourceControl) -> None:
        self.graph = graph

    def for_queue(self, queue: str) -> MemorySourceControl:
        return self.graph


class World:
    """Everything one simulated run owns; cheap to :meth:`clone`."""

    def __init__(
        self,
        machines: ProcessMachines,
        config: ConfigStore,
        history: Mapping[str, Sequence[str]] | None = None,
        *,
        lifecycle_factory: LifecycleFactory = RequestLifecycle,
    ) -> None:
        self.machines = machines
        self.config = config
        self.lifecycle_factory = lifecycle_factory
        self.clock = ManualClock(0)
        self.requests = MemoryRequestStore()
        self.queues = MemoryQueueStore()
        self.uri_index = MemoryUriIndex()
        self.counter = MemoryCounter()
        self.published = MemoryPublisher()
        self.broker = SimBroker()
        self.graph = MemorySourceControl(history or {})
        self.armed_crash = ""
        self.holds = 0
        self.dead_letters: list[tuple[str, str]] = []
        self.in_hand: list[InHand] = []
        self._wire()

    def _wire(self) -> None:
        """The stages on this world's ports, through the one factory the service uses."""
        self.publisher = SimPublisher(self.broker, self.clock, self.published)
        ports = Ports(
            requests=self.requests,
            queues=self.queues,
            uri_index=self.uri_index,
            counter=self.counter,
            config=self.config,
            source_control=SingleSourceControl(self.graph),
            publisher=self.publisher,
            clock=self.clock,
        )
        stages = build_stages(self.machines, ports, lifecycle_factory=self.lifecycle_factory)
        self.lifecycle = stages.lifecycle
        self.controller = stages.controller
        self.ingester = stages.ingest
        self.recorder = stages.record
        self.reconciler = stages.reconciler

    def clone(self) -> World:
        twin = object.__new__(World)
        twin.machines = self.machines
        twin.config = self.config
        twin.lifecycle_factory = self.lifecycle_factory
        twin.clock = self.clock.clone()
        twin.requests = self.requests.clone()
        twin.queues = self.queues.clone()
        twin.uri_index = self.uri_index.clone()
        twin.counter = self.counter.clone()
        twin.published = self.published.clone()
        twin.broker = self.broker.clone()
        twin.graph = self.graph.clone()
        twin.armed_crash = self.armed_crash
        twin.holds = self.holds
        twin.dead_letters = list(self.dead_letters)
        twin._wire()
        twin.in_hand = [held.rebind(twin) for held in self.in_hand] if self.in_hand else []
        return twin

    # --- steps -------------------------------------------------------------------

    def ingest(self, queue: str, uri: str) -> IngestResult:
        return run_sync(self.ingester.ingest(queue, uri))

    def deliver(self, message: Message) -> DeliveryReport:
        """Deliver ``message`` once through the real controller."""
        message.deliveries += 1
        delivery = SimDelivery(self, message)
        probe = self._probe if self.armed_crash else None
        # Recorded so a report can tell an admission from the re-announce of a request
        # that was already processing: both end with the request processing.
        before = self._state_of(message.request_id)
        try:
            outcome = run_sync(self.controller.handle(delivery, probe=probe))
        except Exception as exc:
            return self._failed(message, exc, before)
        return DeliveryReport(message.seq, message.request_id, outcome, "", before)

    def _failed(self, message: Message, exc: Exception, before: str) -> DeliveryReport:
        """What the runtime does with a delivery that raised (crash, non-retryable, other).

        A message another delivery already settled is not touched: nothing is left on the
        topic to retry, dead-letter or redeliver.
        """
        settled = self.broker.find(message.seq) is None
        if isinstance(exc, Crash):
            if not settled:
                message.due_ms = self.clock.now_ms()
            return DeliveryReport(message.seq, message.request_id, "crashed", str(exc), before)
        if isinstance(exc, NonRetryable):
            if not settled:
                self.broker.remove(message)
                self.dead_letters.append((message.request_id, str(exc)))
            return DeliveryReport(message.seq, message.request_id, "dead_letter", str(exc), before)
        if not settled:  # the runtime's classifier: anything else is retryable
            message.due_ms = self.clock.now_ms() + RETRY_DELAY_MS
        return DeliveryReport(
            message.seq, message.request_id, "retry", f"{type(exc).__name__}: {exc}", before
        )

    def stall(self, point: str) -> DeliveryReport | None:
        """Deliver the due head and stop that delivery after ``point``, still in hand.

        The message stays at the head, due now (the stalled delivery's ack deadline has
        lapsed), so it is redelivered while this delivery is in hand. A delivery that
        finishes or fails before reaching ``point`` is reported like :meth:`deliver`.
        """
        if point not in STALL_POINTS:
            raise ValueError(f"unknown stall point {point!r}; one of {', '.join(STALL_POINTS)}")
        due = self.broker.due(self.clock.now_ms())
        if not due:
            return None
        message = due[0]
        message.deliveries += 1
        delivery = SimDelivery(self, message)
        probe = self._probe if self.armed_crash else None
        before = self._state_of(message.request_id)
        action = point.removeprefix("after_")
        try:
            result = run_sync(self.controller.begin(delivery, pause_after=action, probe=probe))
        except Exception as exc:
            return self._failed(message, exc, before)
        if isinstance(result, str):
            return DeliveryReport(message.seq, message.request_id, result, "", before)
        self.in_hand.append(InHand(delivery, result, point, before))
        return DeliveryReport(message.seq, message.request_id, "stalled", point, before)

    def resume(self, request_id: str) -> DeliveryReport:
        """Run the rest of the oldest stalled delivery of ``request_id``."""
        held = next((h for h in self.in_hand if h.message.request_id == request_id), None)
        if held is None:
            raise ValueError(f"no stalled delivery of {request_id!r} is in hand")
        self.in_hand.remove(held)
        message = held.message
        probe = self._probe if self.armed_crash else None
        settled = "" if self.broker.find(message.seq) else "message already settled"
        try:
            result = run_sync(self.controller.resume(held.paused, probe=probe))
        except Exception as exc:
            return self._failed(message, exc, held.state_before)
        assert isinstance(result, str), "a resumed delivery runs to the end"
        return DeliveryReport(message.seq, message.request_id, result, settled, held.state_before)

    def _state_of(self, request_id: str) -> str:
        try:
            return run_sync(self.requests.get(request_id)).state
        except NotFound:
            return ""

    def _probe(self, action: str) -> None:
        point = f"after_{action}"
        if point == self.armed_crash:
            self.armed_crash = ""
            raise Crash(point)

    def deliver_next(self) -> DeliveryReport | None:
        due = self.broker.due(self.clock.now_ms())
        return self.deliver(due[0]) if due else None

    def redeliver(self, request_id: str) -> None:
        """A duplicate of the request's process message (at-least-once delivery)."""
        self.broker.publish(parse_request_id(request_id).queue, request_id, self.clock.now_ms())

    def complete(self, request_id: str, outcome: str) -> Request:
        return run_sync(self.recorder.complete(request_id, outcome))

    def dead_letter(self, request_id: str) -> Request | None:
        return run_sync(self.reconciler.reconcile(request_id))

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    def request_for(self, queue: str, uri: str) -> str | None:
        return run_sync(self.uri_index.get(queue, uri))

"""A whole pipeline on in-memory adapters and a simulated clock, step by step.

The :class:`World` runs the real controller, ingest, record and reconciler against
in-memory stores and a simulated process topic
(:class:`~.broker.SimBroker`) that behaves like the JetStream runtime, with one message
in flight per queue and a held or failed message staying at the head of its queue (a
barrier for that queue only) until it falls due again.

What becomes of a delivery after the flow ran or raised is the settle policy's call
(:func:`stovepipe_fsm.domain.settle.settle`), the one the JetStream consumer makes: the
world counts each message's failures as the service does (holds never count, an ack
forgets them), redelivers a failure after the same backoff, and dead-letters a message
at its queue's ``max_attempts``: the record is kept, the message removed, and the
reconciler fails the request closed, as the dead-letter consumer does on JetStream.

Every step is an ordinary function call (:func:`~.broker.run_sync`). That keeps
``simulate`` deterministic and lets ``check`` fork a world (``clone``) and explore
thousands of interleavings without an event loop.

Overlapping deliveries (``docs/jetstream.md``, fact H): :meth:`World.stall` delivers the
head and stops that delivery after a named action, *in hand*. Its ack deadline is taken
to have lapsed, so the message stays at the head and is due again at once: the next
``deliver`` is its redelivery, running while the stalled one is still in hand, and
whichever of the two settles first removes the message (a stale ack), so the queue's
next message can start under the stalled one. :meth:`World.resume` runs the rest of
the stalled delivery; its ack or hold of a message already settled is a no-op, as on
the server. Two stalls of one message give the exact shape of fact H (delivery 1
stalled, delivery 2 stalled, delivery 1 resumes and acks, delivery 2 still in hand).

Every hold that postponed a message is recorded with its reason (:class:`Hold`): the
flow transition that led into the held state says why, by its conditions
(``gate_closed``, ``latest_not_stamped``, or a user's own), so timelines can expect a
hold reason under any machine, not only the shipped one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..adapters.memory import (
    ManualClock,
    MemoryCounter,
    MemoryPublisher,
    MemoryQueueStore,
    MemoryRequestStore,
    MemorySearchStore,
    MemorySourceControl,
    MemorySourceControlProvider,
    MemoryUriIndex,
)
from ..adapters.memory.decision_trail import MemoryTrail
from ..adapters.memory.source_control import SourceControlOutage
from ..domain.entities import Request, evolve
from ..domain.errors import NotFound, Retryable
from ..domain.hooks import HookEvent
from ..domain.ids import parse_request_id
from ..domain.settle import Attempt, Backoff, SettleKind, settle
from ..pipeline import verbs
from ..pipeline.ingest import IngestResult
from ..pipeline.wiring import Ports, Stages, build_stages
from ..ports.config import ConfigStore
from ..process.catalog import ProcessMachines
from ..process.controller import Decision, PausedDelivery
from ..process.effective_config import ResolvedConfigs
from ..process.lifecycle import RequestLifecycle
from ..process.metrics import Metrics
from ..process.services import LifecycleFactory
from ..process.trail_notes import hold_reason
from .broker import Crash, Message, SimBroker, run_sync
from .builds import BuildModel

ADMIT_CRASH_POINTS = (
    "after_claim_slot",
    "after_mark_processing",
    "after_announce",
    "after_publish_build",
)
# The last: after a policy with the ``preempt`` role ended older heads' builds, before
# R's admission.
CRASH_POINTS = (*ADMIT_CRASH_POINTS, "after_preempt_older_builds")
# Where a delivery can be stalled in hand: after loading the queue (the coalesce and
# gate decisions are then taken on what it loaded), after deriving the strategy, and at
# every crash point of the admit path.
STALL_POINTS = ("after_load_queue", "after_derive_strategy", *ADMIT_CRASH_POINTS)
# The service's default retry backoff (1 s, 2 s, 4 s ... 60 s), so a simulated retry
# falls due when the same failure would be redelivered by ``serve``.
RETRY_BACKOFF = Backoff()
# How a settlement of a delivery that raised is reported.
RAISED_OUTCOMES = {
    SettleKind.NONE: "crashed",
    SettleKind.RETRY: "retry",
    SettleKind.DEAD_LETTER: "dead_letter",
}



class RecordedFailure(Retryable):
    """The failure of a delivery a timeline says fails (``failing``): what a live run's
    deliveries of the head met, replayed; a fault of the world, not of the policy."""


@dataclass(frozen=True)
class DeliveryReport:
    message_seq: int
    request_id: str
    outcome: str  # acked | held | crashed | retry | dead_letter
    detail: str = ""
    state_before: str = ""  # the request's state when the delivery started ("" if none)
    hold_reason: str = ""  # why the flow held it (see hold_reason), when it was held


@dataclass(frozen=True)
class Hold:
    """One hold that postponed a message: whose, on which queue, and why."""

    request_id: str
    queue: str
    reason: str


@dataclass(frozen=True)
class InHand:
    """A stalled delivery: the message it carries (its delivery) and its paused flow."""

    message: Message
    paused: PausedDelivery
    point: str
    state_before: str

    def rebind(self, twin: World) -> InHand:
        """The same delivery in ``twin``: its message, its controller, its stores."""
        message = twin.broker.find(self.message.seq) or dataclasses.replace(self.message)
        ctx = dataclasses.replace(self.paused.ctx, services=twin.stages.services, delivery=message)
        return dataclasses.replace(
            self, message=message, paused=dataclasses.replace(self.paused, ctx=ctx)
        )


@dataclass(frozen=True)
class SimPublisher:
    """Process messages go to the world's topic; every publish is recorded, and the
    request of every build published goes to ``builds`` (when the world models builds).

    It holds the world's parts, not the world: a world reaching itself through its
    stages would be a cycle only the collector frees, and ``check`` drops many worlds.
    """

    broker: SimBroker
    clock: ManualClock
    record: MemoryPublisher
    builds: list[str] | None

    async def publish_process(self, queue: str, request_id: str, partition: int = 0) -> None:
        await self.record.publish_process(queue, request_id, partition)
        self.broker.publish(queue, request_id, self.clock.now_ms())

    async def publish_build(self, queue: str, request_id: str) -> None:
        await self.record.publish_build(queue, request_id)
        if self.builds is not None:
            self.builds.append(request_id)

    async def publish_hook(self, event: HookEvent) -> None:
        await self.record.publish_hook(event)


class World:
    """Everything one simulated run owns: its stores, topic, clock and its own stages.

    The stages are built, through the one factory the service uses
    (:func:`~..pipeline.wiring.build_stages`), on this world's ports and nothing else,
    when the world first runs a step; nothing rewires them afterwards. A :meth:`clone`
    copies only what a step can change and builds its own stages when it first steps.
    """

    def __init__(
        self,
        machines: ProcessMachines,
        config: ConfigStore,
        history: Mapping[str, Sequence[str]] | None = None,
        *,
        lifecycle_factory: LifecycleFactory = RequestLifecycle,
        changes: Mapping[str, Iterable[str]] | None = None,
        overrides: Mapping[str, Any] | None = None,
        keep_trail: bool = True,
        requests: MemoryRequestStore | None = None,
        errors_seen: set[str] | None = None,
    ) -> None:
        """``config`` is the policy, fixed for the run; ``overrides`` are values every
        queue resolves over it (a timeline's ``config:``), ``config`` steps change it
        per queue (:meth:`ResolvedConfigs.set`). ``requests``: the request store to run
        on, when not an empty one (a what-if's logs its writes). ``errors_seen``: where
        every distinct error a delivery raises is added, in this world and every world
        forked from it (the model checker's report of what failed anywhere)."""
        self.machines = machines
        #: The decision trail, as the service keeps it (none for the model checker,
        #: whose states must not carry a growing history).
        self.trail: MemoryTrail | None = MemoryTrail() if keep_trail else None
        self.config = ResolvedConfigs(config, machines.parameter_defaults, overrides)
        self.lifecycle_factory = lifecycle_factory
        self.clock = ManualClock(0)
        self.requests = requests if requests is not None else MemoryRequestStore()
        self.queues = MemoryQueueStore()
        self.searches = MemorySearchStore()
        self.uri_index = MemoryUriIndex()
        self.counter = MemoryCounter()
        self.published = MemoryPublisher()
        self.broker = SimBroker()
        self.graph = MemorySourceControl(history or {}, changes)
        #: The controller's counters, kept across forks (a fork's stages count into
        #: the metrics of the world it was forked from).
        self.metrics = Metrics()
        self.armed_crash = ""
        self.holds = 0
        self.hold_log: list[Hold] = []
        self.dead_letters: list[tuple[str, str]] = []
        # What each delivery that failed raised (request id, error described with the
        # YAML step that raised it), in order: what ``test`` shows beside failed checks.
        self.raised: list[tuple[str, str]] = []
        self.errors_seen = errors_seen if errors_seen is not None else set()
        self.in_hand: list[InHand] = []
        self._stages: Stages | None = None
        #: The recorded builds that end every build this world starts (:mod:`.builds`);
        #: without them a build ends only by a ``complete`` step.
        self.builds: BuildModel | None = None
        #: Requests every delivery of which fails (a timeline's ``failing`` step).
        self.failing: frozenset[str] = frozenset()
        #: Builds published by the delivery in progress, started when it settles.
        self.published_builds: list[str] = []
        #: Called after every event a timed step runs (a delivery, a build's end), at
        #: the instant it happened (a replay timing its requests stamps its writes).
        self.after_event: Callable[[], None] | None = None

    def clone(self) -> World:
        """An independent world in the same state.

        Only what a step can change is copied: the stores' rows, the topic's messages,
        the records, the config steps, the clock and the logs. The machines and the
        policy are immutable and shared; the twin builds its own stages on its own
        ports when it first steps (a stalled delivery in hand needs them at once).
        """
        # The machines, policy, metrics and error set are shared. Not copy.copy: its
        # generic protocol costs more than the rest of a clone's bookkeeping.
        twin = object.__new__(World)
        twin.__dict__.update(self.__dict__)
        twin.config = self.config.clone()
        twin.clock = self.clock.clone()
        twin.requests = self.requests.clone()
        twin.queues = self.queues.clone()
        twin.searches = self.searches.clone()
        twin.uri_index = self.uri_index.clone()
        twin.counter = self.counter.clone()
        twin.published = self.published.clone()
        twin.broker = self.broker.clone()
        twin.graph = self.graph.clone()
        twin.trail = self.trail.clone() if self.trail is not None else None
        twin.hold_log = list(self.hold_log)
        twin.dead_letters = list(self.dead_letters)
        twin.raised = list(self.raised)
        twin._stages = None
        twin.builds = self.builds.clone() if self.builds is not None else None
        twin.published_builds = list(self.published_builds)
        twin.after_event = None
        twin.in_hand = [held.rebind(twin) for held in self.in_hand]
        return twin

    # --- the stages, on this world's ports ---------------------------------------

    @property
    def stages(self) -> Stages:
        """This world's stages, built the first time they are needed on its own ports: its
        stores, config, topic, commit graph, clock and trail."""
        if self._stages is None:
            builds = self.published_builds if self.builds is not None else None
            ports = Ports(
                requests=self.requests,
                queues=self.queues,
                uri_index=self.uri_index,
                counter=self.counter,
                config=self.config,
                source_control=MemorySourceControlProvider(default=self.graph),
                publisher=SimPublisher(self.broker, self.clock, self.published, builds),
                clock=self.clock,
                trail=self.trail,
                searches=self.searches,
            )
            factory = self.lifecycle_factory
            self._stages = build_stages(
                self.machines, ports, metrics=self.metrics, lifecycle_factory=factory
            )
        return self._stages

    # --- steps -------------------------------------------------------------------

    def ingest(self, queue: str, uri: str, *, at_head: bool = False) -> IngestResult:
        """Ingest ``uri``; ``at_head``: trunk was seen at it (a return to a commit the
        queue moved on from is a new request, as the poller's ingest makes)."""
        return run_sync(self.stages.ingest.ingest(queue, uri, at_head=at_head))

    def deliver(self, message: Message, point: str = "") -> DeliveryReport:
        """Deliver ``message`` once through the real controller; with a ``point``, stop
        that delivery after it, in hand (:meth:`stall`)."""
        message.deliveries += 1
        if message.request_id in self.failing:
            failure = RecordedFailure("every delivery of this head failed in the recorded run")
            return self._failed(message, failure, before="")
        # Recorded so a report can tell an admission from the re-announce of a request
        # that was already processing: both end with the request processing.
        request = self.find_request(message.request_id)
        before = request.state if request is not None else ""
        controller = self.stages.controller
        probe = self._probe if self.armed_crash else None
        flow: Coroutine[Any, Any, Decision | PausedDelivery]
        if point:
            action = point.removeprefix("after_")
            flow = controller.begin(message, pause_after=action, probe=probe)
        else:
            flow = controller.decide(message, probe=probe)
        return self._run(message, flow, before, point)

    def _run(
        self,
        message: Message,
        flow: Coroutine[Any, Any, Decision | PausedDelivery],
        before: str,
        point: str = "",
        detail: str = "",
    ) -> DeliveryReport:
        """Run ``flow`` for a delivery of ``message``: keep it in hand when it paused at
        ``point``, else settle it and record why, if it postponed its message (a hold of
        a message another delivery already settled changes nothing on the topic, and is
        not recorded)."""
        holds = self.holds
        try:
            result = run_sync(flow)
        except Exception as exc:
            return self._failed(message, exc, before)
        if not isinstance(result, Decision):
            self.in_hand.append(InHand(message, result, point, before))
            return DeliveryReport(message.seq, message.request_id, "stalled", point, before)
        reason = hold_reason(result.via) if result.outcome == "held" else ""
        report = self._settle(message, result.attempt, before, detail)
        if self.holds > holds:
            self.hold_log.append(Hold(message.request_id, message.queue, reason))
        return evolve(report, hold_reason=reason) if reason else report

    def _failed(self, message: Message, exc: Exception, before: str) -> DeliveryReport:
        """What the runtime does with a delivery that raised: a crash, or a failure."""
        attempt = Attempt.raised(exc, crashed=isinstance(exc, Crash))
        if not attempt.crashed:
            self.raised.append((message.request_id, attempt.error))
            if not isinstance(exc, SourceControlOutage | RecordedFailure):  # the world's
                self.errors_seen.add(attempt.error)
        # A crash is reported by its crash point; a failure by what the policy says.
        detail = str(exc) if isinstance(exc, Crash) else ""
        return self._settle(message, attempt, before, detail)

    def _settle(
        self, message: Message, attempt: Attempt, before: str, detail: str = ""
    ) -> DeliveryReport:
        """Perform what the settle policy decides for ``message`` after ``attempt``.

        A message another delivery already settled is not touched: nothing is left on the
        topic to ack, hold, count, retry, dead-letter or redeliver (a late ack or NAK
        changes nothing on the server either).
        """
        self._start_builds()
        pending = self.broker.find(message.seq)
        max_attempts = self.config.get(message.queue).max_attempts
        failures = (pending or message).failures
        decision = settle(
            attempt, failures=failures, max_attempts=max_attempts, backoff=RETRY_BACKOFF
        )
        if pending is not None:
            pending.failures = decision.failures
            if decision.kind is SettleKind.ACK:
                self.broker.remove(pending)
            elif decision.kind is SettleKind.HOLD:
                pending.due_ms = self.clock.now_ms() + round(decision.delay_s * 1000)
                self.holds += 1
            elif decision.kind is SettleKind.RETRY:
                pending.due_ms = self.clock.now_ms() + round(decision.delay_s * 1000)
                if self.trail is not None:  # noted, as the service notes it before its NAK
                    retry = (pending.queue, pending.request_id, pending.seq, decision, max_attempts)
                    run_sync(self.stages.note_retry(*retry))
            elif decision.kind is SettleKind.NONE:
                pending.due_ms = self.clock.now_ms()  # the lease lapses: due again at once
            elif decision.kind is SettleKind.DEAD_LETTER:
                self._dead_letter(pending, decision.reason)
        outcome = attempt.outcome or RAISED_OUTCOMES[decision.kind]
        return DeliveryReport(
            message.seq, message.request_id, outcome, detail or decision.reason, before
        )

    def _dead_letter(self, message: Message, reason: str) -> None:
        """Record the dead letter, remove the message, and fail its request closed.

        The dead-letter consumer on JetStream reconciles a record whose request belongs
        to the queue it was dead-lettered on; here that happens in the same step.
        """
        self.broker.remove(message)
        self.dead_letters.append((message.request_id, reason))
        if parse_request_id(message.request_id).queue == message.queue:
            failures = message.failures
            reconcile = self.stages.reconciler.reconcile
            run_sync(reconcile(message.request_id, error=reason, attempts=failures))

    def stall(self, point: str) -> DeliveryReport | None:
        """Deliver the due head and stop that delivery after ``point``, still in hand.

        The message stays at the head, due now (the stalled delivery's ack deadline has
        lapsed), so it is redelivered while this delivery is in hand. A delivery that
        finishes or fails before reaching ``point`` is reported like :meth:`deliver`.
        """
        if point not in STALL_POINTS:
            raise ValueError(f"unknown stall point {point!r}; one of {', '.join(STALL_POINTS)}")
        message = self.broker.first_due(self.clock.now_ms())
        return self.deliver(message, point) if message is not None else None

    def resume(self, request_id: str) -> DeliveryReport:
        """Run the rest of the oldest stalled delivery of ``request_id``."""
        held = next((h for h in self.in_hand if h.message.request_id == request_id), None)
        if held is None:
            raise ValueError(f"no stalled delivery of {request_id!r} is in hand")
        self.in_hand.remove(held)
        settled = "" if self.broker.find(held.message.seq) else "message already settled"
        probe = self._probe if self.armed_crash else None
        flow = self.stages.controller.resume(held.paused, probe=probe)
        return self._run(held.message, flow, held.state_before, detail=settled)

    def find_request(self, request_id: str) -> Request | None:
        """The request ``request_id`` as stored; ``None`` when there is none."""
        try:
            return run_sync(self.requests.get(request_id))
        except (NotFound, ValueError):
            return None

    def _probe(self, action: str) -> None:
        point = f"after_{action}"
        if point == self.armed_crash:
            self.armed_crash = ""
            raise Crash(point)

    def _start_builds(self) -> None:
        """Start the build of every request the last delivery (or recorded outcome)
        published to build."""
        if not self.published_builds or self.builds is None:
            return
        now = self.clock.now_ms()
        for request_id in self.published_builds:
            request = run_sync(self.requests.get(request_id))
            probe = bool(request.probe_of)
            self.builds.start(request.queue, request.uri, request_id, now, probe=probe)
        self.published_builds.clear()

    def end_due_build(self) -> Request | None:
        """End the first build due by now with its outcome (:mod:`.builds`); the request
        as it ended, or as it was when its build had nothing left to end; ``None`` when
        no build is due."""
        if self.builds is None:
            return None
        started = self.builds.pop_due(self.clock.now_ms())
        if started is None:
            return None
        request = run_sync(self.requests.get(started.request_id))
        if request.state in self.machines.roles.admitted_states:
            request = self.complete(started.request_id, started.outcome)
        return request

    def next_event(self) -> DeliveryReport | Request | None:
        """Run the first thing due now: a build's end, else a delivery (``None``: none)."""
        return self.end_due_build() or self.deliver_next()

    def run_for(self, ms: int, limit: int) -> list[DeliveryReport | Request]:
        """Move the clock ``ms`` on, running every delivery and ending every build at the
        instant it falls due, as a live consumer and build system would; what falls due
        at the end is left to the next step. ``ValueError`` when one instant does not
        settle within ``limit`` events."""
        end = self.clock.now_ms() + ms
        events: list[DeliveryReport | Request] = []
        while True:
            for _ in range(limit):
                event = self.next_event()
                if event is None:
                    break
                events.append(event)
                if self.after_event is not None:
                    self.after_event()
            else:
                raise ValueError(f"run_ms did not settle after {limit} events at one instant")
            due = [t for t in (self.broker.next_due_ms(), self._next_build_ms()) if t is not None]
            if not due or min(due) >= end:
                break
            self.clock.set(max(min(due), self.clock.now_ms()))
        self.clock.set(max(end, self.clock.now_ms()))
        return events

    def _next_build_ms(self) -> int | None:
        return self.builds.next_due_ms() if self.builds is not None else None

    def fail_deliveries(self, request_id: str) -> None:
        """From now on every delivery of ``request_id`` fails, retryably: the settle
        policy retries it with the runtime's backoff and dead-letters it at the queue's
        ``max_attempts``, as it did live."""
        self.failing = self.failing | {request_id}

    def retry(self, request_id: str) -> verbs.RetryResult:
        """An operator's ``retry`` of ``request_id``: the verb the command runs, on this
        world's stores (``IllegalOperation`` when it refuses)."""
        queue = parse_request_id(request_id).queue
        parameters = dict(self.config.get(queue).parameters)
        coalesces = verbs.queue_coalesces(self.machines.coalesces, parameters)
        stages = (self.stages.lifecycle, self.stages.ingest, self.uri_index)
        return run_sync(verbs.retry(*stages, request_id, by="timeline", coalesces=coalesces))

    def deliver_next(self) -> DeliveryReport | None:
        first = self.broker.first_due(self.clock.now_ms())
        return self.deliver(first) if first is not None else None

    def redeliver(self, request_id: str) -> None:
        """A duplicate of the request's process message (at-least-once delivery)."""
        self.broker.publish(parse_request_id(request_id).queue, request_id, self.clock.now_ms())

    def complete(self, request_id: str, outcome: str) -> Request:
        """Record ``outcome``; the probe builds its culprit search published start now."""
        ended = run_sync(self.stages.record.complete(request_id, outcome))
        self._start_builds()
        return ended

    def cancel(self, request_id: str) -> verbs.CancelResult:
        """An operator's ``cancel`` of ``request_id``: the verb the command runs, on this
        world's stores (``IllegalOperation`` when it refuses, as the command does)."""
        lifecycle = self.stages.lifecycle
        return run_sync(verbs.cancel(lifecycle, self.trail, self.clock, request_id, by="timeline"))

    def dead_letter(self, request_id: str) -> Request | None:
        return run_sync(self.stages.reconciler.reconcile(request_id))

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    def request_for(self, queue: str, uri: str) -> str | None:
        return run_sync(self.uri_index.get(queue, uri))

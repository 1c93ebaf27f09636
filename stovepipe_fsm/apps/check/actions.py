"""Which actions a state enables, and performing one on a forked world.

Every action is applied through :func:`..simulate.runner.apply_step`, the function
``simulate`` replays timelines with, so an explored edge and a replayed timeline step
are the same code path by construction.

Enabled actions, for the one checked queue:

- fair (the environment keeps doing these): deliver the queue's head message when it is
  due; advance the clock to the head's due time when it is not; complete a processing
  request whose build was published, with each outcome; bring source control back up
  (only reachable from a replayed timeline that left it down);
- bounded (the environment may do these, a few times per path): ingest the next head
  (A1..AN, then the rewrite head R; each but the first changing the paths of one of the
  policy's path classes in turn, when it has any, :mod:`.paths`); arm a crash point and
  deliver (kept only when the delivery reaches the point); a delivery during a source-
  control outage (down, deliver, up - kept only when the delivery asked source control),
  a retryable failure that the settle policy counts and retries with backoff; once a
  path had its outage, a head that has failed may fail again the same way (the outage
  goes on), free of the outage bound because the policy dead-letters it at the queue's
  ``max_attempts`` (check's default is 2, so that exhaustion is within reach); a
  duplicate process message for an accepted head (ingest publishes only while a request
  is accepted; a message redelivered after the work was done is the
  ``after_publish_build`` crash); dead-letter reconcile of a non-terminal request; when
  the policy declares the ``paused`` parameter, pause the queue when its head is due (a
  ``config`` step), and once paused resume it when its head is due, a delivery is in
  hand or nothing waits - free, as whether the queue is paused is part of the state, but
  never fair: a paused queue may stay paused, and its holds are no wedge;
- when the policy declares the ``withdraw`` role, an operator's ``cancel`` of any head
  not yet ended (``--max-cancels``): the verb ends a waiting one and refuses a running one,
  so what is explored is every moment the operator may run it, the race with an
  admission included (the cancel lands before or after the admission's write); a
  refused cancel changes nothing and is no edge;
- when the policy declares states a retry takes (``retryable`` outcomes), an operator's
  ``retry`` of any head that ended in one (``--max-retries``), at every moment, a newer
  head's ingest and admission included: the verb refuses a head behind a newer one on a
  queue that coalesces, and a refused retry changes nothing and is no edge;
- overlapping deliveries (``--max-overlaps``, off by default): stall the head's delivery
  in hand after one of the bounds' stall points (bounded, kept only when the delivery got
  there); resuming a stalled delivery is fair (a delivery in hand eventually continues).
  While one is stalled its message is due again, so the plain ``deliver`` above is its
  redelivery, and every other action interleaves with it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from operator import attrgetter
from typing import Any

from ...domain.errors import StovepipeError
from ...process.gate import PAUSED
from ...simulation.replay import apply_step
from ...simulation.world import ADMIT_CRASH_POINTS, CRASH_POINTS, World
from .invariants import Rules
from .model import (
    ADVANCE,
    CANCEL,
    COMPLETE,
    CRASH,
    DEAD_LETTER,
    DELIVER,
    INGEST,
    OUTAGE,
    OUTAGE_PERSISTS,
    PAUSE,
    REDELIVER,
    RESTORE,
    RESUME,
    RETRY,
    STALL,
    UNPAUSE,
    Action,
    Bounds,
    Budget,
)
from .model import step as new_step
from .observe import Observation

# A step is a frozen value and the search builds the same few thousand again and again
# (every state's actions): each distinct one is built once.
step = cache(new_step)


@cache
def one_step(kind: str, step_kind: str, queue: str, **fields: Any) -> Action:
    """An action of one timeline step. Like the steps, the search needs the same few
    actions again and again: each is built (and hashed) once per run."""
    return Action(kind, (step(step_kind, queue, **fields),))


@cache
def crash_action(queue: str, point: str) -> Action:
    """Arm a crash at ``point``, then deliver."""
    return Action(CRASH, (step("crash", queue, value=point), step("deliver", queue)))


@cache
def failed_delivery(kind: str, queue: str) -> Action:
    """A delivery while source control is down."""
    down = step("source_control", queue, value="down")
    return Action(kind, (down, step("deliver", queue), step("source_control", queue, value="up")))


@cache
def ingest_changing(queue: str, uri: str, paths: tuple[str, ...]) -> Action:
    """Ingest ``uri``, a commit that changed ``paths``."""
    return Action(INGEST, (step("ingest", queue, uri=uri),), paths)


class StepFailed(Exception):
    """An environment step raised: the step itself is the finding."""


@dataclass(frozen=True)
class DeliveryEffect:
    """What the plain delivery of the head did: decides which faults are worth trying.

    A crash point is "after action X" of this very delivery. When the delivery wrote no
    store and published no build or hook, a crash anywhere in it leaves the durable state
    as it was and the message at the head, due now: the state it started from, with one
    crash less to spend - nothing new. Likewise an outage changes nothing for a delivery
    that never asked source control. Skipping those saves forking a world per crash
    point for every hold and every no-op delivery.
    """

    durable: bool
    asked_source_control: bool

    @classmethod
    def of(
        cls, pre: Observation, post: Observation, calls_before: int, after: World
    ) -> DeliveryEffect:
        """What the delivery from ``pre`` to ``post`` did; ``calls_before`` is the count
        of source-control calls of the world it was performed from, before it ran."""
        durable = _WRITTEN(pre) != _WRITTEN(post)
        return cls(durable, after.graph.calls != calls_before)

    def worth(self, action: Action) -> bool:
        if action.kind == CRASH:
            return self.durable
        if action.kind in (OUTAGE, OUTAGE_PERSISTS):
            return self.asked_source_control
        return True


#: What a delivery may write: the stores and what it published.
_WRITTEN = attrgetter("requests", "queues", "builds", "hooks")


def held_while_paused(pre: Observation, post: Observation, queue: str) -> bool:
    """Whether a delivery from ``pre`` to ``post`` only held the paused ``queue``'s head:
    everything observed is as it was but the head's due time, now in the future.

    Its destination need not be explored when nothing else observed depends on the
    clock (no slot leases, no delivery stalled in hand): every state it leads to before
    a clock advance is paused, so at rest for the progress pass, and has the stores of
    a state the search reaches from ``pre`` by the same steps (each commutes with the
    hold); the advance, due, leads onto that very state (docs/check.md, "Pause and
    resume")."""
    if queue not in pre.paused or pre.in_hand or post.in_hand:
        return False
    if any(row.leases for row in pre.queues) or any(row.leases for row in post.queues):
        return False
    before, after = pre.pending, post.pending
    if not before or len(before) != len(after) or after[0].due_in_ms <= 0:
        return False
    if replace(after[0], due_in_ms=before[0].due_in_ms) != before[0] or after[1:] != before[1:]:
        return False
    return replace(post, pending=before) == pre


def enabled(
    obs: Observation,
    budget: Budget,
    bounds: Bounds,
    rules: Rules,
    *,
    fair_only: bool = False,
    resume_anywhere: bool = False,
    steps_while_paused: bool = False,
) -> list[Action]:
    """Every action possible in ``obs``, in a fixed order (the search is deterministic).

    ``resume_anywhere``: resume a paused queue in every state, not only where the
    resumed queue can next be read; ``steps_while_paused``: take the steps other than
    deliveries from a paused queue whose head is due too (both for tests comparing the
    two ways)."""
    q = bounds.queue
    actions: list[Action] = []
    pending = obs.pending_in(q)
    head_due = bool(pending) and pending[0].due_in_ms == 0
    if head_due:
        actions.append(one_step(DELIVER, "deliver", q))
    elif pending:
        wait = pending[0].due_in_ms
        actions.append(one_step(ADVANCE, "advance_ms", q, amount=wait))
    # A paused queue whose head is due is resumed, and paused again, around any other
    # step: only a delivery reads the pause, so that step's state, paused, is reached
    # from the running one by the same pause every running state with a due head takes.
    # Here only the delivery (and its faults) and the resume are taken.
    others = (
        fair_only
        or steps_while_paused
        or not head_due
        or q not in obs.paused
        or bool(obs.in_hand)
        or bool(rules.max_validation_ms)
        or not (rules.pausable and bounds.pauses)
    )
    for request in obs.heads_of(q) if others else ():
        if request.state in rules.admitted_states and request.id in obs.builds:
            for outcome in rules.outcomes:
                complete = one_step(COMPLETE, "complete", q, uri=request.uri, outcome=outcome)
                actions.append(complete)
    if not obs.source_control_up:
        actions.append(one_step(RESTORE, "source_control", q, value="up"))
    resumable: list[str] = []
    for held in obs.in_hand:
        if held.queue == q and held.request_id not in resumable:
            resumable.append(held.request_id)
            uri = obs.by_id[held.request_id].uri
            actions.append(one_step(RESUME, "resume", q, uri=uri))
    if fair_only:
        return actions

    heads = bounds.ingest_order()
    if others and budget.heads < len(heads):
        uri = heads[budget.heads]
        if budget.heads and rules.path_classes:
            # The head changes the paths of each class in turn; the first head is the
            # root of the history, in no diff since a last green (.paths).
            for kind in rules.path_classes:
                actions.append(ingest_changing(q, uri, kind.paths))
        else:
            actions.append(one_step(INGEST, "ingest", q, uri=uri))
    if head_due and budget.crashes < bounds.max_crashes:
        # A policy that preempts running builds may also crash right after it did.
        for point in CRASH_POINTS if rules.preempted_states else ADMIT_CRASH_POINTS:
            actions.append(crash_action(q, point))
    if head_due and budget.overlaps < bounds.max_overlaps:
        for point in bounds.stall_points:
            actions.append(one_step(STALL, "stall", q, value=point))
    if head_due:
        if pending[0].failures and budget.outages:
            # The head failed during this path's outage, which may still be going on:
            # free, as its failures are bounded by max_attempts, at which the settle
            # policy dead-letters it.
            actions.append(failed_delivery(OUTAGE_PERSISTS, q))
        elif budget.outages < bounds.max_outages:
            actions.append(failed_delivery(OUTAGE, q))
    if others and budget.duplicates < bounds.max_duplicates:
        for request in obs.heads_of(q):
            if request.state == rules.initial_state:
                actions.append(one_step(REDELIVER, "redeliver", q, uri=request.uri))
    if others and budget.dead_letters < bounds.max_dead_letters:
        for request in obs.heads_of(q):
            if request.state not in rules.terminal_states:
                actions.append(one_step(DEAD_LETTER, "dead_letter", q, uri=request.uri))
    if others and rules.withdrawn_states and budget.cancels < bounds.max_cancels:
        for request in obs.heads_of(q):
            if request.state not in rules.terminal_states:
                actions.append(one_step(CANCEL, "cancel", q, uri=request.uri))
    if others and rules.retryable_states and budget.retries < bounds.max_retries:
        for request in obs.heads_of(q):
            if request.state in rules.retryable_states:
                actions.append(one_step(RETRY, "retry", q, uri=request.uri))
    if rules.pausable:
        if q in obs.paused:
            if head_due or not pending or resumable or resume_anywhere:
                # Resuming commutes with every step but a delivery (a stalled one's rest
                # too), and from a head not yet due a clock advance, a fair step, leads
                # to it: resuming right before a delivery, or with nothing waiting,
                # reaches the stores of every resumed future (docs/check.md).
                actions.append(one_step(UNPAUSE, "config", q, values=((PAUSED, False),)))
        elif head_due and bounds.pauses:
            # Only a delivery reads the pause, and pausing commutes with every other
            # step: pausing right before a due delivery reaches every paused future.
            actions.append(one_step(PAUSE, "config", q, values=((PAUSED, True),)))
    return actions


def perform(world: World, action: Action, *, in_place: bool = False) -> World | None:
    """``action`` applied to a fork of ``world``; ``None`` when it is not a real edge.

    A crash edge whose delivery never reached its crash point, an outage edge whose
    delivery never asked source control, or a stall edge whose delivery finished before
    its stall point, is a plain delivery under another name; it is dropped so every
    explored fault happens where its label says.

    A cancel or a retry the verb refused wrote nothing: no edge either.

    ``in_place`` applies it to ``world`` itself, for the last action taken from a world
    nothing needs afterwards (the search forks every other one): ``world`` is changed
    whether or not the edge is real.
    """
    twin = world if in_place else world.clone()
    asked, stalled = twin.graph.calls, len(twin.in_hand)
    rows = twin.requests.snapshot() if action.kind in (CANCEL, RETRY) else ()
    for commit, paths in action.changed().items():
        twin.graph.set_changes(commit, paths)
    for item in action.steps:
        try:
            apply_step(twin, item, rows=False)
        except (StovepipeError, ValueError) as exc:
            raise StepFailed(f"{item.describe()}: {type(exc).__name__}: {exc}") from exc
    if action.kind == CRASH and twin.armed_crash:
        return None
    if action.kind in (OUTAGE, OUTAGE_PERSISTS) and twin.graph.calls == asked:
        return None
    if action.kind == STALL and len(twin.in_hand) == stalled:
        return None
    if action.kind in (CANCEL, RETRY) and twin.requests.snapshot() == rows:
        return None
    return twin

"""The properties ``check`` proves, as small functions over :class:`Observation` values.

Three families:

- **state invariants** hold in every reachable state;
- **transition invariants** hold on every explored edge (``pre`` -> ``post``): they are
  the properties about *change* (immutability, monotonicity, what an admission saw);
- **progress** (liveness) is a property of the explored graph, decided in
  :mod:`.explorer`; :func:`quiescent` says which states count as "done".

Slot properties are phrased over the states ``request.yaml`` *declares* slot-holding,
not over a hard-coded "processing": the declaration is what the lifecycle derives slot
effects from, so a declaration the durable state contradicts is itself a finding.

With ``bare_counter`` (the seed's anonymous ``in_flight_count``, see :mod:`.variants`)
holders have no identity, so the holder-identity invariants are replaced by their
counting form; the point of that mode is to show the counting form is not enough.

What a run checks is what the policy declares: the machine files name invariants of the
catalogue (:mod:`stovepipe_fsm.machine.invariants`), :data:`CATALOGUE_CHECKS` says which of
the functions here decide each built-in name, and a :class:`Proof` holds the checks one
policy selects (plus those of plugin-registered invariants, which bring their own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from ...config.globs import glob_match
from ...domain.entities import FULL, INCREMENTAL_SINCE_GREEN, NO_STRATEGY, Green, Queue, Request
from ...located.errors import SpecError
from ...machine.invariants import (
    INVARIANTS,
    STATE,
    InvariantCatalog,
    InvariantCheck,
    policy_invariants,
    unknown_invariant,
)
from ...machine.lint import UNKNOWN_INVARIANT
from ...machine.model import InvariantRef
from ...process.catalog import ProcessMachines
from ...process.gate import EVERY_HEAD, KEEP_NEWEST, MAX_BASELINE_LAG, MAX_VALIDATION_MS, PAUSED
from ...process.greens import RECENT_GREENS
from .culprit_invariants import CULPRIT_CHECKS
from .observe import Observation, counter_of
from .paths import PathClass


@dataclass(frozen=True)
class Rules:
    """What the invariants need to know beyond the observation itself."""

    max_concurrent: int
    slot_states: frozenset[str]
    admitted_states: frozenset[str]
    terminal_states: frozenset[str]
    initial_state: str
    superseded_states: frozenset[str]
    outcomes: tuple[str, ...]
    history: Mapping[str, Sequence[str]]
    proof: Proof
    bare_counter: bool = False
    max_baseline_lag: int = 0  # the checked queue's bound (0: none)
    max_validation_ms: int = 0  # the checked queue's slot lease (0: none)
    pausable: bool = False  # the policy declares ``paused``: check pauses and resumes
    #: Where the ``withdraw`` role leads (an operator's cancel); empty: the policy has none.
    withdrawn_states: frozenset[str] = frozenset()
    #: The states an operator's ``retry`` takes a head from; empty: the policy has none.
    retryable_states: frozenset[str] = frozenset()
    #: Where the ``preempt`` role leads; empty: the policy never preempts a running build.
    preempted_states: frozenset[str] = frozenset()
    #: What a head ingested after the first may change (:mod:`.paths`); empty: nothing
    #: the policy reads, so no head changes anything.
    path_classes: tuple[PathClass, ...] = ()
    every_head: bool = False  # the checked queue keeps every head (none superseded)
    keep_newest: int = 0  # the checked queue's heads kept when coalescing (0: max_concurrent)
    recent_greens: int = 1  # the checked queue's recent greens (1: last green alone)

    @property
    def kept(self) -> int:
        """How many of the newest heads the checked queue keeps when it coalesces."""
        return self.keep_newest or self.max_concurrent

    @cached_property
    def state_checks(self) -> tuple[Invariant, ...]:
        """The state invariants the proof declares that apply to this run's counting."""
        return tuple(i for i in self.proof.state if _applies(i, self))

    @cached_property
    def edge_checks(self) -> tuple[Invariant, ...]:
        """The transition invariants the proof declares that apply to this run."""
        return tuple(i for i in self.proof.edge if _applies(i, self))

    @classmethod
    def for_machines(
        cls,
        machines: ProcessMachines,
        *,
        max_concurrent: int,
        history: Mapping[str, Sequence[str]],
        bare_counter: bool = False,
        catalog: InvariantCatalog | None = None,
        queue: str | None = None,
        path_classes: tuple[PathClass, ...] = (),
        scopes: Scopes = (),
        parameters: Mapping[str, Any] | None = None,
    ) -> Rules:
        """The rules of ``machines``, checking the invariants they declare (for ``queue``,
        those declared for it). ``parameters``: the checked queue's resolved parameters,
        for how it chooses heads (``every_head``, ``keep_newest``) and its bounds
        (``max_baseline_lag``, ``max_validation_ms``); the machines' defaults when not
        given."""
        request, roles = machines.request, machines.roles
        chosen = {**machines.parameter_defaults, **(parameters or {})}
        return cls(
            max_concurrent=max_concurrent,
            slot_states=frozenset(request.slot_states),
            admitted_states=roles.admitted_states,
            terminal_states=frozenset(request.terminal),
            initial_state=roles.initial,
            superseded_states=roles.superseded_states,
            outcomes=tuple(roles.outcomes),
            history={k: tuple(v) for k, v in history.items()},
            proof=Proof.declared_by(machines, catalog, queue=queue, scopes=scopes),
            bare_counter=bare_counter,
            max_baseline_lag=int(chosen.get(MAX_BASELINE_LAG, 0)),
            max_validation_ms=int(chosen.get(MAX_VALIDATION_MS, 0)),
            pausable=PAUSED in machines.parameters,
            withdrawn_states=roles.withdrawn_states,
            retryable_states=roles.retryable_states,
            preempted_states=roles.preempted_states,
            path_classes=path_classes,
            every_head=bool(chosen.get(EVERY_HEAD, False)),
            keep_newest=int(chosen.get(KEEP_NEWEST, 0)),
            recent_greens=int(chosen.get(RECENT_GREENS, 1)),
        )

    def newest_green_ancestor(self, greens: Sequence[Green], head: str) -> str:
        """The newest of the first ``recent_greens`` of ``greens`` that is an ancestor of
        ``head`` ("" when none is)."""
        for green in greens[: self.recent_greens]:
            if self.is_ancestor(green.uri, head):
                return green.uri
        return ""

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        seen: set[str] = set()
        frontier = [descendant]
        while frontier:
            commit = frontier.pop()
            if commit == ancestor:
                return True
            if commit not in seen:
                seen.add(commit)
                frontier.extend(self.history.get(commit, ()))
        return False


@dataclass(frozen=True)
class Violation:
    """One broken property: its name, the property in words, and what is wrong here."""

    invariant: str
    summary: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.summary}\n  {self.detail}"


@dataclass(frozen=True)
class Invariant:
    name: str
    summary: str
    check: Callable[..., Iterator[str]]
    holders: bool = True  # applies with identified slot holders
    counter: bool = True  # applies with the bare counter
    #: The catalogue's built-in name it decides (stovepipe_fsm/machine/invariants.py), when
    #: not its own.
    proves: str = ""

    @property
    def catalogue_name(self) -> str:
        return self.proves or self.name


def _label(request: Request) -> str:
    return f"{request.id} ({request.uri}, {request.state})"


def _recorded(request: Request, rules: Rules) -> bool:
    """Strategy and base written: admitted, now or before reaching a terminal state."""
    return request.build_strategy != NO_STRATEGY and (
        request.state in rules.admitted_states or request.state in rules.terminal_states
    )


# --- state invariants -----------------------------------------------------------------


def _slot_states_hold(obs: Observation, rules: Rules) -> Iterator[str]:
    for request in obs.heads:
        if request.id in obs.lease_expired:
            continue  # its lease ran out and the gate reclaimed the slot
        row = obs.queue(request.queue)
        if request.state in rules.slot_states and (row is None or not row.holds(request.id)):
            yield (
                f"{_label(request)} is in a state request.yaml declares slot-holding, "
                "but the queue row does not list it as a holder"
            )


def _holder_is_admitting(obs: Observation, rules: Rules) -> Iterator[str]:
    for row in obs.queues:
        for holder in row.slot_holders:
            request = obs.by_id.get(holder)
            if request is None:
                yield f"queue {row.name}: slot holder {holder} has no request row"
            elif request.state in rules.slot_states:
                continue
            elif request.state != rules.initial_state:
                yield f"{_label(request)} holds a slot of queue {row.name}"
            elif not obs.pending_for(holder) and not obs.in_hand_for(holder):
                yield (
                    f"{_label(request)} holds a slot mid-admission but no process message "
                    "for it is pending or in hand, so nothing will finish or undo the admission"
                )


def _idle_holders_exact(obs: Observation, rules: Rules) -> Iterator[str]:
    for row in obs.queues:
        if obs.busy(row.name):
            continue
        expected = {
            r.id
            for r in obs.heads_of(row.name)
            if r.state in rules.slot_states and r.id not in obs.lease_expired
        }
        if set(row.slot_holders) != expected:
            yield (
                f"queue {row.name} with no message pending: holders "
                f"{sorted(row.slot_holders)} but requests in slot-holding states "
                f"{sorted(expected)}"
            )


def _counter_covers(obs: Observation, rules: Rules) -> Iterator[str]:
    for row in obs.queues:
        holding = [r.id for r in obs.heads_of(row.name) if r.state in rules.slot_states]
        if row.in_flight_count < len(holding):
            yield f"queue {row.name}: in_flight_count {row.in_flight_count} < {holding}"


def _idle_counter_exact(obs: Observation, rules: Rules) -> Iterator[str]:
    for row in obs.queues:
        if obs.busy(row.name):
            continue
        holding = [r.id for r in obs.heads_of(row.name) if r.state in rules.slot_states]
        if row.in_flight_count != len(holding):
            yield (
                f"queue {row.name} with no message pending: in_flight_count "
                f"{row.in_flight_count} but requests in slot-holding states {holding} "
                "(a leaked slot)"
            )


def _within_max(obs: Observation, rules: Rules) -> Iterator[str]:
    for row in obs.queues:
        # Observed rows carry each lease as the time left: 0 is an expired holder.
        expired = sum(1 for _, left in row.leases if left == 0)
        if row.in_flight_count - expired > rules.max_concurrent:
            yield (
                f"queue {row.name}: {row.in_flight_count} slots held "
                f"({sorted(row.slot_holders)}), max_concurrent {rules.max_concurrent}"
            )


def _newest_not_superseded(obs: Observation, rules: Rules) -> Iterator[str]:
    for row in obs.queues:
        newest = obs.newest(row.name)
        if newest is not None and newest.state in rules.superseded_states:
            yield f"{_label(newest)} is the newest head of {row.name} and was superseded"


def _started(obs: Observation, request: Request, how: str = "was {}") -> Iterator[str]:
    """Each start of ``request`` published (its build, its start event), in ``how``."""
    if request.id in obs.builds:
        yield f"{_label(request)} " + how.format("published to build")
    if obs.hook_ids(request.id):
        yield f"{_label(request)} " + how.format("announced as started")


def _superseded_never_started(obs: Observation, rules: Rules) -> Iterator[str]:
    for request in obs.heads:
        if request.state in rules.superseded_states:
            yield from _started(obs, request)


def _withdrawn(request: Request, rules: Rules) -> bool:
    """Whether ``request`` was ended by an operator's cancel: in a state the withdraw role
    leads to, never admitted (a build outcome may lead to the same state, admitted)."""
    return request.state in rules.withdrawn_states and request.build_strategy == NO_STRATEGY


def _withdrawn_never_started(obs: Observation, rules: Rules) -> Iterator[str]:
    for request in obs.heads:
        if _withdrawn(request, rules):
            yield from _started(obs, request, "was withdrawn and {}")


def _withdraws_only_waiting(pre: Observation, post: Observation, rules: Rules) -> Iterator[str]:
    """A cancel ends only a head still in the initial state: one that ends withdrawn from
    any other state overwrote the admission it raced with."""
    if not rules.withdrawn_states:
        return
    for after in post.heads:
        before = pre.by_id.get(after.id)
        if before is None or before.state == after.state or not _withdrawn(after, rules):
            continue
        if before.state != rules.initial_state:
            yield f"{_label(after)} was withdrawn while {before.state}"


def _preempts_only_older(pre: Observation, post: Observation, rules: Rules) -> Iterator[str]:
    """A request newly preempted was running (slot-holding, not yet ended by an outcome)
    and was preempted for a newer head of its queue that is not superseded."""
    if not rules.preempted_states:
        return
    for after in post.heads:
        before = pre.by_id.get(after.id)
        if after.state not in rules.preempted_states or (
            before is not None and before.state == after.state
        ):
            continue
        if before is None or before.state not in rules.slot_states:
            was = before.state if before is not None else "not yet ingested"
            yield f"{_label(after)} was preempted while {was}, not running"
            continue
        by = post.by_id.get(after.superseded_by)
        if by is None or counter_of(by.id) <= counter_of(after.id):
            newer = after.superseded_by or "no head"
            yield f"{_label(after)} was preempted for {newer}, not a newer head"
        elif by.state in rules.superseded_states:
            yield f"{_label(after)} was preempted for {_label(by)}, a head that was not kept"


def _persist_before_publish(obs: Observation, rules: Rules) -> Iterator[str]:
    for request in obs.heads:
        if not _recorded(request, rules):
            yield from _started(obs, request, "was {} before its admission was persisted")


def _one_event_per_admission(obs: Observation, rules: Rules) -> Iterator[str]:
    for request in obs.heads:
        ids = obs.hook_ids(request.id)
        if len(ids) > 1:
            yield f"{_label(request)} was announced under {len(ids)} event ids {sorted(ids)}"


def _strategy_sound(obs: Observation, rules: Rules) -> Iterator[str]:
    for request in obs.heads:
        strategy, base = request.build_strategy, request.base_uri
        if strategy == INCREMENTAL_SINCE_GREEN:
            if not base or not rules.is_ancestor(base, request.uri):
                yield f"{_label(request)} builds incrementally on {base!r}, not an ancestor"
        elif strategy == FULL and base:
            yield f"{_label(request)} is a full build with a base {base!r}"
        if request.state in rules.admitted_states and strategy == NO_STRATEGY:
            yield f"{_label(request)} is admitted with no strategy recorded"


def _dead_letters_failed_closed(obs: Observation, rules: Rules) -> Iterator[str]:
    for request_id in sorted(obs.dead_lettered):
        request = obs.by_id.get(request_id)
        if request is None:
            continue  # a message for no request: nothing to fail closed
        if request.state not in rules.terminal_states:
            yield (
                f"{_label(request)} was dead-lettered, but the reconciler did not fail it closed"
            )
        row = obs.queue(request.queue)
        if row is not None and row.holds(request_id):
            yield f"{_label(request)} was dead-lettered and still holds a slot of {row.name}"


# --- transition invariants ------------------------------------------------------------


def _strategy_immutable(pre: Observation, post: Observation, rules: Rules) -> Iterator[str]:
    for before in pre.heads:
        if before.build_strategy == NO_STRATEGY:
            continue
        after = post.by_id.get(before.id)
        if after is None:
            yield f"{_label(before)} disappeared"
        elif (after.build_strategy, after.base_uri) != (before.build_strategy, before.base_uri):
            yield (
                f"{before.id}: strategy/base {before.build_strategy}/{before.base_uri or '-'} "
                f"became {after.build_strategy}/{after.base_uri or '-'}"
            )


def _last_green_forward(pre: Observation, post: Observation, rules: Rules) -> Iterator[str]:
    for before in pre.queues:
        after = post.queue(before.name)
        old, new = before.last_green_request_id, after.last_green_request_id if after else ""
        if not old:
            continue
        if not new or counter_of(new) < counter_of(old):
            yield f"queue {before.name}: last green moved back from {old} to {new or 'nothing'}"


def _retries_only_latest(pre: Observation, post: Observation, rules: Rules) -> Iterator[str]:
    """A retry (a request that appeared with ``retry_of``) of a queue that coalesces is
    of the head that was its queue's latest: an older commit never becomes latest over a
    newer head, whatever ran between the verb's check and its id."""
    if rules.every_head:
        return
    known = pre.by_id
    for request in post.heads:
        if not request.retry_of or request.id in known:
            continue
        row = pre.queue(request.queue)
        latest = row.latest_request_id if row else ""
        if latest != request.retry_of:
            yield (
                f"{_label(request)} retried {request.retry_of} while the queue's latest "
                f"head was {latest or 'unset'}: trunk validation moved backwards"
            )


def _newer_live(obs: Observation, request: Request, rules: Rules, upto: str = "") -> int:
    """Heads of ``request``'s queue newer than it and not yet terminal, the latest head
    always counted: ``request`` is among the newest N while this is below N.

    ``upto`` (a latest head id) leaves out the heads ingested after it.
    """
    row = obs.queue(request.queue)
    latest = upto or (row.latest_request_id if row else "")
    mine, top = counter_of(request.id), counter_of(latest) if latest else 0
    return sum(
        1
        for other in obs.heads_of(request.queue)
        if mine < counter_of(other.id) <= top
        and (other.id == latest or other.state not in rules.terminal_states)
    )


def _decided_as_latest(pre: Observation, request: Request, rules: Rules) -> bool:
    """A delivery of the request in hand decided on a queue row keeping it among the
    newest max_concurrent heads.

    A delivery is not atomic: ingest can stamp a newer head between the gate decision
    (validated by the slot claim's compare-and-set on the queue row) and the write of
    ``processing``, and nothing re-reads the row in between. An atomic delivery is held
    to "among the newest N at the admission"; a stalled one to "among the newest N of
    the heads the row it decided on knew" (a head that became terminal since only
    lowers the count, so this is what the decision saw, or less).
    """
    return any(
        held.request_id == request.id
        and held.queue_row is not None
        and held.queue_row.latest_request_id
        and (
            held.queue_row.latest_request_id == request.id
            or _newer_live(pre, request, rules, held.queue_row.latest_request_id) < rules.kept
        )
        for held in pre.in_hand
    )


def _admits_latest(pre: Observation, post: Observation, rules: Rules) -> Iterator[str]:
    if rules.every_head:
        return  # every head is kept: any waiting head may be admitted
    for before in _newly(pre, post, rules.admitted_states):
        after = post.by_id[before.id]
        row = pre.queue(after.queue)
        latest = row.latest_request_id if row else ""
        if latest == after.id or _decided_as_latest(pre, before, rules):
            continue
        within = latest and _newer_live(pre, before, rules) < rules.kept
        if rules.kept > 1 and within and counter_of(before.id) < counter_of(latest):
            continue
        yield (
            f"{_label(after)} was admitted while the latest head was {latest or 'unset'}"
            + (
                f" and {_newer_live(pre, before, rules)} newer heads were not yet terminal"
                if rules.kept > 1
                else ""
            )
        )


def _newly(pre: Observation, post: Observation, states: frozenset[str]) -> Iterator[Request]:
    """The requests of ``pre`` (as they were) that entered one of ``states`` in ``post``."""
    for after in post.heads:
        before = pre.by_id.get(after.id)
        if before is not None and after.state in states and before.state not in states:
            yield before


def _rows_seen(pre: Observation, request: Request) -> list[Queue]:
    """The queue rows an admission of ``request`` may have decided on: its queue's row,
    and those its stalled deliveries loaded."""
    stalled = [held.queue_row for held in pre.in_hand if held.request_id == request.id]
    return [row for row in [pre.queue(request.queue), *stalled] if row is not None]


def _keeps_newest_n(pre: Observation, post: Observation, rules: Rules) -> Iterator[str]:
    for before in _newly(pre, post, rules.superseded_states):
        if pre.in_hand_for(before.id):
            continue  # decided on an older row; heads terminal now may have been live then
        if rules.every_head:
            yield f"{_label(before)} was superseded, but its queue keeps every head"
            continue
        newer = _newer_live(pre, before, rules)
        if newer < rules.kept:
            yield (
                f"{_label(before)} was superseded while among the newest "
                f"{rules.kept} heads not yet terminal ({newer} newer)"
            )


def _base_is_green_ancestor(pre: Observation, post: Observation, rules: Rules) -> Iterator[str]:
    for before in _newly(pre, post, rules.admitted_states):
        after = post.by_id[before.id]
        if after.build_strategy != INCREMENTAL_SINCE_GREEN:
            continue
        rows = _rows_seen(pre, before)
        base = after.base_uri
        recorded = {g.uri for row in rows for g in row.greens[: rules.recent_greens]}
        chosen = {rules.newest_green_ancestor(row.greens, before.uri) for row in rows}
        if base in chosen:
            continue
        if base not in recorded:
            why = f"is not a recorded green (recorded: {', '.join(sorted(recorded)) or 'none'})"
        elif not rules.is_ancestor(base, before.uri):
            why = f"is not an ancestor of {before.uri}"
        else:
            newer = " or ".join(sorted(g for g in chosen if g))
            why = f"is not the newest recorded green that is an ancestor ({newer})"
        yield f"{_label(after)} pinned base {base!r}, which {why} at its admit"


def _rewrite_holder_alone(obs: Observation, rules: Rules) -> Iterator[str]:
    for row in obs.queues:
        serial, expired = row.serial_holder, {h for h, left in row.leases if left == 0}
        if not serial or not row.holds(serial) or serial in expired:
            continue
        beside = sorted(h for h in row.slot_holders if h != serial and h not in expired)
        if beside:
            yield f"queue {row.name}: rewrite {serial} holds a slot beside {beside}"


def _rewrite_admitted_alone(pre: Observation, post: Observation, rules: Rules) -> Iterator[str]:
    for before in _newly(pre, post, rules.admitted_states):
        after_row = post.queue(before.queue)
        greens = {r.last_green_uri for r in _rows_seen(pre, before)}
        if not greens or any(not g or rules.is_ancestor(g, before.uri) for g in greens):
            continue  # descends from the last green it may have seen (or none yet)
        if after_row is None or after_row.serial_holder != before.id:
            yield (
                f"{_label(before)} does not descend from last green "
                f"{' or '.join(sorted(greens))} but was admitted without running alone "
                f"(holders {sorted(after_row.slot_holders) if after_row else []})"
            )


def _baseline_lag_bounded(pre: Observation, post: Observation, rules: Rules) -> Iterator[str]:
    bound = rules.max_baseline_lag
    if bound <= 0:
        return
    for before in _newly(pre, post, rules.admitted_states):
        row = pre.queue(before.queue)
        if row is None or not row.last_green_request_id or pre.in_hand_for(before.id):
            continue
        expired = {holder for holder, left in row.leases if left == 0}
        in_flight = sorted(h for h in row.slot_holders if h != before.id and h not in expired)
        if not in_flight:
            continue  # nothing in flight (a lease that ran out is not) could green a newer base
        lag = counter_of(before.id) - counter_of(row.last_green_request_id)
        if lag > bound:
            yield (
                f"{_label(before)} admitted {lag} heads past last green "
                f"{row.last_green_request_id} (max_baseline_lag {bound}) while "
                f"{in_flight} were in flight"
            )


STATE_INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "slot_state_holds_slot",
        "every request in a slot-holding state (processing) holds a slot",
        _slot_states_hold,
        counter=False,
        proves="slot_bookkeeping",
    ),
    Invariant(
        "holder_is_admitting",
        "a holder not in a slot-holding state is accepted with its message still pending "
        "(or a delivery of it in hand)",
        _holder_is_admitting,
        counter=False,
        proves="slot_bookkeeping",
    ),
    Invariant(
        "idle_holders_exact",
        "with no message pending or in hand, the holders are exactly the processing requests",
        _idle_holders_exact,
        counter=False,
        proves="slot_bookkeeping",
    ),
    Invariant(
        "counter_covers_processing",
        "in_flight_count is at least the number of processing requests",
        _counter_covers,
        holders=False,
        proves="slot_bookkeeping",
    ),
    Invariant(
        "idle_counter_exact",
        "with no message pending or in hand, in_flight_count equals the number of processing "
        "requests",
        _idle_counter_exact,
        holders=False,
        proves="slot_bookkeeping",
    ),
    Invariant("max_concurrent", "never more than max_concurrent unexpired slots held", _within_max),
    Invariant(
        "newest_not_superseded",
        "the newest ingested head is never superseded",
        _newest_not_superseded,
    ),
    Invariant(
        "superseded_never_started",
        "a superseded request never got a start event or a build",
        _superseded_never_started,
    ),
    Invariant(
        "withdrawn_never_started",
        "a request an operator's cancel withdrew was never built nor announced",
        _withdrawn_never_started,
        proves="superseded_never_started",  # a withdrawn head, too, ended before admission
    ),
    Invariant(
        "persist_before_publish",
        "a build or start event is only published for a request whose admission "
        "(processing, strategy and base) is persisted",
        _persist_before_publish,
    ),
    Invariant(
        "one_event_per_admission",
        "every start event of one admission carries the same id",
        _one_event_per_admission,
    ),
    Invariant(
        "strategy_sound",
        "incremental builds sit on an ancestor, full builds have no base",
        _strategy_sound,
    ),
    Invariant(
        "dead_letter_failed_closed",
        "a request the runtime dead-lettered is terminal and holds no slot",
        _dead_letters_failed_closed,
    ),
    Invariant(
        "rewrite_holder_alone",
        "a request admitted as a rewrite is the only slot holder of its queue",
        _rewrite_holder_alone,
        counter=False,
        proves="rewrite_runs_alone",
    ),
)

EDGE_INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "withdraws_only_waiting",
        "an operator's cancel withdraws only a head still waiting for admission",
        _withdraws_only_waiting,
        proves="superseded_never_started",
    ),
    Invariant(
        "preempts_only_older",
        "a running build is preempted only for a newer head of its queue that is kept",
        _preempts_only_older,
    ),
    Invariant("strategy_immutable", "strategy and base never change once set", _strategy_immutable),
    Invariant(
        "retries_only_latest",
        "an operator's retry in a queue that coalesces is of its latest head: an older "
        "commit never becomes latest over a newer one",
        _retries_only_latest,
        # A retry of an older head would make an older commit the newest, superseding it.
        proves="newest_not_superseded",
    ),
    Invariant(
        "last_green_forward", "last green never moves back in ingest order", _last_green_forward
    ),
    Invariant(
        "admits_latest",
        "a request is only admitted while it is among the newest keep_newest heads of its "
        "queue not yet terminal, the latest always counted (a delivery stalled in hand: "
        "while it was, among the heads the queue row it decided on knew); any head of a "
        "queue that keeps every head",
        _admits_latest,
    ),
    Invariant(
        "keeps_newest_n",
        "a waiting head is superseded only when no longer among the newest keep_newest "
        "heads not yet terminal; never in a queue that keeps every head",
        _keeps_newest_n,
    ),
    Invariant(
        "base_is_green_ancestor",
        "an incremental admission's base is the newest recorded green at its admit that "
        "is an ancestor of its head",
        _base_is_green_ancestor,
    ),
    Invariant(
        "rewrite_admitted_alone",
        "a head not descending from last green is admitted as the queue's serial holder",
        _rewrite_admitted_alone,
        counter=False,
        proves="rewrite_runs_alone",
    ),
    Invariant(
        "baseline_lag_bounded",
        "an admission with others in flight pins a base within max_baseline_lag",
        _baseline_lag_bounded,
    ),
)

LEASE_BOUNDS_STALL = Invariant(
    "lease_bounds_stall",
    "with max_validation_ms set, deliveries and clock advances alone - no build ever "
    "reporting - reach a state with no message pending and no accepted request waiting",
    lambda *_: iter(()),
)

PROGRESS = Invariant(
    "progress",
    "with deliveries, clock advances and build completions only, every state reaches "
    "one with no message pending and no accepted request waiting",
    lambda *_: iter(()),
)


def finishing(rules: Rules) -> list[tuple[Invariant, bool]]:
    """The liveness properties ``rules`` declare, each with whether build completions
    count as fair for it: progress, and with a slot lease, the lease bounding a stall."""
    found = [(PROGRESS, True)] if rules.proof.progress else []
    if rules.proof.lease_bounds_stall and rules.max_validation_ms:
        found.append((LEASE_BOUNDS_STALL, False))
    return found


ALL_INVARIANTS: tuple[Invariant, ...] = (
    *STATE_INVARIANTS,
    *EDGE_INVARIANTS,
    PROGRESS,
    LEASE_BOUNDS_STALL,
)

# Which checks decide each built-in name of the catalogue: its own, or those that name it;
# culprit finding is proved by its own exploration (.culprits), over its own states.
CATALOGUE_CHECKS: dict[str, tuple[str, ...]] = {
    **{
        name: tuple(i.name for i in ALL_INVARIANTS if i.catalogue_name == name)
        for name in dict.fromkeys(i.catalogue_name for i in ALL_INVARIANTS)
    },
    **dict.fromkeys(CULPRIT_CHECKS, ()),
}


@dataclass(frozen=True)
class Proof:
    """The checks one run makes: those of the invariants the policy declares.

    Built-in checks keep the order of :data:`STATE_INVARIANTS` and :data:`EDGE_INVARIANTS`
    whatever the declaration order, so a state that breaks two properties is reported
    the same way by every policy that declares both; plugin checks come after them.
    """

    names: tuple[str, ...]
    state: tuple[Invariant, ...]
    edge: tuple[Invariant, ...]
    progress: bool
    lease_bounds_stall: bool = False
    #: Declared invariants whose ``queues:`` match none of the checked queue's names.
    out_of_scope: tuple[str, ...] = ()

    @classmethod
    def declared_by(
        cls,
        machines: ProcessMachines,
        catalog: InvariantCatalog | None = None,
        *,
        queue: str | None = None,
        scopes: Scopes = (),
    ) -> Proof:
        """The checks of what ``machines`` declare, found in ``catalog`` (by default the
        policy's own: the shipped invariants and those its plugins registered); with
        ``queue``, only of the invariants declared for that queue (an entry without
        ``queues:`` is for every queue). ``scopes`` (the config's ``invariants:``) replace
        the queues of the entries they name."""
        specs = (machines.request.spec, machines.queue_gate.spec)
        refs = policy_invariants(specs)
        found = catalog if catalog is not None else machines.invariants
        if queue is None:
            return cls.of(refs, found)
        kept = tuple(ref for ref in refs if in_scope(ref, queue, scopes))
        left = tuple(ref.name for ref in refs if not in_scope(ref, queue, scopes))
        return replace(cls.of(kept, found), out_of_scope=left)

    @classmethod
    def of(cls, refs: Sequence[InvariantRef], catalog: InvariantCatalog = INVARIANTS) -> Proof:
        """The checks of ``refs``; a name neither built in nor registered is a located error
        (lint reports it first, unless the machines were loaded without lint)."""
        chosen: set[str] = set()
        state: list[Invariant] = []
        edge: list[Invariant] = []
        for ref in refs:
            if ref.name in CATALOGUE_CHECKS:
                chosen.update(CATALOGUE_CHECKS[ref.name])
                continue
            info = catalog.get(ref.name)
            if info is None or info.check is None:
                raise SpecError([unknown_invariant(ref, catalog, UNKNOWN_INVARIANT)])
            in_state = info.scope == STATE
            bound = Invariant(ref.name, info.summary, _bind(info.check, info.values(ref), in_state))
            (state if in_state else edge).append(bound)
        return cls(
            names=tuple(ref.name for ref in refs),
            state=(*(i for i in STATE_INVARIANTS if i.name in chosen), *state),
            edge=(*(i for i in EDGE_INVARIANTS if i.name in chosen), *edge),
            progress=PROGRESS.name in chosen,
            lease_bounds_stall=LEASE_BOUNDS_STALL.name in chosen,
        )


#: The config's ``invariants:``: invariant name -> the queue names and patterns it is for.
Scopes = tuple[tuple[str, tuple[str, ...]], ...]


def in_scope(ref: InvariantRef, queue: str, scopes: Scopes = ()) -> bool:
    """Whether the invariant ``ref`` declares is held to ``queue``: its queues (or the
    patterns ``scopes``, the config's ``invariants:``, give it) are none, or one of those
    names or ``*`` patterns matches (``config/queues.yaml``'s globs)."""
    chosen = dict(scopes).get(ref.name, ref.queue_patterns)
    return not chosen or any(glob_match(p, queue) for p in chosen)


def _bind(check: InvariantCheck, params: Mapping[str, Any], in_state: bool) -> InvariantCheck:
    """A plugin check with its declaration's parameters, called like the built-in ones."""
    if in_state:
        return lambda obs, rules: check(obs, rules, params)
    return lambda pre, post, rules: check(pre, post, rules, params)


def _applies(invariant: Invariant, rules: Rules) -> bool:
    return invariant.counter if rules.bare_counter else invariant.holders


def check_state(obs: Observation, rules: Rules) -> Violation | None:
    """The first state invariant the policy declares that ``obs`` breaks, if any."""
    for invariant in rules.state_checks:
        for detail in invariant.check(obs, rules):
            return Violation(invariant.name, invariant.summary, detail)
    return None


def check_edge(pre: Observation, post: Observation, rules: Rules) -> Violation | None:
    """The first transition invariant the policy declares that ``pre`` -> ``post`` breaks."""
    for invariant in rules.edge_checks:
        for detail in invariant.check(pre, post, rules):
            return Violation(invariant.name, invariant.summary, detail)
    return None


def quiescent(obs: Observation, rules: Rules) -> bool:
    """Nothing left to do: no message pending or in hand and no accepted request waiting,
    on any queue but a paused one.

    A paused queue holds its heads by intent, for as long as it stays paused: its waiting
    work is no wedge. Once resumed it counts again, so progress is required of it.
    """
    paused = obs.paused
    if any(p.queue not in paused for p in obs.pending):
        return False
    if any(h.queue not in paused for h in obs.in_hand):
        return False
    return all(r.state != rules.initial_state or r.queue in paused for r in obs.heads)


def waiting(obs: Observation, rules: Rules) -> str:
    """Why ``obs`` is not quiescent, for a progress counterexample that no fair
    continuation finishes."""
    parts = []
    accepted = [r for r in obs.heads if r.state == rules.initial_state]
    if accepted:
        parts.append("accepted, waiting: " + ", ".join(f"{r.id} ({r.uri})" for r in accepted))
    if obs.pending:
        parts.append(
            "pending: "
            + ", ".join(f"{p.request_id} (due in {p.due_in_ms} ms)" for p in obs.pending)
        )
    if obs.in_hand:
        parts.append(
            "in hand: " + ", ".join(f"{h.request_id} (stalled {h.point})" for h in obs.in_hand)
        )
    for row in obs.queues:
        parts.append(f"queue {row.name} holders {list(row.slot_holders)}")
    return "no fair continuation finishes: " + "; ".join(parts)

"""Request state changes and the slot effects derived from ``machines/request.yaml``.

Every writer of a Request (ingest, process, record, the DLQ reconciler) goes through
here, so the rules hold in one place:

- no state or trigger is named in code: the machine's roles (:mod:`.roles`) say which
  trigger admits, supersedes, or fails a request closed, and which state a new one is in;

- the compiled ``request`` machine decides whether a trigger is legal and where it leads;
- the Request write is a compare-and-set on ``version`` (new = old + 1, assigned only
  after the store accepted it);
- *taking* a slot happens before entering a slot-holding state (``claim_slot``, its own
  ordered CAS on the queue row), so a processing request always holds a slot;
- *releasing* happens after entering a terminal state, from any source state, and is
  idempotent: a retry that finds the request already terminal still makes sure the slot
  is free. Between the two writes (in progress, or left by a crash) the request is a
  terminal holder; ``release_stale_holders`` finishes that window on the next gate check
  exactly as the second write would have: slot freed *and*, for a green end, last green
  advanced.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

from ..domain.entities import FULL, INCREMENTAL_SINCE_GREEN, Green, Queue, Request, evolve
from ..domain.errors import NotFound, Retryable, VersionMismatch
from ..domain.ids import compare_request_id
from ..machine.compiler import CompiledLifecycle, IllegalTransition, Step
from ..ports.clock import Clock
from ..ports.stores import QueueStore, RequestStore
from .roles import RequestRoles

log = logging.getLogger("stovepipe_fsm.lifecycle")

QUEUE_CAS_ATTEMPTS = 16
QueueChange = Callable[[Queue], Queue]
#: ``greens_kept(queue)``: how many recent greens ``queue`` keeps (None: as many as it has).
GreensKept = Callable[[str], int | None]


def advance_last_green(request: Request, keep: int | None = None) -> QueueChange:
    """A queue change that records ``request`` as a green of its queue: last green moves
    to it if it is newer (ingest order), and it joins the newest ``keep`` recent greens
    (None: as many as the row holds)."""
    green = Green(request.uri, request.id, request.ended_at_ms)

    def newer(a: str, b: str) -> bool:
        # A green recorded without its request (a row set by hand) is older than any.
        if not a or not b:
            return bool(a)
        return compare_request_id(request.queue, a, b) > 0

    def change(queue: Queue) -> Queue:
        return queue.with_green(green, keep, newer=newer)

    return change


async def update_queue(queues: QueueStore, name: str, change: QueueChange) -> Queue:
    """Read-modify-CAS the queue row ``name``, retrying lost races a bounded number of times.

    A change that leaves the row as it is writes nothing.
    """
    for _ in range(QUEUE_CAS_ATTEMPTS):
        queue = await queues.get(name)
        target = change(queue)
        if target == queue:
            return queue
        try:
            await queues.update(target, queue.version, queue.version + 1)
        except VersionMismatch:
            continue
        return target.with_version(queue.version + 1)
    raise Retryable(f"queue {name!r}: row contended; gave up after {QUEUE_CAS_ATTEMPTS} CAS")


@dataclass(eq=False)
class RequestLifecycle:
    machine: CompiledLifecycle
    roles: RequestRoles
    requests: RequestStore
    queues: QueueStore
    _: KW_ONLY
    #: Stamps admitted_at_ms and ended_at_ms on the writes that admit and end.
    clock: Clock | None = None
    #: Ask a plugin's guard off the event loop, within its budget (a service).
    offload: bool = False
    #: How many recent greens a queue keeps (its ``recent_greens``); without it a
    #: green end keeps as many as the row holds.
    greens_kept: GreensKept | None = None

    def __post_init__(self) -> None:
        # Per state, whether ending there is the green outcome's end (end_change asks it
        # on every terminal write).
        self._green_end = {
            state: outcome is not None and outcome.green
            for state in self.machine.spec.state_names
            for outcome in (self.roles.outcome_of_state(state),)
        }

    def new_request(self, request_id: str, queue: str, uri: str) -> Request:
        """A freshly ingested head, in the machine's initial state (not yet stored)."""
        return Request(id=request_id, queue=queue, uri=uri, state=self.roles.initial)

    async def plan(self, request: Request, trigger: str) -> Step:
        """What firing ``trigger`` would do, without writing anything. A plugin's guard
        on the way is asked within its budget: one that hangs or exits fails the write
        retryably and never holds the event loop."""
        return await self.machine.decide(request.state, trigger, request, offload=self.offload)

    async def plan_admit(self, request: Request) -> Step:
        return await self.plan(request, self.roles.admit)

    def is_terminal(self, request: Request) -> bool:
        return self.machine.is_terminal(request.state)

    def end_change(self, request: Request) -> QueueChange | None:
        """What ``request``'s end does to its queue row besides freeing the slot.

        A request ended in the green outcome's state advances last green; any other end
        changes nothing else. Record applies it with the release, and so does whoever
        finishes a release record did not get to.
        """
        if not self._green_end.get(request.state) or request.probe_of:
            return None  # a probe's green is recorded by its search (record_probe_green)
        keep = self.greens_kept(request.queue) if self.greens_kept is not None else None
        return advance_last_green(request, keep)

    def is_admitted(self, request: Request) -> bool:
        """In a state the admit trigger leads to."""
        return request.state in self.roles.admitted_states

    async def start_probe(
        self, request_id: str, queue: str, commit: str, *, probe_of: str, base: str
    ) -> Request:
        """Store a probe of ``commit`` for the red head ``probe_of``, admitted: in the
        state the admit trigger leads to from the initial one, built on ``base`` (full
        without one), in one create. A probe takes no build slot (its search holds a
        probe slot for it). ``AlreadyExists`` when it was stored before: a repeat."""
        initial = self.new_request(request_id, queue, commit)
        step = await self.plan(initial, self.roles.admit)
        now = self.clock.now_ms() if self.clock is not None else 0
        probe = evolve(
            initial,
            state=step.dest,
            build_strategy=INCREMENTAL_SINCE_GREEN if base else FULL,
            base_uri=base,
            probe_of=probe_of,
            ingested_at_ms=now,
            admitted_at_ms=now,
        )
        await self.requests.create(probe)
        return probe

    async def record_probe_green(self, probe: Request, below: Sequence[str]) -> Queue:
        """Record ``probe``'s commit as its queue's newest green, if the newest green the
        row lists is one of ``below`` (the search's base and the blamelist commits under
        the probe's): only then is the probe's commit newer than every recorded green.
        Otherwise (trunk went green again meanwhile) the row is left as it is."""
        keep = self.greens_kept(probe.queue) if self.greens_kept is not None else None
        green = Green(probe.uri, probe.id, probe.ended_at_ms)
        under = frozenset(below)

        def change(queue: Queue) -> Queue:
            greens = queue.greens
            if greens and greens[0].uri not in under:
                return queue
            return queue.with_green(green, keep, newer=lambda a, b: a == probe.id)

        return await self.update_queue(probe.queue, change)

    async def admit(self, request: Request, planned: Step, strategy: str, base: str) -> Request:
        """Persist the admission ``planned`` for ``request``: strategy and base, once."""
        return await self.apply(
            request, self.roles.admit, planned=planned, build_strategy=strategy, base_uri=base
        )

    async def supersede(self, request: Request, by: str, *, loaded: Queue | None = None) -> Request:
        """Mark ``request`` superseded by ``by``.

        ``loaded``: the queue row the decision was made on. When it shows nothing for the
        end to settle (R holds no slot there), the settle read is skipped: a slot R claims
        after that read comes from another delivery of R, whose admit write then loses to
        this one and releases its claim (or, had it crashed, leaves a terminal holder the
        gate reclaims).
        """
        return await self.apply(request, self.roles.supersede, settled_in=loaded, superseded_by=by)

    async def skip(self, request: Request, *, loaded: Queue | None = None) -> Request:
        """End ``request`` unbuilt (the ``skip`` role): nothing it changed needs a build.

        ``loaded`` as for :meth:`supersede`. Raises ``ValueError`` when the policy's
        request machine declares no ``skip`` role.
        """
        why = "a queue with skip_paths needs one (a terminal state for heads ended unbuilt)"
        return await self.apply(request, self._declared("skip", why), settled_in=loaded)

    async def preempt(self, request: Request, by: str) -> Request:
        """End ``request``'s running build for the newer head ``by`` (the ``preempt``
        role): terminal, slot freed, ``superseded_by`` naming ``by``.

        Raises ``ValueError`` when the policy's request machine declares no ``preempt``
        role, ``IllegalTransition`` when ``request`` is not in a state it leaves (it
        ended meanwhile) and ``VersionMismatch`` when it changed underneath.
        """
        why = "a gate that preempts running builds needs one (a terminal state for them)"
        return await self.apply(request, self._declared("preempt", why), superseded_by=by)

    def _declared(self, role: str, why: str) -> str:
        """The trigger of the optional ``role``; ``ValueError`` saying ``why`` without one."""
        trigger: str = getattr(self.roles, role)
        if not trigger:
            raise ValueError(f"machine {self.machine.spec.name!r} declares no role {role!r}; {why}")
        return trigger

    async def fail_closed(self, request: Request) -> Request:
        return await self.apply(request, self.roles.dead_letter)

    async def claim_slot(
        self,
        queue: Queue,
        request: Request,
        trigger: str | Step,
        *,
        expires_at_ms: int | None = None,
        serial: bool = False,
    ) -> Queue:
        """CAS the queue row so ``request`` holds a slot, if ``trigger`` takes one.

        ``trigger`` may be a step already planned for this request. ``expires_at_ms``
        makes the slot a lease; ``serial`` marks the holder as one that runs alone.
        Idempotent: a queue that already lists the request (with a live lease) is
        returned unchanged with no write. A lost race raises ``VersionMismatch``; the
        caller reloads and re-gates.
        """
        step = await self.plan(request, trigger) if isinstance(trigger, str) else trigger
        if not step.takes_slot:
            return queue
        claimed = queue.with_holder(request.id, expires_at_ms=expires_at_ms, serial=serial)
        if claimed == queue:
            return queue
        new_version = queue.version + 1
        await self.queues.update(claimed, queue.version, new_version)
        return claimed.with_version(new_version)

    async def apply(
        self,
        request: Request,
        trigger: str,
        *,
        queue_change: QueueChange | None = None,
        planned: Step | None = None,
        settled_in: Queue | None = None,
        **changes: Any,
    ) -> Request:
        """Fire ``trigger`` on ``request`` and persist it; release the slot on terminal.

        ``queue_change`` is applied to the queue row in the same CAS as the release (record
        advances last green that way). ``planned`` is a step the machine already decided
        for this very request state (admit plans once to claim the slot, then applies that
        plan). ``settled_in`` is a queue row on which the end has nothing to settle, as the
        caller has established, so no settle read follows. Raises ``IllegalTransition``
        when the machine refuses and
        ``VersionMismatch`` when the request changed underneath.
        """
        if planned is not None and (planned.source, planned.trigger) == (request.state, trigger):
            step = planned
        else:
            step = await self.plan(request, trigger)
        admitted_at, ended_at = self._times(request, step)
        updated = evolve(
            request, state=step.dest, admitted_at_ms=admitted_at, ended_at_ms=ended_at, **changes
        )
        new_version = request.version + 1
        await self.requests.update(updated, request.version, new_version)
        updated = updated.with_version(new_version)
        if (step.releases_slot or queue_change is not None) and not self._settled(
            updated, queue_change, settled_in
        ):
            await self.settle_queue(updated, queue_change)
        return updated

    def _settled(
        self, request: Request, queue_change: QueueChange | None, queue: Queue | None
    ) -> bool:
        """``queue`` is given and settling ``request`` on it would change nothing."""
        if queue is None:
            return False
        if (
            queue_change is None
            and self.machine.is_terminal(request.state)
            and not self._green_end.get(request.state)
        ):
            return not queue.holds(request.id)  # the whole change: drop the holder
        return self._settle_change(request, queue_change)(queue) == queue

    def _times(self, request: Request, step: Step) -> tuple[int, int]:
        """``request``'s admitted and ended times after ``step``: now for the step that
        admits or ends it, written once like the strategy."""
        admitted, ended = request.admitted_at_ms, request.ended_at_ms
        if self.clock is not None:
            if step.takes_slot and not admitted:
                admitted = self.clock.now_ms()
            if step.releases_slot and not ended:
                ended = self.clock.now_ms()
        return admitted, ended

    async def settle_queue(
        self, request: Request, queue_change: QueueChange | None = None
    ) -> Queue:
        """Make the queue row reflect a terminal ``request``: slot freed, change applied.

        Without ``queue_change`` the request's own :meth:`end_change` is applied (a green
        end advances last green). Safe to repeat: releasing a slot that is not held and
        re-applying a monotonic change both leave the row as it is, with no write.
        """
        return await self.update_queue(request.queue, self._settle_change(request, queue_change))

    def _settle_change(self, request: Request, queue_change: QueueChange | None) -> QueueChange:
        terminal = self.machine.is_terminal(request.state)
        if queue_change is None and terminal:
            queue_change = self.end_change(request)

        def change(queue: Queue) -> Queue:
            if terminal:
                queue = queue.without_holder(request.id)
            return queue_change(queue) if queue_change else queue

        return change

    async def release_claim(self, request: Request) -> Queue:
        """Drop ``request``'s slot whatever its state: a claim its admit write lost.

        Only for a request whose current state holds no slot (the caller checked): its
        claim was made for an admission that did not happen.
        """
        return await self.update_queue(request.queue, lambda q: q.without_holder(request.id))

    async def reclaim_expired(self, name: str, holders: Sequence[str], now_ms: int) -> Queue:
        """Drop each of ``holders`` whose lease has run out at ``now_ms`` from the queue
        row ``name``, in one CAS; a holder renewed or released meanwhile is left as the
        row has it. The requests themselves are not touched (their own ends find nothing
        left to free)."""

        def reclaim(row: Queue) -> Queue:
            for holder in holders:
                if row.is_expired(holder, now_ms):
                    row = row.without_holder(holder)
            return row

        return await self.update_queue(name, reclaim)

    async def update_queue(self, name: str, change: QueueChange) -> Queue:
        """Read-modify-CAS the queue row, retrying lost races a bounded number of times."""
        return await update_queue(self.queues, name, change)

    async def release_stale_holders(self, queue: Queue, keep: str) -> Queue:
        """Finish the end of requests still listed as holders although they ended.

        Record ends a request with two writes (the request, then the queue row); between
        them the request is a terminal holder. Whoever sees one first finishes the second
        write exactly as record would: the slot is freed and a green end advances last
        green, in one queue-row CAS, so a head gated in that window is admitted on the
        new last green. Only terminal holders are touched; an accepted holder is mid-admit
        and its own redelivery will finish or supersede it. ``keep`` (the request in hand)
        is skipped.
        """
        ended: list[Request] = []
        for holder in queue.slot_holders:
            if holder == keep:
                continue
            try:
                held = await self.requests.get(holder)
            except NotFound:
                log.warning("queue %s: slot holder %s has no request row", queue.name, holder)
                continue
            if self.machine.is_terminal(held.state):
                ended.append(held)
        if not ended:
            return queue
        log.info(
            "queue %s: finishing the end of %s", queue.name, [f"{r.id} ({r.state})" for r in ended]
        )
        changes = [self.end_change(r) for r in ended]

        def finish(row: Queue) -> Queue:
            for request, change in zip(ended, changes, strict=True):
                row = row.without_holder(request.id)
                row = change(row) if change is not None else row
            return row

        return await self.update_queue(queue.name, finish)


__all__ = ["IllegalTransition", "RequestLifecycle", "advance_last_green", "update_queue"]

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
  is free. A crash between the two writes leaves a terminal holder, which
  ``release_stale_holders`` reclaims on the next gate check.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..domain.entities import Queue, Request
from ..domain.errors import NotFound, Retryable, VersionMismatch
from ..ports.stores import QueueStore, RequestStore
from ..spec.compiler import CompiledLifecycle, IllegalTransition, Step
from .roles import RequestRoles

log = logging.getLogger("stovepipe_fsm.lifecycle")

QUEUE_CAS_ATTEMPTS = 16
QueueChange = Callable[[Queue], Queue]


class RequestLifecycle:
    def __init__(
        self,
        machine: CompiledLifecycle,
        roles: RequestRoles,
        requests: RequestStore,
        queues: QueueStore,
    ) -> None:
        self.machine = machine
        self.roles = roles
        self.requests = requests
        self.queues = queues

    def new_request(self, request_id: str, queue: str, uri: str) -> Request:
        """A freshly ingested head, in the machine's initial state (not yet stored)."""
        return Request(id=request_id, queue=queue, uri=uri, state=self.roles.initial)

    def plan(self, request: Request, trigger: str) -> Step:
        """What firing ``trigger`` would do, without writing anything."""
        return self.machine.fire(request.state, trigger, request)

    def plan_admit(self, request: Request) -> Step:
        return self.plan(request, self.roles.admit)

    def is_terminal(self, request: Request) -> bool:
        return self.machine.is_terminal(request.state)

    def is_waiting(self, request: Request) -> bool:
        """Still in the initial state: ingested, not yet admitted or ended."""
        return request.state == self.roles.initial

    def is_admitted(self, request: Request) -> bool:
        """In a state the admit trigger leads to."""
        return request.state in self.roles.admitted_states

    async def admit(self, request: Request, planned: Step, strategy: str, base: str) -> Request:
        """Persist the admission ``planned`` for ``request``: strategy and base, once."""
        return await self.apply(
            request, self.roles.admit, planned=planned, build_strategy=strategy, base_uri=base
        )

    async def supersede(self, request: Request, by: str) -> Request:
        return await self.apply(request, self.roles.supersede, superseded_by=by)

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
        step = self.plan(request, trigger) if isinstance(trigger, str) else trigger
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
        **changes: Any,
    ) -> Request:
        """Fire ``trigger`` on ``request`` and persist it; release the slot on terminal.

        ``queue_change`` is applied to the queue row in the same CAS as the release (record
        advances last green that way). ``planned`` is a step the machine already decided
        for this very request state (admit plans once to claim the slot, then applies that
        plan). Raises ``IllegalTransition`` when the machine refuses and
        ``VersionMismatch`` when the request changed underneath.
        """
        if planned is not None and (planned.source, planned.trigger) == (request.state, trigger):
            step = planned
        else:
            step = self.plan(request, trigger)
        updated = replace(request, state=step.dest, **changes)
        new_version = request.version + 1
        await self.requests.update(updated, request.version, new_version)
        updated = updated.with_version(new_version)
        if step.releases_slot or queue_change is not None:
            await self.settle_queue(updated, queue_change)
        return updated

    async def settle_queue(
        self, request: Request, queue_change: QueueChange | None = None
    ) -> Queue:
        """Make the queue row reflect a terminal ``request``: slot freed, change applied.

        Safe to repeat: releasing a slot that is not held and re-applying a monotonic
        change both leave the row as it is, with no write.
        """

        def change(queue: Queue) -> Queue:
            if self.machine.is_terminal(request.state):
                queue = queue.without_holder(request.id)
            return queue_change(queue) if queue_change else queue

        return await self.update_queue(request.queue, change)

    async def release_claim(self, request: Request) -> Queue:
        """Drop ``request``'s slot whatever its state: a claim its admit write lost.

        Only for a request whose current state holds no slot (the caller checked): its
        claim was made for an admission that did not happen.
        """
        return await self.update_queue(request.queue, lambda q: q.without_holder(request.id))

    async def update_queue(self, name: str, change: QueueChange) -> Queue:
        """Read-modify-CAS the queue row, retrying lost races a bounded number of times."""
        for _ in range(QUEUE_CAS_ATTEMPTS):
            queue = await self.queues.get(name)
            target = change(queue)
            if target == queue:
                return queue
            try:
                await self.queues.update(target, queue.version, queue.version + 1)
            except VersionMismatch:
                continue
            return target.with_version(queue.version + 1)
        raise Retryable(f"queue {name!r}: row contended; gave up after {QUEUE_CAS_ATTEMPTS} CAS")

    async def release_stale_holders(self, queue: Queue, keep: str) -> Queue:
        """Free slots still held by terminal requests (a crash after the terminal write).

        Only terminal holders are released; an accepted holder is mid-admit and its own
        redelivery will finish or supersede it. ``keep`` (the request in hand) is skipped.
        """
        stale = []
        for holder in queue.slot_holders:
            if holder == keep:
                continue
            try:
                held = await self.requests.get(holder)
            except NotFound:
                log.warning("queue %s: slot holder %s has no request row", queue.name, holder)
                continue
            if self.machine.is_terminal(held.state):
                stale.append(holder)
        if not stale:
            return queue
        log.warning("queue %s: releasing slots of terminal requests %s", queue.name, stale)

        def release(row: Queue) -> Queue:
            for holder in stale:
                row = row.without_holder(holder)
            return row

        return await self.update_queue(queue.name, release)


__all__ = ["IllegalTransition", "RequestLifecycle"]

"""Record a build outcome: one Request CAS to a terminal state, then the queue row, then
the end announcement.

The queue-row CAS releases the request's slot and, for the outcome the request machine
declares green, advances the last-green bookmark by ingest order: a green for an older
head than the current bookmark never moves it back. After both writes the end of the
validation is announced on the hook topic (:func:`announce_end`), and last the end is
noted in the decision trail. Repeating a record with the same outcome is a no-op that
still makes sure the slot is released and the bookmark applied, and announces and notes
the end only if no note of it is kept (:func:`end_once`): an outcome repeated however late
never stores a second end event. Recording a *different*
outcome for a request that already ended is refused (``NonRetryable``), never applied;
so is one for a head that ended without being admitted (superseded, cancelled): the outcome
is moot. So is an outcome for a head whose running build a newer head preempted (the
``preempt`` role of a policy that declares it): nothing is applied and nothing refused,
the trail notes it and the end (``preempted``) is announced again, so a crash between the
preemption and its announcement is healed by the build's own report. An outcome for a
head not yet admitted raises ``NotYetAdmitted`` (retryable). Last, with a policy that
declares ``machines/culprit.yaml``, the end goes to the queue's culprit search (a red
head starts one, a probe's result narrows it).
"""

from __future__ import annotations

from ..domain.entities import Request
from ..domain.errors import AlreadyEnded, NotYetAdmitted
from ..domain.hooks import ended_event
from ..domain.trail_record import ENDED
from ..process.culprit import CulpritFinder
from ..process.gate import announce_start_before_end
from ..process.services import StageServices
from ..process.trail_notes import note


async def announce_end(services: StageServices, request: Request) -> bool:
    """Announce that ``request``'s validation ended; ``False`` when there is nothing to say.

    Only a request that was admitted (its strategy is written) started a validation, so
    only such a request announces its end: a superseded head, or one failed closed before
    admission, never started; nor does a probe. The event is named for the outcome whose
    state the request is in (the dead-letter role ends in ``failed``, as the build outcome
    does), and its id is that of the terminal write, so announcing twice publishes one
    event.
    """
    if (
        not services.lifecycle.is_terminal(request)
        or not request.build_strategy
        or request.probe_of
    ):
        return False  # a probe is not a validation of trunk: its search announces
    name = ended_as(services, request)
    event = ended_event(request.queue, request.id, name, request.version, services.clock.now_ms())
    await services.publisher.publish_hook(event)
    return True


def ended_as(services: StageServices, request: Request) -> str:
    """The outcome whose state ``request`` ended in (its state when no outcome ends there)."""
    outcome = services.roles.outcome_of_state(request.state)
    return outcome.name if outcome is not None else request.state


async def end_once(
    services: StageServices, request: Request, *, repeat: bool, outcome: str, by: str
) -> None:
    """Announce ``request``'s end, then note it (``outcome``, reported ``by`` whom).

    ``repeat``: the request was found ended already. Its end is announced and noted again
    only while the trail holds no ``ended`` record of it (a crash came between the terminal
    write and the note): the note follows the announcement, so a kept note means the
    announcement was made, and however late an outcome or a dead letter is repeated, no
    second end event is stored.
    """
    if repeat and await services.trail.has(request.id, ENDED):
        return
    await announce_end(services, request)
    await note(services, ENDED, request, outcome=outcome, by=by)


class Record:
    """Applies build outcomes, named as ``machines/request.yaml`` declares them, then
    hands each end to the queue's culprit search when the policy has one."""

    def __init__(self, services: StageServices, culprits: CulpritFinder | None = None) -> None:
        self.services = services
        self.lifecycle = services.lifecycle
        self.roles = services.roles
        self.culprits = culprits

    async def complete(self, request_id: str, outcome: str, *, by: str = "build") -> Request:
        """Record ``outcome`` for ``request_id`` as reported ``by`` (build, operator);
        ``ValueError`` for an undeclared outcome, ``AlreadyEnded`` (non-retryable) when the
        request already ended with another outcome or without admission, ``NotYetAdmitted``
        while it is still in the initial state (it may yet be admitted; a caller retries)."""
        declared = self.roles.outcome(outcome)
        request = await self.lifecycle.requests.get(request_id)
        if request.state == self.roles.initial:
            raise NotYetAdmitted(
                f"request {request_id!r} is {request.state}, not yet admitted; "
                f"{outcome} is kept until it is"
            )
        if request.state in self.roles.preempted_states:
            moot, tag = request.state, f"moot:{outcome}"
            await note(self.services, ENDED, request, tag=tag, outcome=outcome, by=by, moot=moot)
            await announce_end(self.services, request)
            return request
        repeat = self.lifecycle.is_terminal(request)
        if repeat:
            if request.state not in declared.states:
                raise AlreadyEnded(
                    f"request {request_id!r} is already {request.state}; cannot record {outcome}"
                )
            await self.lifecycle.settle_queue(request)
        else:
            await announce_start_before_end(self.services, request)
            request = await self.lifecycle.apply(request, declared.trigger)
        await end_once(self.services, request, repeat=repeat, outcome=outcome, by=by)
        if self.culprits is not None:
            # After the end is durable and announced; a repeat runs it again (the search
            # ignores an end it has seen, and finishes what a crash left undone).
            await self.culprits.ended(request, declared)
        return request

"""Record a build outcome: one Request CAS to a terminal state, then the queue row.

The queue-row CAS releases the request's slot and, for the outcome the request machine
declares green, advances the last-green bookmark by ingest order: a green for an older
head than the current bookmark never moves it back. Repeating a record with the same
outcome is a no-op that still makes sure the slot is released and the bookmark applied
(a crash between the two writes).
"""

from __future__ import annotations

from dataclasses import replace

from ..domain.entities import Queue, Request
from ..domain.errors import NonRetryable
from ..domain.ids import compare_request_id
from ..process.lifecycle import QueueChange
from ..process.services import StageServices


def advance_last_green(request: Request) -> QueueChange:
    """A queue change that moves last green to ``request`` if it is newer."""

    def change(queue: Queue) -> Queue:
        current = queue.last_green_request_id
        if current and compare_request_id(queue.name, request.id, current) <= 0:
            return queue
        return replace(queue, last_green_uri=request.uri, last_green_request_id=request.id)

    return change


class Record:
    """Applies build outcomes, named as ``machines/request.yaml`` declares them."""

    def __init__(self, services: StageServices) -> None:
        self.lifecycle = services.lifecycle
        self.roles = services.roles

    async def complete(self, request_id: str, outcome: str) -> Request:
        """Record ``outcome`` for ``request_id``; ``ValueError`` for an undeclared outcome."""
        declared = self.roles.outcome(outcome)
        request = await self.lifecycle.requests.get(request_id)
        change = advance_last_green(request) if declared.green else None
        if self.lifecycle.is_terminal(request):
            if request.state not in declared.states:
                raise NonRetryable(
                    f"request {request_id!r} is already {request.state}; cannot record {outcome}"
                )
            await self.lifecycle.settle_queue(request, change)
            return request
        return await self.lifecycle.apply(request, declared.trigger, queue_change=change)

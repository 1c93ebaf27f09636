"""The dead-letter reconciler: force a Request terminal so its queue moves.

A Request whose messages exhausted their retries would otherwise hold its slot forever
and wedge the whole queue. The request machine's ``dead_letter`` role names the trigger
(``fail_closed`` in the shipped machine: conservative, no green is recorded); its
terminal destination frees the slot through the lifecycle's terminal release, and a request
that had been admitted announces its end (``failed`` in the shipped machine) as record does.
Idempotent: an already terminal Request only gets its slot released, if it still holds one,
and its end announced and noted only if no note of it is kept (:func:`.record.end_once`).
"""

from __future__ import annotations

from ..domain.entities import Request
from ..domain.errors import NotFound, VersionMismatch
from ..domain.trail_record import DEAD_LETTERED
from ..process.gate import announce_start_before_end
from ..process.services import StageServices
from ..process.trail_notes import note
from .record import end_once, ended_as

FAIL_CLOSED_ATTEMPTS = 8


class DeadLetterReconciler:
    def __init__(self, services: StageServices) -> None:
        self.services = services
        self.lifecycle = services.lifecycle

    async def reconcile(
        self, request_id: str, *, error: str = "", attempts: int = 0
    ) -> Request | None:
        """Fail ``request_id`` closed; ``None`` when no such request exists.

        ``error`` and ``attempts`` are the dead letter's: noted in the trail with the end.
        """
        for _ in range(FAIL_CLOSED_ATTEMPTS):
            try:
                request = await self.lifecycle.requests.get(request_id)
            except NotFound:
                return None
            repeat = self.lifecycle.is_terminal(request)
            if repeat:
                await self.lifecycle.settle_queue(request)
            else:
                await announce_start_before_end(self.services, request)
                try:
                    request = await self.lifecycle.fail_closed(request)
                except VersionMismatch:
                    continue
            await note(self.services, DEAD_LETTERED, request, error=error, attempts=attempts)
            outcome = ended_as(self.services, request)
            await end_once(self.services, request, repeat=repeat, outcome=outcome, by="reconciler")
            return request
        raise VersionMismatch(f"request {request_id!r} kept changing while failing it closed")

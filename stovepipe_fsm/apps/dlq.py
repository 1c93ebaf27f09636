"""The dead-letter reconciler: force a Request terminal ``failed`` so its queue moves.

A Request whose messages exhausted their retries would otherwise hold its slot forever
and wedge the whole queue. Forcing ``failed`` is conservative (no green is recorded) and
frees the slot through the lifecycle's terminal release. Idempotent: an already
terminal Request only gets its slot released, if it still holds one.
"""

from __future__ import annotations

from ..domain.entities import Request
from ..domain.errors import NotFound, VersionMismatch
from ..process.lifecycle import RequestLifecycle

FAIL_CLOSED_ATTEMPTS = 8


class DeadLetterReconciler:
    def __init__(self, lifecycle: RequestLifecycle) -> None:
        self.lifecycle = lifecycle

    async def reconcile(self, request_id: str) -> Request | None:
        """Fail ``request_id`` closed; ``None`` when no such request exists."""
        for _ in range(FAIL_CLOSED_ATTEMPTS):
            try:
                request = await self.lifecycle.requests.get(request_id)
            except NotFound:
                return None
            if self.lifecycle.is_terminal(request):
                await self.lifecycle.settle_queue(request)
                return request
            try:
                return await self.lifecycle.apply(request, "fail_closed")
            except VersionMismatch:
                continue
        raise VersionMismatch(f"request {request_id!r} kept changing while failing it closed")

"""Alternative wirings of a :class:`World`, for showing why the shipped design is as it is.

:class:`BareCounterLifecycle` is the seed's ``in_flight_count``: an anonymous number
that admission increments and that only a request *leaving processing* decrements. The
queue row keeps the number as anonymous tokens in ``slot_holders`` (so
``in_flight_count`` and the gate condition read it unchanged), but no token names a
request, so

- a claim is not idempotent: a redelivery after a crash between "count += 1" and
  "request -> processing" counts itself as somebody else and waits for a slot it holds;
- a release cannot tell whether it already happened, so a terminal write that did not
  come from processing (supersede or fail-closed of a half-admitted head) frees nothing.

``check --bare-counter`` runs the real controller on this lifecycle to exhibit the wedge
and the leak that identified slot holders prevent. It is a demonstration, not a policy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...domain.entities import Queue, Request
from ...machine.compiler import Step
from ...process.lifecycle import QueueChange, RequestLifecycle
from ...process.services import LifecycleFactory

COUNT_TOKEN = "in_flight#"


def _keep(queue: Queue) -> Queue:
    return queue


class BareCounterLifecycle(RequestLifecycle):
    """The lifecycle with the seed's bare counter in place of slot holders."""

    async def claim_slot(
        self,
        queue: Queue,
        request: Request,
        trigger: str | Step,
        *,
        expires_at_ms: int | None = None,
        serial: bool = False,
    ) -> Queue:
        """count += 1, every time it is called: there is no holder to recognise (nor a
        lease or a serial mark to give it)."""
        step = await self.plan(request, trigger) if isinstance(trigger, str) else trigger
        if not step.takes_slot:
            return queue
        token = f"{COUNT_TOKEN}{queue.in_flight_count + 1}"
        claimed = replace(queue, slot_holders=(*queue.slot_holders, token))
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
        """count -= 1 only on a terminal transition out of a slot-holding state."""
        step = planned if planned is not None else await self.plan(request, trigger)
        updated = replace(request, state=step.dest, **changes)
        new_version = request.version + 1
        await self.requests.update(updated, request.version, new_version)
        updated = updated.with_version(new_version)
        frees = step.releases_slot and self.machine.holds_slot(request.state)
        if frees or queue_change is not None:
            extra = queue_change or _keep

            def change(queue: Queue) -> Queue:
                if frees and queue.slot_holders:
                    queue = replace(queue, slot_holders=queue.slot_holders[:-1])
                return extra(queue)

            await self.update_queue(updated.queue, change)
        return updated

    async def settle_queue(
        self, request: Request, queue_change: QueueChange | None = None
    ) -> Queue:
        """A repeat cannot know whether its decrement happened, so it only re-applies."""
        return await self.update_queue(request.queue, queue_change or _keep)

    async def release_stale_holders(self, queue: Queue, keep: str) -> Queue:
        """Anonymous tokens name no request to look up: nothing is reclaimable."""
        return queue


@dataclass(frozen=True)
class Variant:
    """Which lifecycle a world is built with (the shipped one unless told otherwise).

    ``lifecycle`` replaces it outright: a deliberately wrong record rule, say, to show
    the checker catches what no machine file names.
    """

    bare_counter: bool = False
    lifecycle: LifecycleFactory | None = None

    @property
    def lifecycle_factory(self) -> LifecycleFactory:
        if self.lifecycle is not None:
            return self.lifecycle
        return BareCounterLifecycle if self.bare_counter else RequestLifecycle

"""Keeping a delivery's ack deadline ahead of a step that runs long.

The gate asks for more time once, before it asks git about ancestry, and that request is
only sent once half the ack wait has gone by. A step can still outlast the ack wait after
it: each git call may take up to its own timeout, and a KV write during a cluster leader
election waits for the new leader. So while a delivery is being handled, a heartbeat asks
for more time every quarter of the ack wait (the delivery itself sends at most one
request per half ack wait), which keeps the deadline at least a quarter of the ack wait
away for as long as the step runs. The ack wait can therefore be short, so a replica that
dies with a message in hand hands its queue to another replica within that ack wait.

The heartbeat stops when the handler returns its decision, before the consumer settles
the delivery: an in-progress signal arriving after a hold would reset the hold's
redelivery timer to the full ack wait.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from ...domain.settle import Attempt
from ...ports.delivery import Delivery

log = logging.getLogger("stovepipe_fsm.service")


class Handler(Protocol):
    async def handle(self, delivery: Any) -> Attempt: ...


class KeptAlive:
    """A handler whose deliveries' ack deadlines are extended while they are handled."""

    def __init__(self, handler: Handler, ack_wait_s: float) -> None:
        if ack_wait_s <= 0:
            raise ValueError(f"the ack wait must be positive, got {ack_wait_s}")
        self._handler = handler
        self.period_s = ack_wait_s / 4

    async def handle(self, delivery: Delivery) -> Attempt:
        beat = _Heartbeat(delivery, self.period_s)
        try:
            return await self._handler.handle(delivery)
        finally:
            # Not awaited: a cancellation of this handler must reach its caller. A signal
            # already on its way was queued before the delivery is settled (the consumer
            # settles it only after this returns), so nothing it sends can follow the
            # settle.
            beat.stop()


class _Heartbeat:
    """An in-progress signal every ``period_s`` while a delivery is handled.

    A timer, not a task: nearly every delivery settles well within the first period, and
    then the heartbeat cost one timer armed and cancelled. Only a period that runs out
    starts a task, which sends the signal and arms the next period once it is sent, so
    a slow broker never has two signals of one delivery in flight.
    """

    def __init__(self, delivery: Delivery, period_s: float) -> None:
        self._delivery = delivery
        self._period_s = period_s
        self._loop = asyncio.get_running_loop()
        self._stopped = False
        self._sending: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(period_s, self._due)

    def _due(self) -> None:
        self._timer = None
        if not self._stopped:
            self._sending = self._loop.create_task(self._send())

    async def _send(self) -> None:
        try:
            # Read again in the step that queues the signal: the handler may have
            # returned between the timer and this step.
            if self._stopped:
                return
            await self._delivery.in_progress()
        except Exception as exc:  # the broker may be failing over; the next beat retries
            log.debug("in-progress signal not sent: %s: %s", type(exc).__name__, exc)
        finally:
            self._sending = None
            if not self._stopped:
                self._timer = self._loop.call_later(self._period_s, self._due)

    def stop(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        if self._sending is not None:
            self._sending.cancel()

"""Whether the service is healthy, and the runtime events ``/metrics`` counts.

Healthy means running and the broker answering: a heartbeat makes one JetStream request
per interval, and a round trip older than the health window makes the service unhealthy.
A connected socket is not enough: a hung broker keeps the connection open while
answering nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field

from nats.aio.client import Client

from ...adapters.jetstream.consumer import Observer
from .tasks import ServiceTasks

log = logging.getLogger("stovepipe_fsm.service")


@dataclass(eq=False)
class Health:
    """The heartbeat, what the health check reports, and the runtime events seen."""

    nc: Client
    tasks: ServiceTasks
    _: KW_ONLY
    heartbeat_interval_s: float
    health_window_s: float
    #: Told of every runtime event too (the service's own observer, if any).
    observer: Observer | None = None
    #: Runtime events by (event, queue) (:class:`~...adapters.jetstream.consumer.Observer`).
    events: Counter[tuple[str, str]] = field(init=False, default_factory=Counter)
    #: Dead letters this replica wrote, by reason (:func:`dead_letter_reason`).
    dead_letter_reasons: Counter[str] = field(init=False, default_factory=Counter)
    started: bool = field(init=False, default=False)
    #: ``time.monotonic()`` of the last JetStream round trip that succeeded.
    last_round_trip: float | None = field(init=False, default=None)

    def observe(self, event: str, queue: str, request_id: str, detail: str) -> None:
        """The observer every consumer reports to: counted, then passed on."""
        self.events[(event, queue)] += 1
        reason = dead_letter_reason(event, detail)
        if reason:
            self.dead_letter_reasons[reason] += 1
        if self.observer is not None:
            self.observer(event, queue, request_id, detail)

    def began(self) -> None:
        """The service started (start itself just talked to JetStream)."""
        self.last_round_trip = time.monotonic()
        self.started = True

    async def heartbeat(self, after: Callable[[], Awaitable[None]]) -> None:
        """Prove the broker answers: one JetStream request per interval, timed out at the
        interval, so a hung broker ages ``last_round_trip`` as wall time passes; ``after``
        runs after each round trip that succeeded."""
        interval = self.heartbeat_interval_s
        js = self.nc.jetstream()
        while not self.tasks.stopping:
            try:
                await asyncio.wait_for(js.account_info(), timeout=interval)
                self.last_round_trip = time.monotonic()
                await after()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the health check reports the age; log for the why
                log.warning("broker round trip failed: %s: %s", type(exc).__name__, exc)
            await self.tasks.idle(interval)

    def problems(self) -> list[str]:
        """Why the service is not healthy; empty when it is."""
        if not self.started:
            return ["not started"]
        problems = []
        if self.tasks.stopping:
            problems.append("stopping")
        if not self.nc.is_connected:
            problems.append("not connected to NATS")
        if self.last_round_trip is not None:
            age = time.monotonic() - self.last_round_trip
            if age > self.health_window_s:
                problems.append(f"no JetStream round trip for {age:.1f} s")
        problems += [f"{name} stopped" for name in self.tasks.ended()]
        return problems


def dead_letter_reason(event: str, detail: str) -> str:
    """Why a runtime event dead-lettered a message, in a few words ("" if it did not)."""
    if event == "orphan":
        return "orphan"
    if event != "dead_letter":
        return ""
    if detail.startswith("gave up after"):
        return "gave_up"
    if detail.startswith("undecodable"):
        return "undecodable"
    return "non_retryable"

"""What wakes a service's parked pull requests and takes up news at once.

Pull requests live only in the broker's memory, so a parked one can be lost without a
word. Three plain subscriptions (:mod:`.subscriptions`, each with a slower backstop):

- ``publish``, on the process subjects: a publish for a queue without a consumer starts
  one (:meth:`.Discovery.published`), and a publish that a parked request should have
  answered but did not renews that request;
- ``leader``, on the broker's leader-election advisories: every parked request of a
  stream or consumer whose leader changed is renewed;
- ``pause``, on the service bucket's pause keys: a ``pause`` or ``resume`` is taken up as
  it is written (:meth:`.PolicyWatch.on_pause_write`).

A reconnect (the heartbeat sees it) renews every parked request and starts a discovery
round. The subscriptions the broker refused are tried again every ``refused_retry_s``.
"""

from __future__ import annotations

import logging
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any, Protocol

from nats.aio.client import Client

from ...adapters.jetstream import Topology
from .connect import ConnectionErrors
from .discovery import Discovery
from .pauses import pause_write_subjects
from .policy_watch import PolicyWatch
from .queue_consumers import QueueConsumers
from .subscriptions import Wake, WakeSubscriptions
from .tasks import ServiceTasks

log = logging.getLogger("stovepipe_fsm.service")


class PullLoop(Protocol):
    """A consumer loop whose parked pull request can be renewed."""

    @property
    def stream(self) -> str: ...

    durable: str

    def wake(self) -> None: ...


@dataclass(eq=False)
class Wakeups:
    """The plain subscriptions of one service, and the renewals after a reconnect."""

    nc: Client
    topology: Topology
    queues: QueueConsumers
    discovery: Discovery
    policy: InitVar[PolicyWatch]
    tasks: ServiceTasks
    _: KW_ONLY
    #: The consumers besides the queues' (dead letters, outcomes).
    stage_loops: tuple[PullLoop, ...]
    #: The connection's error callback, where it is this process's (a subscription the
    #: broker takes away later is then seen at once).
    connection_errors: ConnectionErrors | None
    refused_retry_s: float
    _reconnects: int = field(init=False, default=0)

    def __post_init__(self, policy: PolicyWatch) -> None:
        self.subscriptions = WakeSubscriptions(
            self.nc,
            (
                Wake(
                    "publish",
                    self.topology.process_subjects_filter(),
                    self._on_publish,
                    "a new queue gets its consumer at the next discovery round, and a "
                    "parked pull request the broker dropped is renewed as it expires",
                ),
                Wake(
                    "leader",
                    "$JS.EVENT.ADVISORY.*.LEADER_ELECTED.>",
                    self._on_leader,
                    "after a leader change, parked pull requests are renewed as they expire",
                ),
                Wake(
                    "pause",
                    pause_write_subjects(self.topology),
                    policy.on_pause_write,
                    "a pause or resume is taken up at the once-a-second read",
                ),
            ),
            self.refused_retry_s,
        )

    async def start(self) -> None:
        self._reconnects = self.nc.stats.get("reconnects", 0)
        if self.connection_errors is not None:
            self.connection_errors.listen(self.subscriptions.on_error)
        await self.subscriptions.subscribe()
        self.tasks.spawn(
            "subscriptions",
            self.tasks.every(
                self.refused_retry_s, self.subscriptions.retry_refused, "subscription"
            ),
        )

    def loops(self) -> list[PullLoop]:
        return [*self.queues.loops(), *self.stage_loops]

    def wake_all(self) -> None:
        """Renew every parked pull request (and let every loop see a stop)."""
        for loop in self.loops():
            loop.wake()

    async def _on_publish(self, msg: Any) -> None:
        try:
            queue, partition = self.topology.process_address(msg.subject)
        except ValueError:
            return  # an orphan subject: discovery dead-letters it
        consumer = self.queues.consumers.get(queue)
        if consumer is None:
            self.discovery.published(queue)
        elif consumer.partition == partition:
            consumer.nudge()
        else:  # published as the queue moved: bring it to the consumer
            self.queues.gather_soon(queue, [partition])

    async def _on_leader(self, msg: Any) -> None:
        """``$JS.EVENT.ADVISORY.{STREAM,CONSUMER}.LEADER_ELECTED.<stream>[.<consumer>]``:
        the pull requests the old leader held are gone; renew those of that stream."""
        tokens = msg.subject.split(".")
        if len(tokens) < 6:
            return
        stream = tokens[5]
        durable = tokens[6] if len(tokens) > 6 else ""
        for loop in self.loops():
            if loop.stream == stream and (not durable or loop.durable == durable):
                loop.wake()

    async def after_round_trip(self) -> None:
        """After a reconnect, parked pull requests may be gone with the old connection or
        server: renew them all, and look for queues whose publish went by meanwhile."""
        reconnects = self.nc.stats.get("reconnects", 0)
        if reconnects == self._reconnects:
            return
        self._reconnects = reconnects
        log.info("reconnected: renewing %d parked pull request(s)", len(self.loops()))
        self.wake_all()
        self.discovery.discover_soon()

    async def close(self) -> None:
        if self.connection_errors is not None:
            self.connection_errors.forget(self.subscriptions.on_error)
        await self.subscriptions.close()

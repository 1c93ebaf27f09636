"""What wakes a service's parked pull requests and takes up news at once.

Pull requests live only in the broker's memory, so a parked one can be lost without a
word. Three plain subscriptions, each with a slower backstop:

- ``publish``, on the process subjects: a publish for a queue without a consumer starts
  one (:meth:`.Discovery.published`), and a publish that a parked request should have
  answered but did not renews that request;
- ``leader``, on the broker's leader-election advisories: every parked request of a
  stream or consumer whose leader changed is renewed;
- ``pause``, on the service bucket's pause keys: a ``pause`` or ``resume`` is taken up as
  it is written (:meth:`.PolicyWatch.on_pause_write`).

A reconnect (the heartbeat sees it) renews every parked request and starts a discovery
round.

Each subscription only makes the service quicker. A user whose NATS permissions do not
allow one is answered with an error on the connection, not on the subscribe call, and
the client library would send the refused subscription again after every reconnect. So
a subscription is made, the connection flushed (the server answers a refused ``SUB``
before a ``PING`` sent after it), and a refused one is dropped and reported with what
the service does without it. A broker config reload can also take a right away later:
the broker then removes the subscription and says so on the connection only, which
drops it the same way. The refused ones are tried again every ``refused_retry_s``, so
that a right given back is taken up without a restart.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any, Protocol

from nats.aio.client import Client

from ...adapters.jetstream import Topology
from .connect import ConnectionErrors
from .discovery import Discovery
from .pauses import pause_write_subjects
from .policy_watch import PolicyWatch
from .queue_consumers import QueueConsumers
from .tasks import ServiceTasks

log = logging.getLogger("stovepipe_fsm.service")

#: How long the flush that shows a refusal may take; past it the subscription is kept.
REFUSAL_CHECK_TIMEOUT_S = 5


@dataclass(frozen=True)
class Wake:
    """One plain subscription: its name (a metric label), subjects, handler, and what
    the service does without it."""

    name: str
    subject: str
    handler: Callable[[Any], Awaitable[None]]
    without: str


async def subscribe_if_allowed(nc: Client, wake: Wake) -> tuple[Any | None, str]:
    """The subscription, or ``None`` and the broker's words where it refused it."""
    before = nc.last_error
    subscription = await nc.subscribe(wake.subject, cb=wake.handler)
    try:
        # Twice: the client writes a flush's PING at once but leaves the SUB to its
        # writer task, so the first PING can reach the broker ahead of the SUB. Once
        # its PONG is back, the writer has had its turn: the second PING follows the SUB.
        for _ in range(2):
            await nc.flush(timeout=REFUSAL_CHECK_TIMEOUT_S)
    except Exception:  # a slow broker: no verdict, so keep what may well be allowed
        return subscription, ""
    error = nc.last_error
    if error is None or error is before or not refuses(error, wake.subject):
        return subscription, ""
    with contextlib.suppress(Exception):
        await subscription.unsubscribe()
    return None, str(error)


def refuses(error: BaseException, subject: str) -> bool:
    """Whether ``error`` is the broker refusing a subscription to ``subject``.

    The broker quotes the subject (``Permissions Violation for Subscription to
    "<subject>"``), so one subject is never taken for another that contains it.
    """
    text = str(error).lower()
    return f'permissions violation for subscription to "{subject.lower()}"' in text


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
    #: The subscriptions held, by name.
    held: dict[str, Any] = field(init=False, default_factory=dict)
    #: The subscriptions the broker refused, by name (what ``/metrics`` shows): why.
    refused: dict[str, str] = field(init=False, default_factory=dict)
    _retry_at: float = field(init=False, default=0.0)
    _reconnects: int = field(init=False, default=0)

    def __post_init__(self, policy: PolicyWatch) -> None:
        wakes = (
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
        )
        #: The plain subscriptions, by name, each with its backstop.
        self.wakes = {wake.name: wake for wake in wakes}

    async def start(self) -> None:
        self._reconnects = self.nc.stats.get("reconnects", 0)
        if self.connection_errors is not None:
            self.connection_errors.listen(self.on_error)
        for wake in self.wakes.values():
            await self._subscribe(wake)
        self._retry_at = time.monotonic() + self.refused_retry_s
        self.tasks.spawn(
            "subscriptions",
            self.tasks.every(self.refused_retry_s, self.retry_refused, "subscription"),
        )

    async def retry_refused(self) -> None:
        """Try the refused subscriptions again, at most every ``refused_retry_s``: a right
        given back by a broker config reload is taken up without a restart."""
        if not self.refused or time.monotonic() < self._retry_at:
            return
        self._retry_at = time.monotonic() + self.refused_retry_s
        for name in sorted(self.refused):
            wake = self.wakes[name]
            try:
                allowed = await self._subscribe(wake, again=True)
            except Exception as exc:  # the broker may be reconnecting: the next retry
                log.warning("subscription to %s not retried: %s", wake.subject, exc)
                return
            if allowed:
                log.info("now allowed to subscribe to %s: %s again", wake.subject, name)

    async def _subscribe(self, wake: Wake, *, again: bool = False) -> bool:
        subscription, refusal = await subscribe_if_allowed(self.nc, wake)
        if subscription is not None:
            self.held[wake.name] = subscription
            self.refused.pop(wake.name, None)
            return True
        if not again:
            self._refuse(wake, refusal)
        return False

    async def on_error(self, exc: Exception) -> bool:
        """A connection error: a refusal of one of these subscriptions is explained here
        (True); one of a held subscription, the broker having just removed it, drops it
        as a refusal at start does."""
        for wake in self.wakes.values():
            if not refuses(exc, wake.subject):
                continue
            subscription = self.held.pop(wake.name, None)
            if subscription is not None:
                self._refuse(wake, str(exc))
                # The client would otherwise send it again at every reconnect.
                with contextlib.suppress(Exception):
                    await subscription.unsubscribe()
            return True
        return False

    def _refuse(self, wake: Wake, refusal: str) -> None:
        self.refused[wake.name] = refusal
        log.warning(
            "not allowed to subscribe to %s (%s): %s instead; allow this service's "
            "user to subscribe there",
            wake.subject,
            refusal,
            wake.without,
        )

    def loops(self) -> list[PullLoop]:
        return [*self.queues.consumers.values(), *self.stage_loops]

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
            self.connection_errors.forget(self.on_error)
        for subscription in self.held.values():
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        self.held.clear()

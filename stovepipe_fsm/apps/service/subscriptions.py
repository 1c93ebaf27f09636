"""The service's plain subscriptions, and what it does where the broker refuses one.

Each of them only makes the service quicker; each has a slower backstop. A user whose
NATS permissions do not allow one is answered with an error on the connection, not on
the subscribe call, and the client library would send the refused subscription again
after every reconnect. So a subscription is made, the connection flushed (the server
answers a refused ``SUB`` before a ``PING`` sent after it), and a refused one is
dropped and reported with what the service does without it.

A broker config reload can also take a right away later: the broker then removes the
subscription and says so on the connection only. :class:`WakeSubscriptions` hears that
through the connection's errors, drops the subscription the same way, and tries every
refused one again now and then, so that a right given back is taken up without a
restart.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client

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


class WakeSubscriptions:
    """The plain subscriptions of one service: each held, or refused with the broker's
    words (``refused``, by name: what ``/metrics`` shows)."""

    def __init__(self, nc: Client, wakes: tuple[Wake, ...], retry_s: float) -> None:
        self.nc = nc
        self.wakes = {wake.name: wake for wake in wakes}
        self.retry_s = retry_s
        self.held: dict[str, Any] = {}
        self.refused: dict[str, str] = {}
        self._retry_at = 0.0

    async def subscribe(self) -> None:
        """Make every subscription the broker allows; report the others."""
        for wake in self.wakes.values():
            await self._subscribe(wake)
        self._retry_at = time.monotonic() + self.retry_s

    async def retry_refused(self) -> None:
        """Try the refused subscriptions again, at most every ``retry_s``: a right given
        back by a broker config reload is taken up without a restart."""
        if not self.refused or time.monotonic() < self._retry_at:
            return
        self._retry_at = time.monotonic() + self.retry_s
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

    async def close(self) -> None:
        for subscription in self.held.values():
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        self.held.clear()

"""The service's plain subscriptions, and what it does where the broker refuses one.

Each of them only makes the service quicker; each has a slower backstop. A user whose
NATS permissions do not allow one is answered with an error on the connection, not on
the subscribe call, and the client library would send the refused subscription again
after every reconnect. So a subscription is made, the connection flushed (the server
answers a refused ``SUB`` before the flush's ``PING``), and a refused one is dropped
and reported with what the service does without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client

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
    """Whether ``error`` is the broker refusing a subscription to ``subject``."""
    text = str(error).lower()
    return "permissions violation for subscription" in text and subject.lower() in text

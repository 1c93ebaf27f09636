"""Pull requests of many consumers answered on one subscription.

nats-py's pull subscription gives every consumer its own inbox subscription, and each
``fetch`` wraps its wait in tasks of its own: thousands of parked queues then mean
thousands of subscriptions and several tasks each, which is what a start on 10,000
queues spends its time creating. Here every consumer gets a reply subject under one
wildcard inbox (``<inbox>.<durable>``), subscribed to once; a pull request is a plain
publish to the consumer's ``MSG.NEXT`` subject, and the one callback resolves the future
the loop awaits. A parked loop is therefore one coroutine waiting on a future, and
nothing else. A delivered message keeps its own subject, so it is routed by the consumer
its ack subject names; a status reply comes on the reply subject itself. Every consumer
fetching through one inbox must be on the same stream.

A message that arrives for a loop not waiting (a request it gave up on was answered
after all) is kept for that loop's next fetch, as nats-py keeps it in the subscription's
queue. A status reply ends the wait: ``408`` (the request expired) and ``409`` (the
server gave up on it) as a plain expiry, anything else as an error for the loop to log.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque

import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api

#: Status replies that end a pull request without a message and without an error.
EXPIRED = frozenset({api.StatusCode.REQUEST_TIMEOUT, api.StatusCode.CONFLICT})
API_PREFIX = "$JS.API"
#: How much longer than its expiry a fetch waits for the server's expiry reply.
GRACE_S = 1.0


class SharedInbox:
    """One wildcard subscription through which many loops fetch one message at a time."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.prefix = nc.new_inbox()
        self._sub: Subscription | None = None
        self._waiting: dict[str, asyncio.Future[Msg | None]] = {}
        self._early: dict[str, deque[Msg]] = {}

    async def open(self) -> None:
        self._sub = await self.nc.subscribe(f"{self.prefix}.*", cb=self._deliver)

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            await sub.unsubscribe()
        for future in self._waiting.values():
            if not future.done():
                future.set_result(None)

    def reply_subject(self, durable: str) -> str:
        """The reply subject of the consumer named ``durable``."""
        return f"{self.prefix}.{durable}"

    async def fetch(self, stream: str, durable: str, reply: str, expires_s: float) -> Msg | None:
        """The consumer's next message, or ``None`` when the request expired or
        :meth:`wake` ended the wait; raises on any other status reply."""
        early = self._early.get(reply)
        if early:
            msg = early.popleft()
            if not early:
                del self._early[reply]
            return msg
        future: asyncio.Future[Msg | None] = asyncio.get_running_loop().create_future()
        self._waiting[reply] = future
        try:
            request = {"batch": 1, "expires": int(expires_s * 1_000_000_000)}
            await self.nc.publish(
                f"{API_PREFIX}.CONSUMER.MSG.NEXT.{stream}.{durable}",
                json.dumps(request).encode(),
                reply=reply,
            )
            try:
                return await asyncio.wait_for(future, expires_s + GRACE_S)
            except TimeoutError:
                return None  # no expiry reply (a reconnect lost it): ask again
        finally:
            if self._waiting.get(reply) is future:
                del self._waiting[reply]

    def wake(self, reply: str) -> None:
        """End the wait of the loop behind ``reply`` (its fetch returns ``None``)."""
        future = self._waiting.get(reply)
        if future is not None and not future.done():
            future.set_result(None)

    async def _deliver(self, msg: Msg) -> None:
        status = msg.headers.get(api.Header.STATUS) if msg.headers else None
        if status:
            reply = msg.subject
        else:
            try:
                reply = self.reply_subject(msg.metadata.consumer)
            except Exception:
                return  # not a JetStream delivery: nothing of ours
        future = self._waiting.get(reply)
        waiting = future is not None and not future.done()
        if status:
            if not waiting or future is None:
                return  # the end of a request nobody waits on any more
            if status in EXPIRED:
                future.set_result(None)
            else:
                future.set_exception(_status_error(msg))
            return
        if waiting and future is not None:
            future.set_result(msg)
        else:
            self._early.setdefault(reply, deque()).append(msg)


def _status_error(msg: Msg) -> Exception:
    """The error a status reply stands for (nats-py raises some instead of returning)."""
    try:
        return nats.js.errors.APIError.from_msg(msg)
    except Exception as exc:
        return exc

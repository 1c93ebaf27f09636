"""Growing the process stream's consumer limit when a new queue reaches it.

Each queue has its own durable consumer on a process stream (or one of its partitions),
so a stream's consumer cap is a cap on queues. The broker caps a stream's consumers at
the smaller of two limits: the stream's own ``max_consumers`` (unset: the server's
default, 1,000) and the account's JetStream ``max_consumers``, which it applies to each
stream. The stream's limit is the service's to set: when a create is refused for it,
the service raises it in place (up to the account's limit) instead of asking the
operator to. The account's limit is the operator's: past it a queue moves to another
partition of the process stream (``partitions.py``).

The update sends back the stream's configuration as the server reported it, with only
``max_consumers`` changed: the client library's typed configuration drops fields it
does not know, and an update built from it would reset them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from nats.js import JetStreamContext

from ...domain.errors import NonRetryable
from .errors import MAX_CONSUMERS_CODE, translated
from .raw_api import api_request

log = logging.getLogger("stovepipe_fsm.service")

#: The broker's limit for a stream that leaves ``max_consumers`` unset (-1).
SERVER_DEFAULT_MAX_CONSUMERS = 1_000
#: A raised limit is at least this much above the stream's consumer count (and at least
#: double it), so a growing deployment raises rarely.
MIN_GROWTH = 1_000


@dataclass(frozen=True)
class LimitRaise:
    """What :func:`raise_consumer_limit` found and did."""

    stream: str
    consumers: int
    #: The stream's limit before (-1: unset, the broker's default applies).
    before: int
    #: The stream's limit now; equal to ``before`` when nothing was raised.
    after: int
    #: The account's JetStream consumer limit (-1: none).
    account_limit: int

    @property
    def room(self) -> bool:
        """Whether the stream now has room for one more consumer."""
        cap = self.after if self.after > 0 else SERVER_DEFAULT_MAX_CONSUMERS
        if self.account_limit > 0:
            cap = min(cap, self.account_limit)
        return cap > self.consumers


def wanted_limit(consumers: int, before: int, account_limit: int) -> int:
    """The limit to raise to: double the count and at least :data:`MIN_GROWTH` above it,
    never lowered, and capped by the account's limit where it has one."""
    want = max(2 * consumers, consumers + MIN_GROWTH, before)
    return min(want, account_limit) if account_limit > 0 else want


async def raise_consumer_limit(js: JetStreamContext, stream: str) -> LimitRaise:
    """Raise ``stream``'s consumer limit after a create was refused for it, up to the
    account's limit.

    The consumer count the stream reports can lag the one the broker checks a create
    against (on a cluster, creations still being placed count there and not here), so
    the refused limit is taken to be the stream's own unless another replica has raised
    it well past the count already. Safe from several replicas at once: each writes a
    limit above what it read, and racing raises of one refusal write the same value.
    """
    with translated(f"raise the consumer limit of stream {stream}"):
        info = await api_request(js, f"STREAM.INFO.{stream}")
        if "error" in info:
            raise NonRetryable(f"stream info of {stream}: {info['error']}")
        config = info["config"]
        consumers = int(info.get("state", {}).get("consumer_count", 0))
        before = int(config.get("max_consumers", -1))
        account_limit = (await js.account_info()).limits.max_consumers
        found = LimitRaise(stream, consumers, before, before, account_limit)
        if before > 0 and before - consumers >= MIN_GROWTH // 2:
            return found  # raised already; the refusal came before that
        cap = before if before > 0 else SERVER_DEFAULT_MAX_CONSUMERS
        after = wanted_limit(max(consumers, cap), before, account_limit)
        if after <= before:
            return found  # the account's limit binds
        config["max_consumers"] = after
        answer = await api_request(js, f"STREAM.UPDATE.{stream}", json.dumps(config).encode())
        error = answer.get("error")
        if error is not None:
            if error.get("err_code") == MAX_CONSUMERS_CODE:
                return found  # the account refuses it
            raise NonRetryable(f"update of stream {stream}: {error}")
    log.warning(
        "stream %s consumer limit raised from %s to %d (%d consumers, one per queue)",
        stream,
        before if before > 0 else f"the broker's default {SERVER_DEFAULT_MAX_CONSUMERS}",
        after,
        consumers,
    )
    return LimitRaise(stream, consumers, before, after, account_limit)

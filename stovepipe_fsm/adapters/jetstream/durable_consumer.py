"""Creating a durable pull consumer, idempotently, when several replicas start at once.

A consumer that exists already is brought to the configured settings the server lets a
consumer change in place (``ack_wait``, ``max_ack_pending``, ``max_deliver``), so a new
``--ack-wait`` takes effect on the next start instead of being ignored. Every replica
should run with the same settings: the last one to start wins.
"""

from __future__ import annotations

import asyncio
import logging

import nats.js.errors
from nats.js import JetStreamContext, api

from ...domain.errors import NonRetryable
from .asked_again import TRANSIENT_ATTEMPTS, asked_again
from .consumer_limit import LimitRaise, raise_consumer_limit
from .errors import MAX_CONSUMERS_CODE, translated

log = logging.getLogger("stovepipe_fsm.service")

#: Settings compared with an existing consumer's: the ones the server updates in place.
EDITABLE = ("ack_wait", "max_ack_pending", "max_deliver")


class ConsumerLimitReached(NonRetryable):
    """The process stream holds as many consumers (queues) as the account lets it."""


#: Creates tried for one consumer, each after a raise of the stream's limit (replicas
#: creating other queues' consumers at once may take the room a raise made).
CREATE_ATTEMPTS = 5
#: The pause before the n-th try is n times this.
CREATE_PAUSE_S = 0.1


async def existing_consumers(js: JetStreamContext, stream: str) -> dict[str, api.ConsumerConfig]:
    """Every consumer of ``stream`` with its config, listed a page (256) at a time: a
    start on 10,000 queues asks 40 times instead of once per queue."""
    out: dict[str, api.ConsumerConfig] = {}
    with translated(f"list consumers of {stream}"):
        while page := await js.consumers_info(stream, offset=len(out)):
            grown = len(out)
            out.update((info.name, info.config) for info in page)
            if len(out) == grown:  # a page of names already seen: the listing is done
                break
    return out


async def durable_exists(js: JetStreamContext, stream: str, name: str) -> bool:
    """Whether ``stream`` has the consumer ``name`` (an unanswered lookup raises)."""
    with translated(f"look up consumer {stream}/{name}"):
        return await _exists(js, stream, name)


async def _exists(js: JetStreamContext, stream: str, name: str) -> bool:
    try:
        await js.consumer_info(stream, name)
    except nats.js.errors.NotFoundError:
        return False
    return True


async def delete_durable(js: JetStreamContext, stream: str, name: str) -> bool:
    """Delete the consumer ``name`` of ``stream``; ``False`` when it was gone already
    (another replica deleted it first)."""
    with translated(f"delete consumer {name} of {stream}"):
        try:
            return bool(await js.delete_consumer(stream, name))
        except nats.js.errors.NotFoundError:
            return False


async def ensure_pull_consumer(
    js: JetStreamContext,
    stream: str,
    config: api.ConsumerConfig,
    existing: api.ConsumerConfig | None = None,
) -> None:
    """Create the durable consumer unless it exists (replicas race here harmlessly);
    update an existing one whose editable settings differ from ``config``. A request the
    broker did not answer (a :class:`Retryable` error) is asked again, up to
    :data:`TRANSIENT_ATTEMPTS` times in all.

    ``existing``: the consumer's config from :func:`existing_consumers`, when it was
    listed; if it needs no update, nothing is asked of the broker."""
    await asked_again(
        lambda: _ensure(js, stream, config, existing),
        attempts=TRANSIENT_ATTEMPTS,
        pause_s=CREATE_PAUSE_S,
    )


async def _ensure(
    js: JetStreamContext,
    stream: str,
    config: api.ConsumerConfig,
    existing: api.ConsumerConfig | None,
) -> None:
    name = config.durable_name
    assert name is not None
    if existing is not None and not differing_settings(existing, config):
        return
    with translated(f"ensure consumer {stream}/{name}"):
        try:
            info = await js.consumer_info(stream, name)
        except nats.js.errors.NotFoundError:
            pass
        else:
            changed = differing_settings(info.config, config)
            if changed:
                # A create with the same name and filter is the server's update.
                await js.add_consumer(stream, config=config)
                log.info("consumer %s/%s updated: %s", stream, name, "; ".join(changed))
            return
        for attempt in range(1, CREATE_ATTEMPTS + 1):
            if await _create(js, stream, name, config):
                return
            if await _exists(js, stream, name):
                return  # refused, but another replica created it meanwhile: bind to it
            raised = await raise_consumer_limit(js, stream)
            if not raised.room:
                raise ConsumerLimitReached(_refusal(raised, name)) from None
            if attempt == CREATE_ATTEMPTS:
                raise ConsumerLimitReached(
                    f"stream {stream} refused consumer {name} {attempt} times for its "
                    f"consumer limit although it had room ({raised.consumers} consumers, "
                    f"limit {raised.after}): other creations took it each time"
                ) from None
            # Creations and a raise in flight elsewhere settle before the next try.
            await asyncio.sleep(CREATE_PAUSE_S * attempt)
        raise AssertionError("unreachable: the last attempt returns or raises")


async def _create(js: JetStreamContext, stream: str, name: str, config: api.ConsumerConfig) -> bool:
    """Create the consumer: False when the stream or the account is full."""
    try:
        await js.add_consumer(stream, config=config)
    except nats.js.errors.APIError as exc:
        # Another replica created it first (with our config): fine. Anything else
        # shows up in this re-read.
        try:
            await js.consumer_info(stream, name)
        except nats.js.errors.NotFoundError:
            if exc.err_code == MAX_CONSUMERS_CODE:
                return False
            raise
    return True


def _refusal(found: LimitRaise, name: str) -> str:
    account = (
        f"the account's JetStream consumer limit ({found.account_limit})"
        if found.account_limit > 0
        else "the account's JetStream limits"
    )
    return (
        f"stream {found.stream} refuses consumer {name}: maximum consumers limit reached "
        f"({found.consumers} consumers, one per queue; stream limit {found.after}). "
        f"The broker caps each stream at {account}: raise it (nats account info); "
        "see docs/jetstream.md"
    )


def differing_settings(have: api.ConsumerConfig, want: api.ConsumerConfig) -> list[str]:
    """``setting: have X, want Y`` for each editable setting ``want`` sets differently."""
    diffs = []
    for field in EDITABLE:
        wanted = getattr(want, field)
        actual = getattr(have, field)
        if wanted is None:
            continue
        if field == "ack_wait":  # seconds as float, nanoseconds on the wire
            same = actual is not None and abs(float(actual) - float(wanted)) < 1e-3
        else:
            same = actual == wanted
        if not same:
            diffs.append(f"{field}: have {actual}, want {wanted}")
    return diffs

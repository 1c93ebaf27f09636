"""Creating a durable pull consumer, idempotently, when several replicas start at once."""

from __future__ import annotations

import nats.js.errors
from nats.js import JetStreamContext, api

from ...domain.errors import NonRetryable
from .errors import MAX_CONSUMERS_CODE, translated


class ConsumerLimitReached(NonRetryable):
    """The process stream holds as many consumers (queues) as it may."""


async def ensure_pull_consumer(
    js: JetStreamContext, stream: str, config: api.ConsumerConfig
) -> None:
    """Create the durable consumer unless it exists (replicas race here harmlessly)."""
    name = config.durable_name
    assert name is not None
    with translated(f"ensure consumer {stream}/{name}"):
        try:
            await js.consumer_info(stream, name)
            return
        except nats.js.errors.NotFoundError:
            pass
        try:
            await js.add_consumer(stream, config=config)
        except nats.js.errors.APIError as exc:
            # Another replica created it first (with our config): fine. Anything else
            # shows up in this re-read.
            try:
                await js.consumer_info(stream, name)
            except nats.js.errors.NotFoundError:
                if exc.err_code == MAX_CONSUMERS_CODE:
                    raise ConsumerLimitReached(
                        f"stream {stream} refuses consumer {name}: maximum consumers limit "
                        "reached (one consumer per queue). Raise the stream's max_consumers "
                        "(Topology.max_queues) and the server's account limits, or shard "
                        "queues over several process streams; see docs/jetstream.md"
                    ) from None
                raise
            return

"""Every current value of a KV bucket in one pass, for pages that show all of them.

Listing the keys and then reading each one costs a broker round trip per key: a
thousand queues with their requests is thousands of round trips, seconds on a busy
broker. A watch that delivers the last value per key streams the same values over one
ordered consumer (it is what the client's own key listing runs, with the values left
in), and stops at the end of what is there when it starts. Deleted and purged keys are
left out, as a listing leaves them out.
"""

from __future__ import annotations

from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext

from .errors import translated

#: How long the snapshot may wait for the next value before it gives up.
SNAPSHOT_TIMEOUT_S = 5.0


async def kv_snapshot(
    js: JetStreamContext, bucket: str, keys: str = ">", *, timeout: float = SNAPSHOT_TIMEOUT_S
) -> list[tuple[str, bytes]]:
    """``(key, value)`` of every key of ``bucket`` matching ``keys`` that holds a value,
    in stream order; empty when the bucket does not exist."""
    with translated(f"read {bucket}"):
        try:
            kv = await js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            return []
        # nats-py leaves the watcher's methods unannotated.
        watcher: Any = await kv.watch(keys, ignore_deletes=True)
        try:
            values: list[tuple[str, bytes]] = []
            while True:
                try:
                    entry = await watcher.updates(timeout=timeout)
                except nats.errors.TimeoutError:
                    raise TimeoutError(
                        f"{bucket}: no value within {timeout:g}s while reading it"
                    ) from None
                if entry is None:  # the end of what was there when the watch began
                    return values
                if entry.value:
                    values.append((entry.key, entry.value))
        finally:
            await watcher.stop()

"""Reading a whole bucket (or a key range of it) in one pass.

A listing of keys followed by one ``get`` per key costs a round trip per row: ``status``
of 10,000 queues and their requests took minutes that way. A watch of the latest values
streams every row through one ordered consumer instead, and the broker marks when the
rows present at the start are all delivered, which is where the read stops.
"""

from __future__ import annotations

import contextlib
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from .errors import translated

#: How long a bulk read waits for its next row before giving up.
BULK_READ_TIMEOUT_S = 10.0


async def latest_values(
    kv: KeyValue, keys: str = ">", *, timeout_s: float = BULK_READ_TIMEOUT_S
) -> list[tuple[str, bytes]]:
    """Every ``(key, value)`` matching ``keys`` with a non-empty value, deleted ones left
    out; ``TimeoutError`` when the broker stalls for ``timeout_s`` between two rows."""
    watcher: Any = await kv.watch(keys, ignore_deletes=True)
    values: list[tuple[str, bytes]] = []
    try:
        while (entry := await watcher.updates(timeout=timeout_s)) is not None:
            if entry.value:
                values.append((entry.key, entry.value))
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()
    return values


async def kv_snapshot(
    js: JetStreamContext, bucket: str, keys: str = ">", *, timeout: float = BULK_READ_TIMEOUT_S
) -> list[tuple[str, bytes]]:
    """:func:`latest_values` of ``bucket`` by name (the status page): empty when the
    bucket does not exist yet, and a stall says which bucket it was."""
    with translated(f"read {bucket}"):
        try:
            kv = await js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            return []
        try:
            return await latest_values(kv, keys, timeout_s=timeout)
        except nats.errors.TimeoutError:
            raise TimeoutError(f"{bucket}: no value within {timeout:g}s while reading it") from None

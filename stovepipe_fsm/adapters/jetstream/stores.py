"""The KV-backed storage ports of one topology, opened together.

Opening binds to buckets that :func:`~.topology.ensure_topology` created; it never creates
them, so a service pointed at a broker without its topology fails fast with a clear error
instead of quietly making a second, empty set of buckets.
"""

from __future__ import annotations

from dataclasses import dataclass

import nats.js.errors
from nats.js import JetStreamContext

from ...domain.errors import NonRetryable
from .counter import KvCounter
from .entity_stores import KvQueueStore, KvRequestStore, KvSearchStore
from .errors import translated
from .kv_cell import KvCell
from .topology import Topology
from .uri_index import KvUriIndex


@dataclass(frozen=True)
class KvStores:
    requests: KvRequestStore
    queues: KvQueueStore
    uris: KvUriIndex
    counters: KvCounter
    attempts: KvCell
    searches: KvSearchStore


async def open_cell(js: JetStreamContext, bucket: str) -> KvCell:
    """Bind to an existing bucket; ``NonRetryable`` when it does not exist."""
    with translated(f"open bucket {bucket}"):
        try:
            kv = await js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            raise NonRetryable(
                f"KV bucket {bucket!r} does not exist; run ensure_topology first"
            ) from None
    return KvCell(kv, bucket, js)


async def open_kv_stores(js: JetStreamContext, topology: Topology) -> KvStores:
    return KvStores(
        requests=KvRequestStore(
            await open_cell(js, topology.requests_bucket), layout=topology.request_layout
        ),
        queues=KvQueueStore(await open_cell(js, topology.queues_bucket)),
        uris=KvUriIndex(await open_cell(js, topology.uris_bucket)),
        counters=KvCounter(await open_cell(js, topology.counters_bucket)),
        attempts=await open_cell(js, topology.attempts_bucket),
        searches=KvSearchStore(await open_cell(js, topology.searches_bucket)),
    )

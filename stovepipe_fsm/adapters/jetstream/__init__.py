"""JetStream adapter: the storage and publisher ports on NATS JetStream, plus the topology.

- ``server``     a local ``nats-server -js`` process (tests, ``serve --embedded``, demo)
- ``names``      the reversible encoding of queue names into subject tokens and KV keys
- ``codec``      JSON values with a schema version; malformed values are ``NonRetryable``
- ``topology``   stream / subject / bucket names, and idempotent, non-clobbering creation
- ``kv_cell``    conditional single-key KV access with domain errors
- ``entity_stores``, ``uri_index``, ``counter``, ``stores``: the storage ports on KV
- ``publisher``  the publisher port, every message with a ``Nats-Msg-Id``
- ``delivery``   the Delivery port over one process message
- ``attempts``   the failure count of each process message (the settle policy's input)
- ``dead_letter`` the record that replaces a message the service gave up on
- ``durable_consumer`` idempotent creation of the durable pull consumers, and updates of
  their editable settings
- ``prune``      removing old terminal requests with their uri-index entries
- ``consumer``   the pull loops: one runner per queue, and the dead-letter reconciler

See ``docs/jetstream.md`` for the contracts and the server behaviour they rely on.
"""

from .codec import WorkMessage
from .counter import KvCounter
from .entity_stores import KvQueueStore, KvRequestStore
from .errors import TopologyMismatch
from .kv_cell import KvCell, KvEntry
from .publisher import JetStreamPublisher
from .server import NatsServer, NatsServerError, find_nats_server_binary
from .stores import KvStores, open_cell, open_kv_stores
from .topology import Topology, ensure_topology
from .uri_index import KvUriIndex

__all__ = [
    "JetStreamPublisher",
    "KvCell",
    "KvCounter",
    "KvEntry",
    "KvQueueStore",
    "KvRequestStore",
    "KvStores",
    "KvUriIndex",
    "NatsServer",
    "NatsServerError",
    "Topology",
    "TopologyMismatch",
    "WorkMessage",
    "ensure_topology",
    "find_nats_server_binary",
    "open_cell",
    "open_kv_stores",
]

"""Which policy the service has in force, kept in the service bucket for ``status``.

``serve`` writes the record on start and on every reload; ``status`` reads it. One key:
with several replicas it names the policy of the replica that (re)loaded last, which is
what an operator rolling out an edit wants to see converge.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import nats.js.errors
from nats.js import JetStreamContext

from .errors import translated
from .topology import Topology

POLICY_KEY = "policy"


@dataclass(frozen=True)
class PolicyRecord:
    """The policy hash in force, when it was loaded, and by which replica."""

    hash: str
    loaded_at_ms: int
    replica: str


async def write_policy_record(
    js: JetStreamContext, topology: Topology, record: PolicyRecord
) -> None:
    with translated(f"write {topology.service_bucket} {POLICY_KEY}"):
        kv = await js.key_value(topology.service_bucket)
        await kv.put(POLICY_KEY, json.dumps(asdict(record), sort_keys=True).encode())


async def read_policy_record(js: JetStreamContext, topology: Topology) -> PolicyRecord | None:
    """The record, or None when no service has written one (or the bucket is missing)."""
    with translated(f"read {topology.service_bucket} {POLICY_KEY}"):
        try:
            kv = await js.key_value(topology.service_bucket)
            entry = await kv.get(POLICY_KEY)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError):
            return None
    if not entry.value:
        return None
    data = json.loads(entry.value)
    return PolicyRecord(str(data["hash"]), int(data["loaded_at_ms"]), str(data["replica"]))

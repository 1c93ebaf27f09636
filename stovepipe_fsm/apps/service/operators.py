"""Operator commands against a running pipeline's JetStream: ingest, complete, status.

They open the same stores and publisher the service uses (:func:`open_pipeline`), so an
operator's ingest is exactly what the upstream stage would do, and ``status`` reads the
same rows the consumers write. The ``requests`` and ``queues`` of ``status --json`` have
the entries of ``simulate --json``, so a run and a simulation can be compared field by
field; ``slot_holders`` is its own (``docs/service.md`` shows the whole document).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import nats.js.errors
from nats.js import JetStreamContext

from ...adapters.file import FileConfigStore
from ...adapters.jetstream import Topology
from ...adapters.jetstream.codec import decode_queue, decode_request
from ...adapters.jetstream.errors import translated
from ...adapters.jetstream.policy_record import read_policy_record
from ...adapters.memory.config import StaticConfigStore
from ...domain.bounded_text import clip
from ...domain.entities import Queue
from ...domain.errors import NonRetryable, NotFound
from ...domain.ids import parse_request_id
from ...domain.queue_names import InvalidQueueName, validate_queue_name
from ...ports.config import ConfigStore
from ...process.catalog import load_process_machines
from ...views.entities import queue_json, render_queue_row, render_request_rows, request_json
from .connect import NatsOptions, connect
from .runtime import Pipeline, open_pipeline


def load_config_store(path: str | None) -> ConfigStore:
    """The file store when the file exists; the built-in defaults otherwise.

    Loaded tolerantly (no parameter declarations): an operator command does not run the
    policy, so a key only a newer machine file declares must not make it fail.
    """
    if path and Path(path).exists():
        return FileConfigStore(path)
    return StaticConfigStore()


@contextlib.asynccontextmanager
async def operator_pipeline(
    options: NatsOptions, topology: Topology, machines_dir: str, config_path: str | None
) -> AsyncIterator[Pipeline]:
    nc = await connect(options)
    try:
        yield await open_pipeline(
            nc.jetstream(),
            topology,
            load_process_machines(machines_dir),
            load_config_store(config_path),
        )
    finally:
        await nc.close()


async def request_for_uri(pipeline: Pipeline, queue: str, uri: str) -> str:
    request_id = await pipeline.ingest.uri_index.get(queue, uri)
    if request_id is None:
        raise NotFound(f"no request for {uri!r} on queue {queue!r}")
    return request_id


async def _bucket_values(js: JetStreamContext, bucket: str) -> list[tuple[str, bytes]]:
    with translated(f"list {bucket}"):
        kv = await js.key_value(bucket)
        try:
            keys = await kv.keys()
        except nats.js.errors.NoKeysError:
            return []
        values = []
        for key in keys:
            try:
                entry = await kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                continue  # deleted between the listing and the read
            if entry.value:
                values.append((key, entry.value))
        return values


Row = TypeVar("Row")


def _decoded(
    bucket: str,
    values: list[tuple[str, bytes]],
    decode: Callable[[bytes], Row],
    damaged: list[dict[str, str]],
) -> list[Row]:
    """Every value ``decode`` reads; the others go to ``damaged`` with why, so one bad row
    is shown for what it is instead of hiding every good one."""
    rows = []
    for key, value in values:
        try:
            rows.append(decode(value))
        except NonRetryable as exc:
            damaged.append({"bucket": bucket, "key": key, "error": clip(str(exc), 300)})
    return rows


async def status_document(js: JetStreamContext, topology: Topology) -> dict[str, Any]:
    """Every request and queue row, ordered like ``simulate --json``, and the policy hash
    the service last wrote (``policy``, absent until a service ran with this topology).
    Rows that cannot be decoded are listed under ``damaged`` (absent when there are none).
    """
    damaged: list[dict[str, str]] = []
    requests = _decoded(
        topology.requests_bucket,
        await _bucket_values(js, topology.requests_bucket),
        decode_request,
        damaged,
    )
    queues = _decoded(
        topology.queues_bucket,
        await _bucket_values(js, topology.queues_bucket),
        decode_queue,
        damaged,
    )

    def order(request_id: str) -> tuple[str, int]:
        try:
            parsed = parse_request_id(request_id)
        except ValueError:
            return (request_id, 0)
        return (parsed.queue, parsed.counter)

    policy = await read_policy_record(js, topology)
    return {
        "requests": [request_json(r) for r in sorted(requests, key=lambda r: order(r.id))],
        "queues": [queue_json(q) for q in sorted(queues, key=lambda q: q.name)],
        # Who holds each queue's slots: the first thing to look at when a queue waits.
        "slot_holders": {q.name: list(q.slot_holders) for q in queues},
        # The policy the service runs (once a service has written it).
        **({"policy": asdict(policy)} if policy is not None else {}),
        **({"damaged": damaged} if damaged else {}),
        **({"name_problems": problems} if (problems := _name_problems(queues)) else {}),
    }


def _name_problems(queues: list[Queue]) -> list[dict[str, str]]:
    """Stored queues whose names a new queue could not have (created before the name
    rule): shown escaped, since such a name may print like another."""
    out = []
    for queue in sorted(queues, key=lambda q: q.name):
        try:
            validate_queue_name(queue.name)
        except InvalidQueueName as exc:
            out.append({"queue": queue.name, "escaped": ascii(queue.name), "problem": str(exc)})
    return out


def render_status(doc: dict[str, Any], *, recent: int | None = 10) -> str:
    """Queues with their slot holders, then each queue's ``recent`` newest requests."""
    holders = doc.get("slot_holders", {})
    lines = []
    if "policy" in doc:
        policy = doc["policy"]
        loaded = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(policy["loaded_at_ms"] / 1000))
        lines.append(f"policy: {policy['hash']} (loaded {loaded} by {policy['replica']})")
    lines += ["queues:", *(render_queue_row(q, holders.get(q["name"], [])) for q in doc["queues"])]
    shown: list[dict[str, Any]] = []
    for q in doc["queues"]:
        rows = [r for r in doc["requests"] if r["queue"] == q["name"]]
        shown += rows if recent is None else rows[-recent:]
    hidden = len(doc["requests"]) - len(shown)
    lines.append(f"requests ({hidden} older not shown; --all):" if hidden else "requests:")
    lines += render_request_rows(shown)
    for named in doc.get("name_problems", []):
        lines.append(f"queue name {named['escaped']} breaks the name rule: {named['problem']}")
    damaged = doc.get("damaged", [])
    if damaged:
        lines.append(f"damaged rows ({len(damaged)}, not decodable):")
        lines += [f"  {d['bucket']} {d['key']}: {d['error']}" for d in damaged]
    return "\n".join(lines)

"""``status`` reads whole buckets in one pass, and ``status --json`` honours ``--all``.

On a real broker: rows written and deleted through the KV API, read back by the bulk
readers status, export and the pause check use.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nats_server import connect, delete_topology, unique_tag
from test_service_support import running_service

from stovepipe_fsm.adapters.jetstream import NatsServer, Topology, ensure_topology
from stovepipe_fsm.adapters.jetstream.bulk import kv_snapshot
from stovepipe_fsm.adapters.jetstream.policy_record import (
    read_queue_parameters,
    write_queue_parameters,
)
from stovepipe_fsm.apps.service.operators import status_document
from stovepipe_fsm.apps.service.pauses import pause, read_pauses

ROOT = Path(__file__).resolve().parents[1]
QUEUES = 300
STATUS = [sys.executable, "-m", "stovepipe_fsm.apps.cli", "status", "--json"]


async def test_bulk_reads_see_every_live_row_and_no_deleted_one(nats_server: NatsServer) -> None:
    topology = Topology.isolated(unique_tag())
    nc = await connect(nats_server)
    try:
        js = nc.jetstream()
        await ensure_topology(js, topology)
        kv = await js.key_value(topology.requests_bucket)
        for n in range(500):
            await kv.put(f"row{n:03d}", f"value {n}".encode())
        await kv.delete("row007")
        await kv.put("row008", b"rewritten")
        values = dict(await kv_snapshot(js, topology.requests_bucket))
        assert len(values) == 499 and "row007" not in values
        assert values["row008"] == b"rewritten" and values["row499"] == b"value 499"
        # The service bucket holds a row per queue beside the pauses: each reader takes
        # only its own keys.
        for n in range(QUEUES):
            await write_queue_parameters(js, topology, f"team/q{n}", {"max_concurrent": n})
        await pause(js, topology, "team/*", reason="freeze", by="ops")
        parameters = await read_queue_parameters(js, topology)
        assert len(parameters) == QUEUES and parameters["team/q42"] == {"max_concurrent": 42}
        assert [p.pattern for p in await read_pauses(js, topology)] == ["team/*"]
        assert await kv_snapshot(js, topology.uris_bucket) == []  # an empty bucket
    finally:
        await delete_topology(nc.jetstream(), topology)
        await nc.close()


def _status(url: str, tag: str, *flags: str) -> dict:
    done = subprocess.run(
        [*STATUS, *flags, "--nats", url, "--topology-tag", tag],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_status_json_shows_the_newest_ten_per_queue_and_all_with_all(
    nats_server: NatsServer,
) -> None:
    tag = unique_tag()
    topology = Topology.isolated(tag)
    config = {"defaults": {"max_concurrent": 1}, "queues": {"a/q": {}}}
    async with running_service(nats_server, topology, config) as run:
        for n in range(13):
            await run.ingest("a/q", f"c{n:02d}")
    # Read once the service has stopped: a bulk read racing the rewrites of the rows it
    # reads is not what this test is about.
    nc = await connect(nats_server)
    try:
        doc = await status_document(nc.jetstream(), topology)
    finally:
        await nc.close()
    assert len(doc["requests"]) == 13
    try:
        recent = _status(nats_server.url, tag)
        everything = _status(nats_server.url, tag, "--all")
        assert [r["id"] for r in recent["requests"]] == [
            f"request/a/q/{n}" for n in range(4, 14)
        ]
        assert recent["requests_not_shown"] == 3
        assert len(everything["requests"]) == 13 and "requests_not_shown" not in everything
    finally:
        nc = await connect(nats_server)
        await delete_topology(nc.jetstream(), topology)
        await nc.close()

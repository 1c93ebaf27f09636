"""A store written by a release before request times existed, run by this release.

Layout-1 request rows (no times) are put in the requests bucket by hand, as an older
release left them: one head admitted and building, one waiting. This release serves them:
the waiting head is gated, the building one's outcome is recorded, each row is rewritten
in layout 2 at its next write, and ``status`` reads both layouts. With
``--request-layout 1`` (``Topology.request_layout``) rows stay readable by the older
release.
"""

from __future__ import annotations

import json

from test_service_support import running_service

from stovepipe_fsm.adapters.jetstream import Topology
from stovepipe_fsm.adapters.jetstream.codec import UriEntry, encode_queue, encode_uri_entry
from stovepipe_fsm.adapters.jetstream.names import queue_key, request_key, uri_key
from stovepipe_fsm.adapters.jetstream.publisher import JetStreamPublisher
from stovepipe_fsm.apps.service.operators import status_document
from stovepipe_fsm.domain.entities import Queue

QUEUE = "team/app"
A, B = "request/team/app/1", "request/team/app/2"


def layout_one(request_id: str, uri: str, state: str, strategy: str = "") -> bytes:
    body = {
        "schema": 1,
        "kind": "request",
        "id": request_id,
        "queue": QUEUE,
        "uri": uri,
        "state": state,
        "build_strategy": strategy,
        "base_uri": "",
        "superseded_by": "",
        "version": 2 if strategy else 1,
    }
    return json.dumps(body).encode()


async def seed_old_store(js, topology: Topology) -> None:  # type: ignore[no-untyped-def]
    requests = await js.key_value(topology.requests_bucket)
    await requests.put(request_key(A), layout_one(A, "A", "processing", "full"))
    await requests.put(request_key(B), layout_one(B, "B", "accepted"))
    queues = await js.key_value(topology.queues_bucket)
    row = Queue(QUEUE, latest_request_id=B, slot_holders=(A,), version=3)
    await queues.put(queue_key(QUEUE), encode_queue(row))
    uris = await js.key_value(topology.uris_bucket)
    for rid, uri in ((A, "A"), (B, "B")):
        await uris.put(uri_key(QUEUE, uri), encode_uri_entry(UriEntry(QUEUE, uri, rid)))
    counters = await js.key_value(topology.counters_bucket)
    await counters.put(queue_key(QUEUE), b"2")
    await JetStreamPublisher(js, topology).publish_process(QUEUE, B)


async def test_an_old_layout_store_runs_on_this_release(js_env) -> None:
    await seed_old_store(js_env.js, js_env.topology)
    before = await status_document(js_env.js, js_env.topology)
    assert [(r["uri"], r["state"], r["ingested_at_ms"]) for r in before["requests"]] == [
        ("A", "processing", 0),
        ("B", "accepted", 0),
    ]
    config = {"defaults": {"gate_wait_delay_ms": 100}}
    async with running_service(js_env.server, js_env.topology, config) as run:
        await run.pipeline.stages.record.complete(A, "succeeded")
        await run.wait_state(B, "processing")
        a, b = await run.request(A), await run.request(B)
    assert a.state == "succeeded" and a.ended_at_ms > 0 and a.admitted_at_ms == 0
    assert b.admitted_at_ms > 0 and b.ingested_at_ms == 0  # ingested by the old release
    raw = await (await js_env.js.key_value(js_env.topology.requests_bucket)).get(request_key(B))
    assert json.loads(raw.value)["schema"] == 2  # rewritten in this release's layout


async def test_request_layout_one_keeps_rows_readable_by_the_older_release(js_env) -> None:
    old_readers = Topology.isolated(
        js_env.topology.prefix.removeprefix("stovepipe-"), request_layout=1
    )
    await seed_old_store(js_env.js, old_readers)
    config = {"defaults": {"gate_wait_delay_ms": 100}}
    async with running_service(js_env.server, old_readers, config) as run:
        await run.pipeline.stages.record.complete(A, "succeeded")
        await run.wait_state(B, "processing")
    bucket = await js_env.js.key_value(old_readers.requests_bucket)
    for rid in (A, B):
        body = json.loads((await bucket.get(request_key(rid))).value)
        assert body["schema"] == 1 and "admitted_at_ms" not in body

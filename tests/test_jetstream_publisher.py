"""Publisher: subjects, payloads, and Nats-Msg-Id dedup on a real stream."""

from __future__ import annotations

import asyncio
import json

import pytest
from nats.js import JetStreamContext, api
from nats_server import JsEnv, connect, delete_topology, unique_tag

from stovepipe_fsm.adapters.jetstream import (
    JetStreamPublisher,
    Topology,
    WorkMessage,
    ensure_topology,
)
from stovepipe_fsm.adapters.jetstream.codec import decode_work
from stovepipe_fsm.domain.errors import Retryable
from stovepipe_fsm.domain.hooks import started_event

QUEUE = "monorepo/main"
RID = "request/monorepo/main/1"


async def _messages(js: JetStreamContext, stream: str) -> list[api.RawStreamMsg]:
    """Every message stored in ``stream``, in order (direct reads: no consumer needed)."""
    info = await js.stream_info(stream)
    return [
        await js.get_msg(stream, seq=seq)
        for seq in range(info.state.first_seq, info.state.last_seq + 1)
        if info.state.messages
    ]


async def test_process_publish_twice_stores_once(js_env: JsEnv) -> None:
    publisher = JetStreamPublisher(js_env.js, js_env.topology)
    await publisher.publish_process(QUEUE, RID)
    await publisher.publish_process(QUEUE, RID)
    stored = await _messages(js_env.js, js_env.topology.process_stream)
    assert len(stored) == 1
    assert stored[0].subject == js_env.topology.process_subject(QUEUE)
    assert stored[0].headers is not None and stored[0].headers["Nats-Msg-Id"] == RID
    assert decode_work(stored[0].data) == WorkMessage(queue=QUEUE, request_id=RID)


async def test_distinct_requests_are_distinct_messages(js_env: JsEnv) -> None:
    publisher = JetStreamPublisher(js_env.js, js_env.topology)
    for n in (1, 2, 3):
        await publisher.publish_process(QUEUE, f"request/monorepo/main/{n}")
    await publisher.publish_process("ünï/主", "request/ünï/主/1")
    stored = await _messages(js_env.js, js_env.topology.process_stream)
    assert [decode_work(m.data).request_id for m in stored] == [
        "request/monorepo/main/1",
        "request/monorepo/main/2",
        "request/monorepo/main/3",
        "request/ünï/主/1",
    ]
    assert stored[-1].subject == js_env.topology.process_subject("ünï/主")


async def test_build_publish_twice_stores_once(js_env: JsEnv) -> None:
    publisher = JetStreamPublisher(js_env.js, js_env.topology)
    await publisher.publish_build(QUEUE, RID)
    await publisher.publish_build(QUEUE, RID)
    stored = await _messages(js_env.js, js_env.topology.build_stream)
    assert len(stored) == 1
    assert stored[0].subject == js_env.topology.build_subject(QUEUE)
    body = json.loads(stored[0].data)
    assert (body["queue"], body["request_id"]) == (QUEUE, RID)


async def test_hook_publish_twice_stores_once(js_env: JsEnv) -> None:
    publisher = JetStreamPublisher(js_env.js, js_env.topology)
    event = started_event(QUEUE, RID, admitted_version=2, now_ms=1000)
    again = started_event(QUEUE, RID, admitted_version=2, now_ms=2000)  # a re-announce
    await publisher.publish_hook(event)
    await publisher.publish_hook(again)
    stored = await _messages(js_env.js, js_env.topology.hooks_stream)
    assert len(stored) == 1
    assert stored[0].subject == js_env.topology.hook_subject(event.type)
    assert stored[0].headers is not None and stored[0].headers["Nats-Msg-Id"] == event.id
    assert json.loads(stored[0].data) == event.as_dict()


async def test_republish_after_the_window_is_stored_again(js_env: JsEnv) -> None:
    """Dedup covers accidental doubles only; a late re-publish is a new message."""
    topology = Topology.isolated(unique_tag(), duplicate_window_s=1.0)
    await ensure_topology(js_env.js, topology)
    try:
        publisher = JetStreamPublisher(js_env.js, topology)
        await publisher.publish_process(QUEUE, RID)
        await publisher.publish_process(QUEUE, RID)
        assert len(await _messages(js_env.js, topology.process_stream)) == 1
        await asyncio.sleep(1.5)
        await publisher.publish_process(QUEUE, RID)
        assert len(await _messages(js_env.js, topology.process_stream)) == 2
    finally:
        await delete_topology(js_env.js, topology)


async def test_publish_on_a_closed_connection_is_retryable(js_env: JsEnv) -> None:
    nc = await connect(js_env.server)
    publisher = JetStreamPublisher(nc.jetstream(), js_env.topology)
    await nc.close()
    with pytest.raises(Retryable):
        await publisher.publish_process(QUEUE, RID)
    with pytest.raises(Retryable):
        await publisher.publish_hook(started_event(QUEUE, RID, 2, 0))


async def test_publish_without_the_stream_is_retryable(js_env: JsEnv) -> None:
    """No stream bound to the subject (topology missing): nothing stored, caller retries."""
    publisher = JetStreamPublisher(js_env.js, Topology.isolated(unique_tag()), timeout=1.0)
    with pytest.raises(Retryable):
        await publisher.publish_build(QUEUE, RID)

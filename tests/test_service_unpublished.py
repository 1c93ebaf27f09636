"""Heads an ingest cut short left accepted with no process message, on a real nats-server.

``ingest --from`` writes every head's rows, then publishes their process messages; killed
in between, it leaves heads that no consumer will ever deliver. The service finds them
and publishes their messages, so they are decided; a head that waits with its message
is left alone.
"""

from __future__ import annotations

import asyncio
import dataclasses

from test_service_support import FAST, running_service, wait_for

from stovepipe_fsm.adapters.jetstream import open_kv_stores
from stovepipe_fsm.adapters.jetstream.decision_trail import JetStreamTrail
from stovepipe_fsm.adapters.jetstream.publisher import JetStreamPublisher
from stovepipe_fsm.adapters.memory import SystemClock
from stovepipe_fsm.pipeline.ingest import Head, Ingest

CUT = "team/cut"
BUSY = "team/busy"
CONFIG = {"defaults": {"gate_wait_delay_ms": 100}}
SCAN_S = 0.3
OPTIONS = dataclasses.replace(FAST, unpublished_interval_s=SCAN_S, unpublished_after_s=0.0)


class KilledBeforePublishing(JetStreamPublisher):
    """Where ``ingest --from`` was killed: every row written, no process message sent."""

    async def publish_process(self, queue: str, request_id: str, partition: int = 0) -> None:
        return None


async def test_heads_left_without_a_process_message_are_published_and_decided(js_env) -> None:  # type: ignore[no-untyped-def]
    stores = await open_kv_stores(js_env.js, js_env.topology)
    cut_short = Ingest(
        initial_state="accepted",
        requests=stores.requests,
        queues=stores.queues,
        publisher=KilledBeforePublishing(js_env.js, js_env.topology),
        uri_index=stores.uris,
        counter=stores.counters,
        clock=SystemClock(),
        trail=JetStreamTrail(js_env.js, js_env.topology),
    )
    heads = [Head(CUT, uri) for uri in ("A", "B", "C")]
    a, b, c = [r.request_id for r in await cut_short.ingest_many(heads)]
    async with running_service(js_env.server, js_env.topology, CONFIG, options=OPTIONS) as run:
        building = await run.ingest(BUSY, "X")
        await run.wait_state(building, "processing")
        held = await run.ingest(BUSY, "Y")  # waits for X's slot, with its message
        await run.wait_state(c, "processing")
        await run.wait_state(a, "superseded")
        await run.wait_state(b, "superseded")
        assert sorted(r for e, _, r, _ in run.events.seen if e == "republished") == [a, b, c]
        await asyncio.sleep(3 * SCAN_S)  # rounds that find Y waiting with its message
        assert run.events.count("republished", held) == 0
        assert await run.state(held) == "accepted"
        subject = js_env.topology.process_subject(BUSY)
        info = await js_env.js.stream_info(js_env.topology.process_stream, subjects_filter=subject)
        assert info.state.subjects == {subject: 1}

        async def held_again() -> bool:
            return run.events.count("held", held) >= 2

        await wait_for(held_again, "Y held by its one message")

"""A decision on a real broker reads the newer heads of its queue in one pass.

With ``max_concurrent`` large, a head waiting behind a backlog is kept or superseded on
the number of newer heads not yet terminal; the messages the decision sends to the broker
must not grow with that backlog (a read per newer head made a 400-head backlog cost
minutes).
"""

from __future__ import annotations

from pathlib import Path

from nats_server import JsEnv

from stovepipe_fsm.adapters.jetstream import open_kv_stores
from stovepipe_fsm.adapters.memory import (
    ManualClock,
    MemoryDelivery,
    MemoryPublisher,
    MemorySourceControl,
    MemorySourceControlProvider,
)
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.domain.entities import QueueConfig
from stovepipe_fsm.domain.ids import format_request_id
from stovepipe_fsm.pipeline.ingest import Head
from stovepipe_fsm.pipeline.wiring import Ports, Stages, build_stages
from stovepipe_fsm.process.catalog import load_process_machines

MACHINES = load_process_machines(Path(__file__).resolve().parents[1] / "machines")


async def stages_on(js_env: JsEnv, queue: str, heads: int, **config: int) -> Stages:
    """The stages on the broker's stores, ``heads`` heads of ``queue`` ingested."""
    stores = await open_kv_stores(js_env.js, js_env.topology)
    uris = [f"c{n}" for n in range(heads)]
    stages = build_stages(
        MACHINES,
        Ports(
            requests=stores.requests,
            queues=stores.queues,
            uri_index=stores.uris,
            counter=stores.counters,
            config=StaticConfigStore(QueueConfig.of(gate_wait_delay_ms=1000, **config)),
            source_control=MemorySourceControlProvider(
                default=MemorySourceControl({u: uris[:i] for i, u in enumerate(uris)})
            ),
            publisher=MemoryPublisher(),
            clock=ManualClock(1_000),
        ),
    )
    await stages.ingest.ingest_many([Head(queue, u) for u in uris])
    return stages


async def sent_deciding(js_env: JsEnv, stages: Stages, queue: str, counter: int) -> int:
    """Messages the client sent to the broker while deciding request ``counter``."""
    request_id = format_request_id(queue, counter)
    before = js_env.nc.stats["out_msgs"]
    decision = await stages.controller.decide(MemoryDelivery(queue, request_id))
    sent = js_env.nc.stats["out_msgs"] - before
    assert decision.outcome == "acked"
    assert (await stages.services.requests.get(request_id)).state == "processing"
    return sent


async def test_the_reads_of_a_decision_do_not_grow_with_the_newer_heads(js_env: JsEnv) -> None:
    few = await stages_on(js_env, "small/backlog", 4, max_concurrent=1000)
    many = await stages_on(js_env, "large/backlog", 150, max_concurrent=1000)
    # The oldest head is kept (fewer newer heads than slots) and admitted in both.
    assert await sent_deciding(js_env, few, "small/backlog", 1) == await sent_deciding(
        js_env, many, "large/backlog", 1
    )


async def test_terminal_and_missing_newer_heads_are_not_counted(js_env: JsEnv) -> None:
    queue = "kept/three"
    stages = await stages_on(js_env, queue, 8, keep_newest=3, max_concurrent=1000)
    requests, lifecycle = stages.services.requests, stages.services.lifecycle
    # Heads 3..6 end (failed closed): only 2, 7 and 8 are live, so 2 is among the
    # newest three and 1 is not.
    for n in range(3, 7):
        await lifecycle.fail_closed(await requests.get(format_request_id(queue, n)))
    first = await stages.controller.decide(MemoryDelivery(queue, format_request_id(queue, 1)))
    assert first.outcome == "acked"
    assert (await requests.get(format_request_id(queue, 1))).state == "superseded"
    await sent_deciding(js_env, stages, queue, 2)

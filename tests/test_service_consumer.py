"""The JetStream runtime of the process stage against a real nats-server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import nats.js.errors
import pytest
from nats.aio.client import Client
from nats_server import (
    TOPOLOGY_STREAMS,
    account_limited_config,
    account_limited_server,
    delete_topology,
    unique_tag,
)
from test_service_support import (
    FAST,
    memory_provider,
    running_service,
    stream_messages,
    wait_for,
)

from stovepipe_fsm.adapters.jetstream import Topology, ensure_topology
from stovepipe_fsm.adapters.jetstream.codec import WorkMessage, encode_work
from stovepipe_fsm.adapters.jetstream.dead_letter import DeadLetter, publish_dead_letter
from stovepipe_fsm.adapters.jetstream.terminations import TerminationMark

Q1, Q2 = "monorepo/main", "mobile/app"


def config(**knobs: object) -> dict:
    defaults = {"max_concurrent": 1, "gate_wait_delay_ms": 100, "max_attempts": 3}
    defaults.update(knobs)
    return {"defaults": defaults, "queues": {Q1: {}}}


async def dead_letters(env) -> list[dict]:
    return await stream_messages(
        env.js, env.topology.dead_letter_stream, f"{env.topology.prefix}.dlq."
    )


async def test_ingest_process_publishes_build(js_env) -> None:
    async with running_service(js_env.server, js_env.topology, config()) as run:
        rid = await run.ingest(Q1, "A")
        await run.wait_state(rid, "processing")
        request = await run.request(rid)
        assert request.build_strategy == "full"
        builds = await wait_for(
            lambda: stream_messages(
                js_env.js, js_env.topology.build_stream, js_env.topology.build_subject(Q1)
            ),
            "a build message",
        )
        assert [b["request_id"] for b in builds] == [rid]
        assert (await run.queue(Q1)).slot_holders == (rid,)


async def test_held_head_is_a_barrier_for_its_own_queue_only(js_env) -> None:
    async with running_service(
        js_env.server, js_env.topology, config(gate_wait_delay_ms=1500)
    ) as run:
        a = await run.ingest(Q1, "A")
        await run.wait_state(a, "processing")
        b = await run.ingest(Q1, "B")

        async def b_held() -> bool:
            return run.events.count("held", b) >= 1

        await wait_for(b_held, "B held")
        # While B waits out its hold, a newer head C stays behind it, undelivered ...
        c = await run.ingest(Q1, "C")
        # ... and the other queue is not blocked (its consumer starts on discovery).
        x = await run.ingest(Q2, "A")
        await run.wait_state(x, "processing")
        assert [e for e in run.events.seen if e[2] == c] == []
        assert await run.state(b) == "accepted"
        # B wakes, finds C newer: superseded; C is then held on the closed gate.
        await run.wait_state(b, "superseded")

        async def c_held() -> bool:
            return run.events.count("held", c) >= 1

        await wait_for(c_held, "C held")
        await run.pipeline.stages.record.complete(a, "succeeded")
        await run.wait_state(c, "processing")
        request = await run.request(c)
        assert (request.build_strategy, request.base_uri) == ("incremental_since_green", "A")


async def test_holds_never_consume_the_failure_budget(js_env) -> None:
    async with running_service(
        js_env.server, js_env.topology, config(max_attempts=1, gate_wait_delay_ms=50)
    ) as run:
        a = await run.ingest(Q1, "A")
        await run.wait_state(a, "processing")
        b = await run.ingest(Q1, "B")

        async def held_often() -> bool:
            return run.events.count("held", b) >= 5

        await wait_for(held_often, "B held five times")
        assert run.events.count("dead_letter") == 0 and run.events.count("retry") == 0
        assert await run.state(b) == "accepted"
        assert await dead_letters(js_env) == []


async def test_retries_then_dead_letters_and_reconciles(js_env) -> None:
    graph, provider = memory_provider()
    async with running_service(
        js_env.server, js_env.topology, config(max_attempts=3), provider=provider
    ) as run:
        a = await run.ingest(Q1, "A")
        await run.wait_state(a, "processing")
        await run.pipeline.stages.record.complete(a, "succeeded")
        graph.set_available(False)  # ancestry of B against last green A now fails
        b = await run.ingest(Q1, "B")
        await run.wait_state(b, "failed")
        assert run.events.count("retry", b) == 2
        letters = await dead_letters(js_env)
        assert len(letters) == 1
        letter = letters[0]
        assert (letter["request_id"], letter["queue"], letter["attempts"]) == (b, Q1, 3)
        assert "source control unavailable" in letter["error"]
        # The queue moves on: a newer head is admitted once ancestry is back.
        graph.set_available(True)
        c = await run.ingest(Q1, "C")
        await run.wait_state(c, "processing")
        assert (await run.queue(Q1)).slot_holders == (c,)


async def test_non_retryable_deliveries_go_straight_to_dead_letters(js_env) -> None:
    topology, js = js_env.topology, js_env.js
    async with running_service(js_env.server, topology, config()) as run:
        a = await run.ingest(Q1, "A")
        await run.wait_state(a, "processing")
        other = await run.ingest(Q2, "X")
        await run.wait_state(other, "processing")
        subject = topology.process_subject(Q1)
        await js.publish(subject, b"not json", stream=topology.process_stream)
        await js.publish(
            subject,
            encode_work(WorkMessage(queue=Q1, request_id=other)),
            stream=topology.process_stream,
        )
        await js.publish(
            subject,
            encode_work(WorkMessage(queue=Q1, request_id=f"request/{Q1}/99")),
            stream=topology.process_stream,
        )

        async def three() -> list[dict]:
            letters = await dead_letters(js_env)
            return letters if len(letters) == 3 else []

        letters = await wait_for(three, "three dead letters")
        # A payload that fails its checks names no request in its record: it must not
        # fail one closed (the misrouted copy names a request healthy on its own queue).
        assert [lt["request_id"] for lt in letters] == ["", "", f"request/{Q1}/99"]
        assert all(lt["attempts"] == 0 and lt["queue"] == Q1 for lt in letters)
        assert "undecodable" in letters[0]["error"]
        assert f"belongs to queue {Q2!r}" in letters[1]["error"]
        assert other in letters[1]["error"]
        assert run.events.count("retry") == 0

        async def reconciled() -> bool:
            return run.events.count("reconciled") == 3

        await wait_for(reconciled, "the three records to be reconciled")
        assert await run.state(other) == "processing"
        assert await run.state(a) == "processing"
        info = await js.stream_info(topology.process_stream)
        assert info.state.messages == 0


async def test_reconciler_frees_the_slot_of_a_dead_lettered_request(js_env) -> None:
    async with running_service(js_env.server, js_env.topology, config()) as run:
        a = await run.ingest(Q1, "A")
        await run.wait_state(a, "processing")
        b = await run.ingest(Q1, "B")

        async def held() -> bool:
            return run.events.count("held", b) >= 1

        await wait_for(held, "B held")
        # The service's own record: its termination mark names the same queue and request.
        letter = DeadLetter(Q1, a, "gave up after 5 attempts", 5, 10_000)
        await run.pipeline.terminations.mark(10_000, TerminationMark(Q1, a))
        await publish_dead_letter(js_env.js, js_env.topology, letter)
        await run.wait_state(a, "failed")
        await run.wait_state(b, "processing")
        assert (await run.queue(Q1)).slot_holders == (b,)
        assert (await run.request(b)).build_strategy == "full"


async def test_a_retried_message_that_succeeds_leaves_no_failure_record(js_env) -> None:
    graph, provider = memory_provider()
    async with running_service(
        js_env.server, js_env.topology, config(max_attempts=5), provider=provider
    ) as run:
        a = await run.ingest(Q1, "A")
        await run.wait_state(a, "processing")
        await run.pipeline.stages.record.complete(a, "succeeded")
        graph.set_available(False)
        b = await run.ingest(Q1, "B")

        async def retried() -> bool:
            return run.events.count("retry", b) >= 1

        await wait_for(retried, "B retried")
        graph.set_available(True)
        await run.wait_state(b, "processing")
        kv = await js_env.js.key_value(js_env.topology.attempts_bucket)

        async def ledger_empty() -> bool:
            try:
                return not await kv.keys()
            except nats.js.errors.NoKeysError:  # the bucket holds nothing
                return True

        await wait_for(ledger_empty, "the failure record forgotten")


async def raw_stream_config(nc: Client, stream: str) -> dict[str, Any]:
    reply = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=5.0)
    config: dict[str, Any] = json.loads(reply.data)["config"]
    config.pop("created", None)
    return config


async def test_a_queue_past_the_streams_consumer_limit_has_the_limit_raised(
    js_env, caplog: pytest.LogCaptureFixture
) -> None:
    """One consumer per queue: the stream's limit would cap the queues served, so the
    service raises it (keeping every other setting) instead of refusing the queue."""
    topology = Topology.isolated(unique_tag(), initial_queue_limit=2)
    queues = {"a/one": {}, "a/two": {}, "a/three": {}}
    try:
        await ensure_topology(js_env.js, topology)
        before = await raw_stream_config(js_env.nc, topology.process_stream)
        with caplog.at_level(logging.WARNING, logger="stovepipe_fsm.service"):
            async with running_service(
                js_env.server, topology, {"defaults": {"max_attempts": 3}, "queues": queues}
            ) as run:
                assert sorted(run.service.crew.queues.consumers) == sorted(queues)
                assert run.service.crew.queues.refused == {}
                after = await raw_stream_config(js_env.nc, topology.process_stream)
                # Refused at 2 consumers: doubled, and at least 1,000 above the count.
                # Every other field as the server reported it, known to the client or not.
                assert after == {**before, "max_consumers": 1002}
                for queue in queues:
                    rid = await run.ingest(queue, "A")
                    await run.wait_state(rid, "processing")
        raised = [r.getMessage() for r in caplog.records if "limit raised" in r.getMessage()]
        assert raised == [
            f"stream {topology.process_stream} consumer limit raised from 2 to 1002 "
            "(2 consumers, one per queue)"
        ]
    finally:
        await delete_topology(js_env.js, topology)


@pytest.mark.nats  # a broker of its own, with limits
async def test_a_queue_with_no_partition_left_is_refused_clearly(tmp_path: Path) -> None:
    """The account's JetStream consumer limit caps each stream, so no raise of the
    stream's own limit lifts it, and an account that may hold no more streams leaves no
    partition to move a queue to: queues past it are refused with a sentence that names
    both limits, and the queues that have a consumer keep working."""
    queues = {f"a/q{n}": {} for n in range(6)}
    with account_limited_server(tmp_path, max_consumers=5, max_streams=TOPOLOGY_STREAMS) as server:
        topology = Topology.isolated(unique_tag(), initial_queue_limit=2)
        config = {"defaults": {"max_attempts": 3}, "queues": queues}
        async with running_service(server, topology, config) as run:
            crew = run.service.crew
            assert crew.queues.consumers and crew.queues.refused
            assert sorted([*crew.queues.consumers, *crew.queues.refused]) == sorted(queues)
            for why in crew.queues.refused.values():
                assert "maximum consumers limit reached" in why
                assert "caps each stream at the account's JetStream consumer limit (5)" in why
                assert "creating partition 1 failed" in why
                assert f"the account allows {TOPOLOGY_STREAMS} streams" in why
            info = await run.nc.jetstream().stream_info(topology.process_stream)
            # Raised as far as the account lets it, not to the wanted 1,000 more.
            assert info.config.max_consumers <= 5
            assert info.state.consumer_count == len(crew.queues.consumers)
            assert await crew.discovery.discover() == []  # not retried every round
            served = sorted(crew.queues.consumers)[0]
            rid = await run.ingest(served, "A")  # the served queues keep working
            await run.wait_state(rid, "processing")


@pytest.mark.nats  # a broker of its own, with limits
@pytest.mark.parametrize(
    ("raised", "partition"),
    [({"max_consumers": 10}, 0), ({"max_streams": TOPOLOGY_STREAMS + 1}, 1)],
    ids=["consumers", "streams"],
)
async def test_refused_queues_are_served_once_the_accounts_limit_is_raised(
    tmp_path: Path, raised: dict[str, int], partition: int
) -> None:
    """An operator raises one of the account's limits (a config reload of the broker):
    the refused queue gets its consumer at the next retry, without a restart, on the
    process stream (more consumers per stream) or on a new partition (one more stream)."""
    queues = {f"b/q{n}": {} for n in range(4)}
    limits = {"max_consumers": 3, "max_streams": TOPOLOGY_STREAMS}
    with account_limited_server(tmp_path, **limits) as server:
        topology = Topology.isolated(unique_tag())
        config = {"defaults": {"max_attempts": 3}, "queues": queues}
        options = dataclasses.replace(FAST, refused_retry_s=0.3)
        async with running_service(server, topology, config, options=options) as run:
            service = run.service
            crew = service.crew
            assert len(crew.queues.consumers) == 3 and len(crew.queues.refused) == 1
            (refused,) = crew.queues.refused
            await asyncio.sleep(0.6)  # retry rounds pass: no room, nothing tried
            assert refused in crew.queues.refused and refused not in crew.queues.consumers

            account_limited_config(tmp_path, **{**limits, **raised})
            assert server.pid is not None
            os.kill(server.pid, signal.SIGHUP)  # nats-server reloads its config

            async def served() -> bool:
                return refused in crew.queues.consumers

            await wait_for(served, "the refused queue served after the raise", timeout=10)
            assert crew.queues.refused == {} and service.ready
            assert crew.queues.consumers[refused].partition == partition
            stream = topology.process_stream_of(partition)
            info = await run.nc.jetstream().stream_info(stream)
            assert info.state.consumer_count == (4 if partition == 0 else 1)
            rid = await run.ingest(refused, "A")
            await run.wait_state(rid, "processing")

"""The JetStream runtime of the process stage against a real nats-server."""

from __future__ import annotations

import nats.js.errors
from nats_server import delete_topology, unique_tag
from test_service_support import (
    memory_provider,
    running_service,
    stream_messages,
    wait_for,
)

from stovepipe_fsm.adapters.jetstream import Topology
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
        await run.pipeline.record.complete(a, "succeeded")
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
        await run.pipeline.record.complete(a, "succeeded")
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
        await run.pipeline.record.complete(a, "succeeded")
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


async def test_a_queue_past_the_consumer_limit_is_refused_clearly(js_env) -> None:
    topology = Topology.isolated(unique_tag(), max_queues=2)
    queues = {"a/one": {}, "a/two": {}, "a/three": {}}
    try:
        async with running_service(
            js_env.server, topology, {"defaults": {"max_attempts": 3}, "queues": queues}
        ) as run:
            service = run.service
            # Consumers open concurrently: which two win the stream's two is not fixed.
            assert len(service.consumers) == 2 and len(service.refused) == 1
            assert sorted([*service.consumers, *service.refused]) == sorted(queues)
            [left_out] = service.refused
            served = sorted(service.consumers)
            why = service.refused[left_out]
            assert "maximum consumers limit reached" in why and "max_consumers" in why
            assert await service.discover() == []  # not retried every round
            rid = await run.ingest(served[0], "A")  # the served queues keep working
            await run.wait_state(rid, "processing")
    finally:
        await delete_topology(js_env.js, topology)

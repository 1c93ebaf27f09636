"""Nothing wedges a queue: poison messages, a failing dead-letter path, forged records.

Each test runs the service on a real nats-server and checks that the message in question
is settled (gone from the process stream, or coming back within the retry backoff rather
than the ack deadline) and that the queue's next head is admitted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import pytest
from nats_server import JsEnv
from test_service_support import FAST, memory_provider, running_service, stream_messages, wait_for

from stovepipe_fsm.adapters.jetstream.codec import WorkMessage, encode_work
from stovepipe_fsm.adapters.jetstream.dead_letter import (
    MAX_FIELD_CHARS,
    DeadLetter,
    publish_dead_letter,
)
from stovepipe_fsm.adapters.jetstream.terminations import TerminationMark
from stovepipe_fsm.apps.service.http import render_metrics
from stovepipe_fsm.apps.service.operators import render_status, status_document

Q1, Q2 = "monorepo/main", "mobile/app"
HUGE_ID = f"request/{Q1}/" + "9" * 600_000
#: Slow ack deadline: a message left unsettled would come back only after this long.
SLOW_ACK = dataclasses.replace(FAST, ack_wait_s=30.0)


def config() -> dict:
    return {
        "defaults": {"max_concurrent": 1, "gate_wait_delay_ms": 100, "max_attempts": 3},
        "queues": {Q1: {}, Q2: {}},
    }


async def dead_letters(env: JsEnv) -> list[dict]:
    return await stream_messages(
        env.js, env.topology.dead_letter_stream, f"{env.topology.prefix}.dlq."
    )


async def process_messages(env: JsEnv) -> int:
    return int((await env.js.stream_info(env.topology.process_stream)).state.messages)


async def publish_poison(env: JsEnv) -> None:
    payload = encode_work(WorkMessage(queue=Q1, request_id=HUGE_ID))
    assert len(payload) > 600_000
    await env.js.publish(
        env.topology.process_subject(Q1), payload, stream=env.topology.process_stream
    )


async def set_dead_letter_size_limit(env: JsEnv, limit: int) -> None:
    info = await env.js.stream_info(env.topology.dead_letter_stream)
    await env.js.update_stream(dataclasses.replace(info.config, max_msg_size=limit))


async def test_a_600_kb_request_id_is_dead_lettered_bounded_and_the_queue_moves_on(
    js_env: JsEnv, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="stovepipe_fsm")
    async with running_service(js_env.server, js_env.topology, config(), options=SLOW_ACK) as run:
        await publish_poison(js_env)
        letters = await wait_for(lambda: dead_letters(js_env), "the poison's dead letter")
        [letter] = letters
        assert letter["request_id"] == "" and letter["queue"] == Q1
        # The record says what is wrong and quotes the id cut, with its length and digest.
        assert "work request id is 600022 characters" in letter["error"]
        assert "[600022 chars, sha256:" in letter["error"]
        assert len(letter["error"]) <= MAX_FIELD_CHARS
        assert await process_messages(js_env) == 0
        # The queue is not wedged: its next head is admitted at once.
        rid = await run.ingest(Q1, "A")
        await run.wait_state(rid, "processing")
    longest = max(len(r.getMessage()) + len(str(vars(r))) for r in caplog.records)
    assert longest < 8_000, f"a log record of {longest} characters"


async def test_a_record_over_the_size_limit_is_replaced_by_a_minimal_one(js_env: JsEnv) -> None:
    async with running_service(js_env.server, js_env.topology, config(), options=SLOW_ACK) as run:
        # Room for a minimal record only (the limit counts subject and headers too): the
        # full one takes about 490 bytes, the minimal one (200 characters of error) 390.
        await set_dead_letter_size_limit(js_env, 420)
        await publish_poison(js_env)
        [letter] = await wait_for(lambda: dead_letters(js_env), "a minimal dead letter")
        assert len(letter["error"]) <= 200
        assert await process_messages(js_env) == 0
        assert run.events.count("dead_letter") == 1


async def test_when_no_record_can_be_published_the_message_is_nakked_with_backoff(
    js_env: JsEnv,
) -> None:
    async with running_service(js_env.server, js_env.topology, config(), options=SLOW_ACK) as run:
        await set_dead_letter_size_limit(js_env, 32)  # not even a minimal record fits
        await publish_poison(js_env)

        async def handed_back_often() -> bool:
            return run.events.count("settle_failed") >= 3

        # Three redeliveries within the retry backoff (at most 0.2 s each), where an
        # unsettled message would come back once per 30 s ack deadline.
        await wait_for(handed_back_often, "three hand-backs", timeout=10.0)
        assert run.events.count("dead_letter") == 0
        assert await process_messages(js_env) == 1  # nothing left without a record
        assert await dead_letters(js_env) == []
        await set_dead_letter_size_limit(js_env, -1)  # the dead-letter path works again
        await wait_for(lambda: dead_letters(js_env), "the dead letter once it fits")
        assert await process_messages(js_env) == 0
        rid = await run.ingest(Q1, "A")
        await run.wait_state(rid, "processing")


async def test_forged_dead_letters_fail_nothing(js_env: JsEnv) -> None:
    topology = js_env.topology
    async with running_service(js_env.server, topology, config()) as run:
        a = await run.ingest(Q1, "A")
        await run.wait_state(a, "processing")
        x = await run.ingest(Q2, "X")
        await run.wait_state(x, "processing")
        # No termination by the service at all.
        await publish_dead_letter(js_env.js, topology, DeadLetter(Q1, a, "forged", 3, 1))
        # A real termination mark, but for another request.
        await run.pipeline.terminations.mark(5_000, TerminationMark(Q1, f"request/{Q1}/77"))
        await publish_dead_letter(js_env.js, topology, DeadLetter(Q1, a, "forged", 3, 5_000))
        # A record on one queue's subject naming another queue.
        await run.pipeline.terminations.mark(5_001, TerminationMark(Q2, x))
        await js_env.js.publish(
            topology.dead_letter_subject(Q1),
            DeadLetter(Q2, x, "forged", 3, 5_001).encode(),
            stream=topology.dead_letter_stream,
        )

        async def all_ignored() -> bool:
            return run.events.count("ignored") == 3

        await wait_for(all_ignored, "three forged records ignored")
        assert run.events.count("reconciled") == 0
        assert await run.state(a) == "processing"
        assert await run.state(x) == "processing"
        assert (await run.queue(Q1)).slot_holders == (a,)


async def test_a_damaged_row_is_final_for_the_reconciler(js_env: JsEnv) -> None:
    async with running_service(js_env.server, js_env.topology, config()) as run:
        a = await run.ingest(Q1, "A")
        await run.wait_state(a, "processing")
        kv = await js_env.js.key_value(js_env.topology.requests_bucket)
        await kv.put(a, b'{"schema": 1, "kind": "request", "id": 42}')
        await run.pipeline.terminations.mark(9_000, TerminationMark(Q1, a))
        await publish_dead_letter(js_env.js, js_env.topology, DeadLetter(Q1, a, "x", 3, 9_000))

        async def given_up() -> bool:
            return run.events.count("unreconcilable", a) == 1

        await wait_for(given_up, "the damaged row's record to be given up on")
        await wait_for(lambda: _settled(js_env), "the record acked")
        await asyncio.sleep(0.5)  # a NAKed record would be back within the 2 s retry
        assert run.events.count("unreconcilable", a) == 1
        # status shows the damaged row for what it is and every other row as usual.
        b = await run.ingest(Q2, "B")
        await run.wait_state(b, "processing")
        doc = await status_document(js_env.js, js_env.topology)
        assert [r["id"] for r in doc["requests"]] == [b]
        [damaged] = doc["damaged"]
        assert damaged["bucket"] == js_env.topology.requests_bucket
        assert "request value is missing field(s)" in damaged["error"]
        text = render_status(doc)
        assert "damaged rows (1, not decodable):" in text and b in text


async def _settled(env: JsEnv) -> bool:
    info = await env.js.consumer_info(env.topology.dead_letter_stream, "dlq-process-reconciler")
    return info.num_ack_pending == 0 and info.num_pending == 0 and info.num_redelivered == 0


async def test_messages_on_a_subject_without_a_queue_row_are_dead_lettered(
    js_env: JsEnv,
) -> None:
    topology = js_env.topology
    async with running_service(js_env.server, topology, config()) as run:
        a = await run.ingest(Q1, "A")
        await run.wait_state(a, "processing")
        ghost = "ghost/queue"  # a valid name that ingest never saw: no row, no consumer
        work = encode_work(WorkMessage(queue=ghost, request_id=f"request/{ghost}/1"))
        for _ in range(2):
            await js_env.js.publish(
                topology.process_subject(ghost), work, stream=topology.process_stream
            )
        bad_token = f"{topology.prefix}.process.bad_ZZ"  # decodes to no queue name at all
        await js_env.js.publish(bad_token, b"{}", stream=topology.process_stream)

        async def swept() -> bool:
            return run.events.count("orphan") == 3

        await wait_for(swept, "three orphans dead-lettered")
        assert await process_messages(js_env) == 0
        letters = await dead_letters(js_env)
        assert sorted(lt["queue"] for lt in letters) == ["bad_ZZ", ghost, ghost]
        assert all("no queue row" in lt["error"] and lt["request_id"] == "" for lt in letters)
        metrics = await render_metrics(run.service)
        assert "stovepipe_orphan_messages_total 3" in metrics
        # The queue with a row is served as before.
        assert await run.state(a) == "processing"
        assert ghost not in run.service.crew.queues.consumers


async def test_when_the_failure_count_cannot_be_stored_the_message_is_nakked_with_backoff(
    js_env: JsEnv,
) -> None:
    graph, provider = memory_provider()
    async with running_service(
        js_env.server, js_env.topology, config(), provider=provider, options=SLOW_ACK
    ) as run:
        a = await run.ingest(Q1, "A")
        await run.wait_state(a, "processing")
        await run.pipeline.stages.record.complete(a, "succeeded")
        attempts = f"KV_{js_env.topology.attempts_bucket}"
        info = await js_env.js.stream_info(attempts)
        await js_env.js.update_stream(dataclasses.replace(info.config, max_msg_size=1))
        graph.set_available(False)  # B's ancestry check fails: a retry to count
        b = await run.ingest(Q1, "B")

        async def handed_back_often() -> bool:
            return run.events.count("settle_failed") >= 3

        await wait_for(handed_back_often, "three hand-backs", timeout=10.0)
        assert run.events.count("retry") == 0  # no count stored, so no retry counted
        await js_env.js.update_stream(dataclasses.replace(info.config, max_msg_size=-1))
        graph.set_available(True)
        await run.wait_state(b, "processing")

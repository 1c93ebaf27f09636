"""``cancel``, ``retry`` and ``dlq`` as an operator runs them, against a running service on
a real nats-server: what each does, its exit code and sentence, its trail record."""

from __future__ import annotations

import asyncio
import json

from test_service_cli import cli, tag  # noqa: F401
from test_service_pause import options
from test_service_support import memory_provider, running_service, wait_for

from stovepipe_fsm.adapters.jetstream.decision_trail import JetStreamTrail
from stovepipe_fsm.adapters.jetstream.policy_record import (
    PolicyRecord,
    read_policy_record,
    write_policy_record,
)
from stovepipe_fsm.apps.service.operators import explain_document, status_document

Q = "monorepo/main"
WITHDRAW_ROLE = "  withdraw: withdraw"
CONFIG = {"defaults": {"max_concurrent": 1, "gate_wait_delay_ms": 100, "max_attempts": 2}}


def broker(js_env) -> list[str]:  # type: ignore[no-untyped-def]
    tag_ = js_env.topology.prefix.removeprefix("stovepipe-")
    return ["--nats", js_env.server.url, "--topology-tag", tag_]


async def run_cli(*args: str):  # type: ignore[no-untyped-def]
    return await asyncio.to_thread(cli, *args)


async def test_cancel_a_waiting_head_refuse_a_running_one_and_retry_it(js_env) -> None:
    where = broker(js_env)
    async with running_service(js_env.server, js_env.topology, CONFIG) as run:
        a = await run.ingest(Q, "A")
        await run.wait_state(a, "processing")
        b = await run.ingest(Q, "B")
        await wait_for(lambda: _counted(run, "held", b), "B held behind A")

        done = await run_cli("cancel", b, *where)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["cancelled"] and answer["request"]["state"] == "cancelled"
        again = await run_cli("cancel", "--queue", Q, "--uri", "B", *where)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["message"] == f"request {b} already ended as cancelled"

        running = await run_cli("cancel", a, *where)
        assert running.returncode == 2
        assert f"request {a} is running (processing, admitted 20" in running.stderr
        assert "a running build is never preempted" in running.stderr
        assert await run.state(a) == "processing"

        # B's delivery is acked as terminal; A keeps its slot, nothing else waits on B.
        await run.pipeline.stages.record.complete(a, "succeeded")
        await wait_for(lambda: _idle(run), "the queue row holds no slot")

        retried = await run_cli("retry", b, *where)
        assert retried.returncode == 0, retried.stderr
        c = json.loads(retried.stdout)["request_id"]
        assert json.loads(retried.stdout)["created"] is True
        await run.wait_state(c, "processing")
        twice = await run_cli("retry", b, *where)
        assert twice.returncode == 0, twice.stderr
        assert json.loads(twice.stdout) == {
            "request_id": c,
            "retry_of": b,
            "created": False,
            "published": False,
            "message": f"request {b} was already retried as {c}",
        }
        refused = await run_cli("retry", a, *where)
        assert refused.returncode == 2
        assert f"a newer head {c} was ingested since {a}; it will be validated" in refused.stderr

        doc = await status_document(js_env.js, js_env.topology)
        rows = {r["id"]: r for r in doc["requests"]}
        assert rows[c]["retry_of"] == b and rows[c]["uri"] == "B"
        assert "retry_of" not in rows[a]
        shown = await run_cli("status", *where)
        assert f"(retry of {b})" in shown.stdout

    history = (await explain_document(options(js_env), js_env.topology, b, "", ""))["history"]
    sentences = [h["sentence"] for h in history if h["kind"] == "operator"]
    me = sentences[0].split()[1]
    assert sentences == [
        f"operator {me} ran cancel: withdrawn while waiting (accepted -> cancelled)",
        f"operator {me} ran retry: retried as {c}",
    ]
    new = (await explain_document(options(js_env), js_env.topology, c, "", ""))["history"]
    assert new[0]["sentence"] == f"ingested B (retry of {b})"


async def test_cancel_without_a_withdraw_role_in_the_policy_is_refused(js_env) -> None:
    where = broker(js_env)
    async with running_service(js_env.server, js_env.topology, CONFIG) as run:
        a = await run.ingest(Q, "A")
        await run.wait_state(a, "processing")
        b = await run.ingest(Q, "B")
        record = await read_policy_record(js_env.js, js_env.topology)
        assert record is not None and record.withdraw == "withdraw"
        assert record.withdrawn == "cancelled" and record.green_outcome == "succeeded"
        await run.service.stop()  # no service rewrites the record meanwhile
        older = PolicyRecord(
            "cafe",
            0,
            "r",
            request_initial="accepted",
            outcomes=record.outcomes,
            terminal_states=record.terminal_states,
            green_outcome="succeeded",
            # The same machine without the optional role.
            request_machine=record.request_machine.replace(WITHDRAW_ROLE, ""),
        )
        assert WITHDRAW_ROLE in record.request_machine
        await write_policy_record(js_env.js, js_env.topology, older)
        done = await run_cli("cancel", b, *where)
        assert done.returncode == 2
        assert "the policy in force (cafe) declares no withdraw transition" in done.stderr
        assert await run.state(b) == "accepted"


async def test_dlq_list_replay_and_prune(js_env) -> None:
    where = broker(js_env)
    graph, provider = memory_provider()
    async with running_service(
        js_env.server, js_env.topology, CONFIG, provider=provider
    ) as run:
        a = await run.ingest(Q, "A")
        await run.wait_state(a, "processing")
        await run.pipeline.stages.record.complete(a, "succeeded")
        graph.set_available(False)  # B's ancestry cannot be read: dead-lettered
        b = await run.ingest(Q, "B")
        await run.wait_state(b, "failed")

        listed = await run_cli("dlq", "list", "--json", *where)
        assert listed.returncode == 0, listed.stderr
        [letter] = json.loads(listed.stdout)["dead_letters"]
        assert (letter["queue"], letter["request_id"], letter["attempts"]) == (Q, b, 2)
        assert letter["stage"] == "process" and letter["at_ms"] > 0
        assert "source control unavailable" in letter["reason"]
        text = await run_cli("dlq", "list", "--queue", "monorepo/*", *where)
        assert f"{letter['id']:>6}" in text.stdout and b in text.stdout
        header = text.stdout.splitlines()[0].split()
        assert header == ["id", "stored", "at", "stage", "queue", "request", "attempts", "reason"]
        other = await run_cli("dlq", "list", "--queue", "mobile/*", *where)
        assert other.stdout.strip() == "no dead letters"

        graph.set_available(True)
        replayed = await run_cli("dlq", "replay", str(letter["id"]), *where)
        assert replayed.returncode == 0, replayed.stderr
        answer = json.loads(replayed.stdout)
        assert answer["retry_of"] == b and answer["created"] is True
        c = answer["request_id"]
        await run.wait_state(c, "processing")
        again = await run_cli("dlq", "replay", "--all", *where)
        assert again.returncode == 0, again.stderr
        assert [r["request_id"] for r in json.loads(again.stdout)["replayed"]] == [c]
        assert json.loads(again.stdout)["replayed"][0]["created"] is False
        missing = await run_cli("dlq", "replay", "999999", *where)
        assert missing.returncode == 2 and "no dead letter 999999" in missing.stderr

        await asyncio.sleep(1.1)
        pruned = await run_cli("dlq", "prune", "--older-than", "1s", *where)
        assert pruned.returncode == 0, pruned.stderr
        assert json.loads(pruned.stdout)["pruned"] == [letter["id"]]
        gone = await run_cli("dlq", "list", "--json", *where)
        assert json.loads(gone.stdout)["dead_letters"] == []
        records = await JetStreamTrail(js_env.js, js_env.topology).operator_records()
        assert [(r.queue, r.details["verb"]) for r in records] == [("**", "dlq prune")]
        assert f"deleted 1 dead letter(s) ({letter['id']})" in records[0].details["what"]

    history = (await explain_document(options(js_env), js_env.topology, b, "", ""))["history"]
    verbs = [h["detail"]["verb"] for h in history if h["kind"] == "operator"]
    assert verbs == ["dlq replay"]  # replayed twice, recorded once


async def _counted(run, event: str, request_id: str) -> bool:  # type: ignore[no-untyped-def]
    return bool(run.events.count(event, request_id))


async def _idle(run) -> bool:  # type: ignore[no-untyped-def]
    return (await run.queue(Q)).slot_holders == ()


async def _pauses_in_force(run) -> bool:  # type: ignore[no-untyped-def]
    return bool(run.service.config.pauses)


async def test_pause_resume_and_dlq_prune_are_one_trail_record_each(js_env) -> None:
    where = broker(js_env)
    async with running_service(js_env.server, js_env.topology, CONFIG) as run:
        a = await run.ingest(Q, "A")
        await run.wait_state(a, "processing")
        b = await run.ingest(Q, "B")
        for _ in range(2):  # a repeated pause is the same pause, and the same record
            done = await run_cli("pause", "monorepo/*", "--reason", "incident 7", *where)
            assert done.returncode == 0, done.stderr
        # The service reads pauses once a second: C comes once the pause is in force, so
        # nothing is superseded before the resume (B stays open through both records).
        await wait_for(lambda: _pauses_in_force(run), "the pause taken up by the service")
        c = await run.ingest(Q, "C")  # ingested while paused: its history shows the pause
        for _ in range(2):
            done = await run_cli("resume", "monorepo/*", *where)
            assert done.returncode == 0, done.stderr
        nothing = await run_cli("dlq", "prune", "--older-than", "1s", *where)
        assert json.loads(nothing.stdout)["pruned"] == []
        records = await JetStreamTrail(js_env.js, js_env.topology).operator_records()
        assert [(r.queue, r.details["verb"], r.details["what"]) for r in records] == [
            ("monorepo/*", "pause", "paused: incident 7"),
            ("monorepo/*", "resume", "resumed"),
        ]
        # B was open meanwhile: its history shows them, in time order.
        history = (await explain_document(options(js_env), js_env.topology, b, "", ""))
        kinds = [(h["kind"], h["detail"].get("verb", "")) for h in history["history"]]
        assert ("operator", "pause") in kinds and ("operator", "resume") in kinds
        assert kinds.index(("operator", "pause")) < kinds.index(("operator", "resume"))
        shown = await run_cli("explain", b, *where)
        assert "ran pause: paused: incident 7" in shown.stdout
        later = await explain_document(options(js_env), js_env.topology, c, "", "")
        verbs = [h["detail"]["verb"] for h in later["history"] if h["kind"] == "operator"]
        assert verbs == ["pause", "resume"]
        d = await run.ingest(Q, "D")  # after the resume: no pause in its history
        after = await explain_document(options(js_env), js_env.topology, d, "", "")
        assert [h["kind"] for h in after["history"] if h["kind"] == "operator"] == []


async def test_retry_behind_a_newer_head_on_a_queue_that_keeps_every_head(js_env) -> None:  # type: ignore[no-untyped-def]
    """A release queue (every_head) validates each head: an operator's retry of a failed
    head is accepted behind a newer one, which stays waiting its turn; on a coalescing
    queue of the same policy the same retry is refused."""
    where = broker(js_env)
    config = {
        "defaults": {"max_concurrent": 1, "gate_wait_delay_ms": 100},
        "queues": {"rel/1": {"every_head": True}},
    }
    async with running_service(js_env.server, js_env.topology, config) as run:
        for queue in ("rel/1", Q):
            a = await run.ingest(queue, "A")
            await run.wait_state(a, "processing")
            await run.pipeline.stages.record.complete(a, "failed")
            b = await run.ingest(queue, "B")
            await run.wait_state(b, "processing")
            answer = await run_cli("retry", a, *where)
            if queue == Q:
                assert answer.returncode == 2
                assert f"a newer head {b} was ingested since {a}" in answer.stderr
                continue
            assert answer.returncode == 0, answer.stderr
            retried = json.loads(answer.stdout)["request_id"]
            assert await run.state(retried) == "accepted"  # waits behind B, in order
            assert await run.state(b) == "processing"

"""Build outcomes travel as messages on the outcome stream, recorded by the service.

On a real nats-server: ``complete`` publishes and loads no policy file; an outcome
published while no service runs is recorded when one starts; a second, different outcome
and a forged one are dead-lettered and applied to nothing; every recorded end is
announced on the hook topic under an id derived from the terminal write; ``ingest`` and
``complete`` work from a directory whose machine files are mid-edit.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats_server import connect, delete_topology, unique_tag
from test_service_support import WAIT_S, machines, running_service, stream_messages, wait_for

from stovepipe_fsm.adapters.jetstream import Topology, ensure_topology, open_kv_stores
from stovepipe_fsm.adapters.jetstream.outcomes import (
    MAX_OUTCOME_BYTES,
    OutcomeMessage,
    decode_outcome,
    encode_outcome,
    outcome_msg_id,
    publish_outcome,
)
from stovepipe_fsm.adapters.jetstream.publisher import MSG_ID_HEADER
from stovepipe_fsm.adapters.jetstream.refused_outcomes import (
    RECENT_KEPT,
    Refusal,
    RefusalTally,
    read_tallies,
)
from stovepipe_fsm.apps.service.connect import NatsOptions
from stovepipe_fsm.apps.service.dlq import list_letters
from stovepipe_fsm.apps.service.http import render_metrics
from stovepipe_fsm.apps.service.operators import (
    NotRecorded,
    complete,
    explain_document,
    operator_ingest,
    render_status,
    status_document,
)
from stovepipe_fsm.domain.entities import evolve
from stovepipe_fsm.domain.errors import NonRetryable
from stovepipe_fsm.pipeline.policy_in_force import PolicyUnavailable
from stovepipe_fsm.process.catalog import load_process_machines

QUEUE = "team/app"
CONFIG = {"defaults": {"gate_wait_delay_ms": 100}}
BROKEN_MACHINES = "machines"  # resolved in a directory where it is a half-written file


def options(js_env) -> NatsOptions:  # type: ignore[no-untyped-def]
    return NatsOptions(url=js_env.server.url, max_reconnect_attempts=3)


@pytest.fixture
def mid_edit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory whose machines/ holds a half-written edit (the service under
    test was given its machines before)."""
    machines()
    edited = tmp_path / "machines"
    edited.mkdir()
    (edited / "request.yaml").write_text("name: request\nstates: [\n", encoding="utf-8")
    (edited / "queue_gate.yaml").write_text("name: queue_gate\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


async def refused(js_env) -> list[tuple[str, Refusal]]:  # type: ignore[no-untyped-def]
    """Every refused outcome the queues' records keep, as (queue, refusal)."""
    tallies = await read_tallies(js_env.js, js_env.topology)
    return [(t.queue, r) for t in tallies for r in t.recent]


async def hooks(js_env) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    topology = js_env.topology
    return await stream_messages(js_env.js, topology.hooks_stream, f"{topology.prefix}.hooks.")


async def test_an_outcome_published_while_no_service_runs_is_recorded_when_one_starts(
    js_env, mid_edit: Path
) -> None:
    async with running_service(js_env.server, js_env.topology, CONFIG) as running:
        request_id = await running.ingest(QUEUE, "A")
        await running.wait_state(request_id, "processing")
    # No service now; the working directory's machines do not even parse.
    answer = await complete(options(js_env), js_env.topology, QUEUE, "A", "succeeded", 0)
    assert answer == {
        "request_id": request_id,
        "outcome": "succeeded",
        "published": True,
        "duplicate": False,
    }
    again = await complete(options(js_env), js_env.topology, QUEUE, "A", "succeeded", 0)
    assert again["duplicate"] is True  # the stream stored it once
    async with running_service(js_env.server, js_env.topology, CONFIG) as running:
        await running.wait_state(request_id, "succeeded")

        async def recorded_whole() -> bool:
            # The request row is written first, then the queue row.
            queue = await running.queue(QUEUE)
            return (queue.slot_holders, queue.last_green_uri) == ((), "A")

        await wait_for(recorded_whole, "the slot freed and last green A")

        async def acknowledged() -> bool:
            return running.events.count("recorded", request_id) >= 1

        await wait_for(acknowledged, "the outcome acknowledged")
        assert running.events.count("recorded", request_id) == 1


async def test_complete_waits_for_the_record_and_refuses_an_undeclared_outcome(
    js_env, mid_edit: Path
) -> None:
    async with running_service(js_env.server, js_env.topology, CONFIG) as running:
        async with operator_ingest(options(js_env), js_env.topology, BROKEN_MACHINES) as ingest:
            result = await ingest.ingest(QUEUE, "A")  # the initial state of the policy in force
        await running.wait_state(result.request_id, "processing")
        with pytest.raises(ValueError, match=r"'passed' is not one of cancelled, failed, succ"):
            await complete(options(js_env), js_env.topology, QUEUE, "A", "passed", 0)
        answer = await complete(options(js_env), js_env.topology, QUEUE, "A", "failed", WAIT_S)
        assert answer["request"]["state"] == "failed"
        queue = await running.queue(QUEUE)
        assert (queue.slot_holders, queue.last_green_uri) == ((), "")


async def test_complete_waits_until_the_record_has_freed_the_slot(js_env) -> None:
    """A record writes the request row, then the queue row: ``--wait`` answers only once
    both are written, so a caller that reads the queue next sees the slot free."""
    async with running_service(js_env.server, js_env.topology, CONFIG) as running:
        request_id = await running.ingest(QUEUE, "A")
        await running.wait_state(request_id, "processing")
    # No service now. The request row says failed, the queue row still lists the holder:
    # what a record cut short between its two writes leaves behind.
    stores = await open_kv_stores(js_env.js, js_env.topology)
    request = await stores.requests.get(request_id)
    await stores.requests.update(
        evolve(request, state="failed"), request.version, request.version + 1
    )
    assert request_id in (await stores.queues.get(QUEUE)).slot_holders
    with pytest.raises(NotRecorded, match=r"was not recorded within 0\.6s \(request is failed\)"):
        await complete(options(js_env), js_env.topology, QUEUE, "A", "failed", 0.6)
    # A service finishes the record from the stored outcome message.
    async with running_service(js_env.server, js_env.topology, CONFIG):
        answer = await complete(options(js_env), js_env.topology, QUEUE, "A", "failed", WAIT_S)
        assert answer["duplicate"] is True
        assert answer["request"]["state"] == "failed"
        assert request_id not in (await stores.queues.get(QUEUE)).slot_holders


async def test_a_conflicting_second_outcome_is_dead_lettered_and_never_applied(js_env) -> None:
    async with running_service(js_env.server, js_env.topology, CONFIG) as running:
        request_id = await running.ingest(QUEUE, "A")
        await running.wait_state(request_id, "processing")
        await complete(options(js_env), js_env.topology, QUEUE, "A", "succeeded", WAIT_S)
        with pytest.raises(NonRetryable, match="ended succeeded; the outcome failed was refused"):
            await complete(options(js_env), js_env.topology, QUEUE, "A", "failed", WAIT_S)
        letters = await wait_for(lambda: refused(js_env), "a refused outcome")
        assert [(q, r.request_id, r.reason_kind) for q, r in letters] == [
            (QUEUE, request_id, "ended_otherwise")
        ]
        assert "already succeeded; cannot record failed" in letters[0][1].reason
        assert await running.state(request_id) == "succeeded"
        assert (await running.queue(QUEUE)).last_green_uri == "A"
        # A record dead letter is not a process one: nothing is failed closed for it.
        assert running.events.count("reconciled") == 0


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"not json", "not valid JSON"),
        (b"{" + b" " * MAX_OUTCOME_BYTES + b"}", f"at most {MAX_OUTCOME_BYTES}"),
        (
            encode_outcome(OutcomeMessage(QUEUE, "request/other/queue/1", "failed")),
            "of queue 'other/queue' was published for queue 'team/app'",
        ),
    ],
    ids=["garbage", "oversized", "other-queue-request"],
)
async def test_a_forged_or_damaged_outcome_is_dead_lettered(
    js_env, payload: bytes, reason: str
) -> None:
    async with running_service(js_env.server, js_env.topology, CONFIG) as running:
        request_id = await running.ingest(QUEUE, "A")
        await running.wait_state(request_id, "processing")
        await js_env.js.publish(
            js_env.topology.outcome_subject(QUEUE),
            payload,
            stream=js_env.topology.outcome_stream,
        )
        letters = await wait_for(lambda: refused(js_env), "a refused outcome")
        assert reason in letters[0][1].reason
        assert await running.state(request_id) == "processing"
        # The queue goes on: a real outcome after the forged one is recorded.
        cancelled = OutcomeMessage(QUEUE, request_id, "cancelled")
        await publish_outcome(js_env.js, js_env.topology, cancelled)
        await running.wait_state(request_id, "cancelled")


async def test_every_recorded_end_is_announced_once_and_a_superseded_head_never(js_env) -> None:
    async with running_service(js_env.server, js_env.topology, CONFIG) as running:
        a = await running.ingest(QUEUE, "A")
        await running.wait_state(a, "processing")
        b = await running.ingest(QUEUE, "B")
        c = await running.ingest(QUEUE, "C")
        await complete(options(js_env), js_env.topology, QUEUE, "A", "succeeded", WAIT_S)
        await running.wait_state(b, "superseded")
        await running.wait_state(c, "processing")
        await complete(options(js_env), js_env.topology, QUEUE, "C", "failed", WAIT_S)
        # Recording C's outcome again (a redelivery) re-announces under the same id.
        await running.service.crew.pipeline.record_outcome(c, "failed")

        async def announced() -> list[dict] | None:  # type: ignore[type-arg]
            events = await hooks(js_env)
            return events if len(events) == 4 else None

        events = await wait_for(announced, "two starts and two ends")
    assert [(e["type"], e["payload"]["request_id"]) for e in events] == [
        ("validation.repository.started", a),
        ("validation.repository.succeeded", a),
        ("validation.repository.started", c),
        ("validation.repository.failed", c),
    ]
    assert all(set(e["payload"]) == {"queue", "request_id"} for e in events)
    assert len({e["id"] for e in events}) == 4


async def test_outcome_message_id_is_per_request_and_outcome(js_env) -> None:
    nc = await connect(js_env.server)
    try:
        js = nc.jetstream()
        message = OutcomeMessage(QUEUE, "request/team/app/1", "succeeded")
        assert not await publish_outcome(js, js_env.topology, message)
        assert await publish_outcome(js, js_env.topology, message)
        other = OutcomeMessage(QUEUE, "request/team/app/1", "failed")
        assert not await publish_outcome(js, js_env.topology, other)
        stored = await js.get_msg(js_env.topology.outcome_stream, 1)
        assert stored.headers is not None
        assert stored.headers[MSG_ID_HEADER] == outcome_msg_id(message.request_id, "succeeded")
        assert decode_outcome(stored.data, QUEUE) == message
    finally:
        await nc.close()


async def test_without_a_recorded_policy_ingest_names_why_the_fallback_failed(
    js_env, mid_edit: Path
) -> None:
    with pytest.raises(PolicyUnavailable, match="no service has recorded the policy in force"):
        async with operator_ingest(options(js_env), js_env.topology, BROKEN_MACHINES):
            pass


async def test_complete_wait_gives_up_with_a_clear_error_when_no_service_records(
    js_env,
) -> None:
    async with running_service(js_env.server, js_env.topology, CONFIG) as running:
        request_id = await running.ingest(QUEUE, "A")
        await running.wait_state(request_id, "processing")
    with pytest.raises(NotRecorded, match=r"is stored but was not recorded within 0\.5s"):
        await complete(options(js_env), js_env.topology, QUEUE, "A", "succeeded", 0.5)


async def test_an_outcome_reported_before_its_head_is_admitted_is_applied_on_admission(
    js_env,
) -> None:
    """B's build is reported while B still waits for A's slot: the outcome is kept (retried
    shortly) rather than refused, and B ends with it as soon as it is admitted."""
    async with running_service(js_env.server, js_env.topology, CONFIG) as running:
        first = await running.ingest(QUEUE, "A")
        await running.wait_state(first, "processing")
        second = await running.ingest(QUEUE, "B")
        assert await running.state(second) == "accepted"
        early = await complete(options(js_env), js_env.topology, QUEUE, "B", "succeeded", 0)
        assert (early["request_id"], early["duplicate"]) == (second, False)
        await complete(options(js_env), js_env.topology, QUEUE, "A", "succeeded", WAIT_S)
        await running.wait_state(second, "succeeded")
        assert await refused(js_env) == []
        assert (await running.queue(QUEUE)).slot_holders == ()


async def test_an_early_outcome_waits_and_is_moot_once_its_head_is_superseded(js_env) -> None:
    """``--wait`` on a head not admitted yet says the outcome is kept, not that no service
    runs; when the head is superseded instead, the outcome is refused as moot."""
    async with running_service(js_env.server, js_env.topology, CONFIG) as running:
        first = await running.ingest(QUEUE, "A")
        await running.wait_state(first, "processing")
        second = await running.ingest(QUEUE, "B")
        with pytest.raises(NotRecorded, match="the head is not admitted yet"):
            await complete(options(js_env), js_env.topology, QUEUE, "B", "failed", 0.6)
        third = await running.ingest(QUEUE, "C")
        await complete(options(js_env), js_env.topology, QUEUE, "A", "succeeded", WAIT_S)
        await running.wait_state(second, "superseded")
        letters = await wait_for(lambda: refused(js_env), "a refused outcome")
        assert [r.request_id for _, r in letters] == [second]
        assert "already superseded; cannot record failed" in letters[0][1].reason
        await running.wait_state(third, "processing")


async def test_complete_by_uri_names_the_request_building_that_commit(js_env) -> None:
    """Trunk returns to P0 while P0's first build still runs: ``--uri P0`` names the
    request that is building, not the newer one waiting behind it."""
    async with running_service(js_env.server, js_env.topology, CONFIG) as running:
        building = await running.ingest(QUEUE, "P0")
        await running.wait_state(building, "processing")
        await running.ingest(QUEUE, "P1")
        returned = await running.pipeline.stages.ingest.ingest(QUEUE, "P0", at_head=True)
        assert returned.returned and returned.request_id != building
        answer = await complete(options(js_env), js_env.topology, QUEUE, "P0", "failed", WAIT_S)
        assert answer["request_id"] == building
        assert answer["request"]["state"] == "failed"
        await running.wait_state(returned.request_id, "processing")


async def test_a_refused_outcome_sent_again_once_its_cause_is_fixed_is_recorded(js_env) -> None:
    """A build reports request 2 before any request 2 exists: refused (unknown request).
    Once request 2 exists and builds, the same report sent again inside the broker's
    duplicate window is decided afresh and recorded, not dropped as a duplicate; a plain
    repeat of a stored report still is one."""
    early = OutcomeMessage(QUEUE, f"request/{QUEUE}/2", "succeeded")
    async with running_service(js_env.server, js_env.topology, CONFIG) as running:
        first = await running.ingest(QUEUE, "A")
        await running.wait_state(first, "processing")
        assert not await publish_outcome(js_env.js, js_env.topology, early)
        letters = await wait_for(lambda: refused(js_env), "a refused outcome")
        assert [(r.request_id, r.reason_kind) for _, r in letters] == [
            (early.request_id, "unknown_request")
        ]
        await complete(options(js_env), js_env.topology, QUEUE, "A", "succeeded", WAIT_S)
        second = await running.ingest(QUEUE, "B")
        assert second == early.request_id
        await running.wait_state(second, "processing")
        assert not await publish_outcome(js_env.js, js_env.topology, early)
        await running.wait_state(second, "succeeded")
        assert await publish_outcome(js_env.js, js_env.topology, early)
        answer = await complete(options(js_env), js_env.topology, QUEUE, "B", "succeeded", 0)
        assert answer["duplicate"] is True
        assert len(await refused(js_env)) == 1


async def test_an_outcome_repeated_after_the_duplicate_window_stores_no_second_end(
    js_env,
) -> None:
    """The broker forgets an outcome's id after its duplicate window; a repeat after it is
    stored and recorded again, and still announces no second end and notes none."""
    topology = Topology.isolated(unique_tag(), duplicate_window_s=1.0)
    await ensure_topology(js_env.js, topology)
    try:
        async with running_service(js_env.server, topology, CONFIG) as running:
            request_id = await running.ingest(QUEUE, "A")
            await running.wait_state(request_id, "processing")
            message = OutcomeMessage(QUEUE, request_id, "succeeded")
            await publish_outcome(js_env.js, topology, message)
            await running.wait_state(request_id, "succeeded")
            await asyncio.sleep(1.5)  # past the duplicate window
            assert not await publish_outcome(js_env.js, topology, message)

            async def recorded_twice() -> bool:
                return running.events.count("recorded", request_id) == 2

            await wait_for(recorded_twice, "the repeat recorded")
        ends = await stream_messages(
            js_env.js, topology.hooks_stream, topology.hook_subject("validation.repository")
        )
        assert [e["type"] for e in ends] == [
            "validation.repository.started",
            "validation.repository.succeeded",
        ]
        ended = topology.trail_subject(request_id, "ended")
        info = await js_env.js.stream_info(topology.trail_stream, subjects_filter=ended)
        assert info.state.subjects == {ended: 1}
    finally:
        await delete_topology(js_env.js, topology)


async def test_refused_outcomes_are_one_bounded_record_per_queue_with_a_retention(
    js_env,
) -> None:
    """Sixty junk outcomes (requests that do not exist) make one record for their queue:
    the count, the count per kind of reason and the latest few; no dead letter, nothing
    left on the outcome stream. ``status`` and ``dlq list`` show it; once nothing more is
    refused for the retention, the record goes."""
    topology = Topology.isolated(unique_tag(), refused_outcomes_max_age_s=3.0)
    await ensure_topology(js_env.js, topology)
    junk = [OutcomeMessage(QUEUE, f"request/{QUEUE}/{1000 + n}", "succeeded") for n in range(60)]
    try:
        async with running_service(js_env.server, topology, CONFIG) as running:
            request_id = await running.ingest(QUEUE, "A")
            await running.wait_state(request_id, "processing")
            for message in junk:
                await publish_outcome(js_env.js, topology, message)

            async def all_counted() -> RefusalTally | None:
                tallies = await read_tallies(js_env.js, topology)
                return tallies[0] if tallies and tallies[0].count == len(junk) else None

            tally = await wait_for(all_counted, "every junk outcome counted")
            assert (tally.queue, tally.reasons) == (QUEUE, (("unknown_request", 60),))
            assert [r.request_id for r in tally.recent] == [
                m.request_id for m in junk[-RECENT_KEPT:]
            ]
            dlq = f"{topology.prefix}.dlq."
            assert await stream_messages(js_env.js, topology.dead_letter_stream, dlq) == []
            outcomes = await js_env.js.stream_info(topology.outcome_stream)
            assert outcomes.state.messages == 0
            doc = await status_document(js_env.js, topology)
            assert doc["refused_outcomes"] == {
                QUEUE: {"count": 60, "last_at_ms": tally.last_at_ms}
            }
            assert "    refused outcomes: 60, last " in render_status(doc)
            listing = await list_letters(options(js_env), topology, "team/*")
            assert [t["count"] for t in listing.as_json()["refused_outcomes"]] == [60]
            assert f"refused outcomes  {QUEUE}  60 since " in listing.render()
            # Counted as refused outcomes, not as dead letters (no dead-letter alert).
            metrics = await render_metrics(running.service)
            assert f'stovepipe_outcomes_refused_total{{queue="{QUEUE}"}} 60' in metrics
            assert "stovepipe_dead_letters_by_reason_total{" not in metrics
            # The queue goes on.
            await complete(options(js_env), topology, QUEUE, "A", "succeeded", WAIT_S)

        async def aged_out() -> bool:
            return await read_tallies(js_env.js, topology) == []

        await wait_for(aged_out, "the record to age out")
    finally:
        await delete_topology(js_env.js, topology)


async def test_a_preempted_build_is_announced_and_its_late_outcome_is_moot(js_env) -> None:
    """A policy with the preempt role, served live: the newer head ends the running
    build, the end is on the hook stream, and the build's late outcome is acked as moot,
    with no dead letter and nothing applied."""
    policy = load_process_machines("examples/policies/cancel_in_progress/machines")
    async with running_service(js_env.server, js_env.topology, CONFIG, policy=policy) as running:
        first = await running.ingest(QUEUE, "A")
        await running.wait_state(first, "processing")
        second = await running.ingest(QUEUE, "B")
        await running.wait_state(second, "processing")
        await running.wait_state(first, "preempted")
        ended = await running.request(first)
        assert ended.superseded_by == second
        answer = await complete(options(js_env), js_env.topology, QUEUE, "A", "succeeded", WAIT_S)
        assert answer["moot"] == f"the build was preempted by {second}"
        assert answer["request"]["state"] == "preempted"
        found = await wait_for(
            lambda: _types_of(js_env, first), "the preempted end on the hook stream"
        )
        assert "validation.repository.preempted" in found
        story = await wait_for(lambda: _moot_noted(js_env, first), "the moot outcome noted")
        assert f"preempted by {second}: running build ended, slot freed" in story
        assert await refused(js_env) == []
        queue = await running.queue(QUEUE)
        assert queue.last_green_uri == "" and queue.slot_holders == (second,)


async def _moot_noted(js_env, request_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The sentences of the request's trail once it notes a moot outcome (else [])."""
    doc = await explain_document(options(js_env), js_env.topology, request_id, "", "")
    said = [r["sentence"] for r in doc["history"]]
    return said if any(": moot, nothing applied" in s for s in said) else []


async def _types_of(js_env, request_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [h["type"] for h in await hooks(js_env) if h["payload"]["request_id"] == request_id]

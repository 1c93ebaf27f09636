"""A request's story on a real broker reads the verbs about its own queue only.

Operator verbs about queues (pause, resume, dlq prune) are kept by pattern; the story of
a request lists them and reads the records of the patterns that match its queue. What it
costs must not grow with the verbs about other queues.
"""

from __future__ import annotations

import json

from nats_server import JsEnv

from stovepipe_fsm.adapters.jetstream.decision_trail import JetStreamTrail
from stovepipe_fsm.apps.service.operators import request_history
from stovepipe_fsm.domain.ids import format_request_id
from stovepipe_fsm.domain.trail_record import CULPRIT, INGESTED, TrailRecord
from stovepipe_fsm.pipeline.queue_verbs import dlq_prune_record, pause_record, resume_record

Q = "monorepo/main"
REQUEST = format_request_id(Q, 1)


async def story_costs(js_env: JsEnv) -> tuple[int, int, list[str]]:
    """Messages sent and received while telling REQUEST's story, and its verbs."""
    stats = js_env.nc.stats
    sent, received = stats["out_msgs"], stats["in_msgs"]
    story = await request_history(js_env.js, js_env.topology, REQUEST)
    costs = stats["out_msgs"] - sent, stats["in_msgs"] - received
    verbs = [
        f"{h['queue']} {h['detail']['verb']}" for h in story["history"] if h["kind"] == "operator"
    ]
    return *costs, verbs


async def test_a_story_reads_the_verbs_about_its_queue_and_no_other(js_env: JsEnv) -> None:
    trail = JetStreamTrail(js_env.js, js_env.topology)
    await trail.append(TrailRecord(INGESTED, Q, REQUEST, 1_000, tag="1"))
    await trail.append(pause_record("monorepo/*", 2_000, "oncall", "incident"))
    await trail.append(resume_record("monorepo/*", 2_000, "oncall", 3_000))
    await trail.append(dlq_prune_record("", [7], 60.0, "oncall", 4_000))  # every queue
    await trail.append(pause_record("other/q0", 2_500, "oncall", ""))
    few = await story_costs(js_env)
    for n in range(1, 200):
        await trail.append(pause_record(f"other/q{n}", 2_500 + n, "oncall", ""))
    many = await story_costs(js_env)

    expected = ["monorepo/* pause", "monorepo/* resume", "** dlq prune"]
    assert few[2] == many[2] == expected
    assert many[:2] == few[:2]
    # Every verb is still there to read when no queue is named.
    assert len(await trail.operator_records()) == 203
    assert [r.queue for r in await trail.operator_records(about="other/q7")] == ["other/q7", "**"]


async def test_a_verb_kept_without_its_pattern_in_the_subject_is_still_told(
    js_env: JsEnv,
) -> None:
    trail = JetStreamTrail(js_env.js, js_env.topology)
    await trail.append(TrailRecord(INGESTED, Q, REQUEST, 1_000, tag="1"))
    old = pause_record("monorepo/*", 2_000, "oncall", "kept before patterns")
    subject = f"{js_env.topology.operator_trail_prefix()}{'0' * 24}"
    await js_env.js.publish(subject, json.dumps(old.as_json()).encode())
    await trail.append(pause_record("other/q", 2_500, "oncall", ""))
    assert (await story_costs(js_env))[2] == ["monorepo/* pause"]


async def test_each_step_of_a_culprit_search_is_kept_on_the_red_heads_trail(
    js_env: JsEnv,
) -> None:
    """A search notes where it stands on every write of its row (tag: the row's version);
    each note is kept, and a repeat of one is kept once."""
    trail = JetStreamTrail(js_env.js, js_env.topology)
    for version, state in ((1, "searching"), (2, "searching"), (3, "named"), (3, "named")):
        await trail.append(
            TrailRecord(CULPRIT, Q, REQUEST, 1_000 * version, (("state", state),), tag=str(version))
        )
    history = await trail.history(REQUEST)
    assert [(r.tag, r.details["state"]) for r in history] == [
        ("1", "searching"),
        ("2", "searching"),
        ("3", "named"),
    ]

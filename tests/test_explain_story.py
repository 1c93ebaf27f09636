"""``explain`` tells a head's story in commit terms: why a build is full, who a line is
about (by commit and counter), each failed attempt with its cause and next try, the
parameters once (and again where they changed), and where a waiting head stands."""

from __future__ import annotations

from pathlib import Path

from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.domain.parameter_text import parameters_text, short_commit, value_text
from stovepipe_fsm.domain.trail_record import (
    ADMITTED,
    ATTEMPT_FAILED,
    CULPRIT,
    DEAD_LETTERED,
    HELD,
    INGESTED,
    PROBE_STARTED,
    RECLAIMED,
    SUPERSEDED,
    TrailRecord,
    detail,
)
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.replay import simulate
from stovepipe_fsm.simulation.timeline import load_timeline
from stovepipe_fsm.views.explain import (
    Position,
    Story,
    history_json,
    named_requests,
    ordinal,
    render_history,
    sentence,
    story_from_json,
)

ROOT = Path(__file__).resolve().parent.parent
Q = "mono/main"
SHA = "4f2a9c1e0b7d3a5c6e8f90a1b2c3d4e5f6a7b8c9"
SHA2 = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d"


def record(kind: str, n: int = 1, at_ms: int = 1_000, **why: object) -> TrailRecord:
    return TrailRecord(kind, Q, f"request/{Q}/{n}", at_ms, detail=detail(**why))


def test_a_full_build_says_why_it_is_full_for_every_cause() -> None:
    causes = {
        "no last green": "no last green",
        "rewrite": f"last green {SHA} is not an ancestor (rewrite)",
        "unknown": f"unknown commit: ancestry of last green {SHA} unknown",
        "path rule": "lib/BUILD.bazel changed since last green (full_build_paths **/BUILD.bazel)",
    }
    for cause, why in causes.items():
        said = sentence(record(ADMITTED, strategy="full", why=why))
        assert said.startswith("admitted: full build (why full: "), (cause, said)
        assert why in said, cause
    # An incremental build names its base by its short commit.
    said = sentence(record(ADMITTED, strategy="incremental_since_green", base=SHA, why="x"))
    assert said == f"admitted: incremental_since_green build on {SHA[:10]} (x)"


def test_lines_name_the_requests_they_mention_by_short_commit_and_counter() -> None:
    story = Story({f"request/{Q}/7": SHA, f"request/{Q}/2": "R2"})
    assert sentence(record(INGESTED, uri=SHA)) == f"ingested {SHA[:10]}"
    superseded = sentence(record(SUPERSEDED, by=f"request/{Q}/7"), story)
    assert superseded == f"superseded by {SHA[:10]} (request 7) (never built)"
    held = sentence(record(HELD, reason="gate_closed", holders=f"request/{Q}/2"), story)
    assert held == f"held once: gate_closed (slot holders: request/{Q}/2 (R2))"
    by_plugin = sentence(record(HELD, reason="embargoed", plugin="embargo_rules"), story)
    assert by_plugin == "held once: embargoed, a rule of plugin embargo_rules (slot holders: none)"
    reclaimed = sentence(record(RECLAIMED, by=f"request/{Q}/7"), story)
    assert reclaimed.endswith(f"(found while deciding {SHA[:10]} (request 7))")
    # Without the commits, the ids.
    assert f"by request/{Q}/7 " in sentence(record(SUPERSEDED, by=f"request/{Q}/7"))


def test_parameters_are_told_once_and_again_only_where_they_changed() -> None:
    first = parameters_text([("max_concurrent", 1), ("paused", False), ("skip_paths", ["a/**"])])
    second = parameters_text([("max_concurrent", 2), ("paused", False), ("skip_paths", ["a/**"])])
    assert first == "max_concurrent=1, paused=false, skip_paths=[a/**]"
    def held(at_ms: int, reason: str, parameters: str, tag: str) -> TrailRecord:
        why = detail(reason=reason, parameters=parameters)
        return TrailRecord(HELD, Q, f"request/{Q}/1", at_ms, why, tag=tag)

    records = [
        record(INGESTED, uri="A"),
        held(2_000, "gate_closed", first, "g"),
        held(3_000, "paused", first, "p"),
        held(4_000, "gate_closed", second, "h"),
    ]
    text = render_history(None, records)
    assert text.count("parameters: ") == 2, text
    assert f"  parameters: {first}\n" in text and f"  parameters: {second}\n" in text
    assert all("max_concurrent=" not in line for line in text.splitlines() if "held" in line)
    entries = history_json(None, records)["history"]
    assert [("parameters" in e) for e in entries] == [False, True, False, True]


def test_a_failed_attempt_says_its_cause_its_next_try_and_the_budget() -> None:
    said = sentence(
        record(
            ATTEMPT_FAILED,
            error="NotFound: commit not found",
            attempt=2,
            max_attempts=5,
            next_try_at_ms=1_764_700_000_500,
        )
    )
    assert said == (
        "attempt 2 of 5 failed: NotFound: commit not found; next try at "
        "2025-12-02T18:26:40.500Z, dead letter if attempt 5 fails"
    )


def test_a_waiting_head_says_where_it_stands_and_who_is_at_the_front() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st",
    ]
    position = Position(2, 3, f"request/{Q}/5", SHA, "paused")
    row = {"id": f"request/{Q}/6", "uri": SHA2, "state": "accepted"}
    doc = history_json(row, [record(INGESTED, n=6, uri=SHA2)], Story({}, position))
    assert doc["position"]["sentence"] == (
        f"waiting 2nd behind {SHA[:10]} (request 5) at the front (held: paused); 3 waiting"
    )
    text = render_history(row, [record(INGESTED, n=6, uri=SHA2)], story_from_json(doc))
    assert text.splitlines()[0] == f"request/{Q}/6  {SHA2[:10]}  accepted"
    assert text.splitlines()[-1] == f"  now: {doc['position']['sentence']}"
    front = history_json(row, [], Story({}, Position(1, 1, f"request/{Q}/6", SHA2, "")))
    assert front["position"]["sentence"] == "waiting at the front of its queue; 1 waiting"


def test_a_red_heads_search_says_where_it_stands_and_why_it_ended() -> None:
    def search(**why: object) -> str:
        facts = {"blamelist": 7, "probes_started": 2, "in_flight": 2, **why}
        return sentence(record(CULPRIT, n=9, **facts))

    assert search(state="searching", green_through=0, red_from=7) == (
        "culprit search searching (blamelist 7 commit(s); green through the base, "
        "red from position 7; 2 probe(s) started, 2 in flight)"
    )
    named = search(state="named", culprit=SHA, green_through=3, red_from=4, in_flight=0)
    assert named == (
        f"culprit search named {SHA[:10]} as the culprit (blamelist 7 commit(s); green "
        "through position 3, red from position 4; 2 probe(s) started, 0 in flight)"
    )
    flake = search(state="unresolved", reason="red_not_reproduced", green_through=7, red_from=0)
    assert flake.startswith("culprit search unresolved: red_not_reproduced (")
    assert "green through position 7, red from none;" in flake
    far = sentence(
        record(CULPRIT, state="unresolved", reason="blamelist longer than max_blamelist")
    )
    assert far.startswith("culprit search unresolved: blamelist longer than max_blamelist (")


def test_a_probe_says_which_commit_it_builds_for_which_red_head() -> None:
    red = f"request/{Q}/9"
    records = [
        record(PROBE_STARTED, n=12, commit=SHA, position=3, blamelist=7, for_head=red),
        record(ADMITTED, n=12, probe_of=red),
    ]
    assert named_requests(records) == {red}
    story = Story({red: SHA2})
    assert [sentence(r, story) for r in records] == [
        f"probe of {SHA[:10]} (position 3 of the 7 commits in the blamelist) for red head "
        f"{SHA2[:10]} (request 9)",
        f"admitted: a probe build, in a probe slot, for red head {SHA2[:10]} (request 9)",
    ]
    row = {
        "id": f"request/{Q}/12",
        "uri": SHA,
        "state": "processing",
        "build_strategy": "incremental_since_green",
        "probe_of": red,
    }
    first = render_history(row, records, story).splitlines()[0]
    assert first == (
        f"request/{Q}/12  {SHA[:10]}  processing  incremental_since_green  "
        f"probe of {SHA2[:10]} (request 9)"
    )


def test_values_read_as_yaml_and_only_full_commit_ids_are_cut() -> None:
    assert value_text(True) == "true" and value_text(()) == "[]"
    assert value_text(("WORKSPACE", "**/BUILD.bazel")) == "[WORKSPACE, **/BUILD.bazel]"
    assert short_commit(SHA) == SHA[:10] and short_commit("feature/x") == "feature/x"
    assert short_commit(SHA[:39]) == SHA[:39]


async def test_the_simulated_trail_notes_each_retried_attempt_before_the_dead_letter() -> None:
    world = simulate(
        load_timeline(ROOT / "tests" / "timelines" / "dead_letter_after_max_attempts.yaml"),
        load_process_machines(ROOT / "machines"),
        load_policy_store(str(ROOT / "config" / "queues.yaml")),
    ).world
    assert world.trail is not None
    b = next(r.id for r in world.requests.snapshot() if r.uri == "B")
    history = await world.trail.history(b)
    failed = [r for r in history if r.kind == ATTEMPT_FAILED]
    assert [r.details["attempt"] for r in failed] == ["1", "2"]
    assert all(r.details["max_attempts"] == "3" for r in failed)
    gaps = [int(r.details["next_try_at_ms"]) - r.at_ms for r in failed]
    assert gaps == [1000, 2000]
    assert "source control" in failed[0].details["error"].lower(), failed[0].details
    assert "attempt 1 of 3 failed: " in sentence(failed[0])
    assert [r.kind for r in history].index(DEAD_LETTERED) > [r.kind for r in history].index(
        ATTEMPT_FAILED
    )

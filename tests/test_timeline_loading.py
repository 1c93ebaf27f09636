"""Loading timelines: the fast path gives what the located path gives, JSON lines give what
YAML gives, the hand-written step checks say what the schema says, and a history loads
whatever the order of its commits.

Speed is measured by ``python -m bench.whatif``, never asserted here; these tests pin the
equivalences that make the fast paths safe to take.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from stovepipe_fsm.adapters.memory import MemorySourceControl
from stovepipe_fsm.located.errors import Location, SpecError
from stovepipe_fsm.located.schema import load_schema
from stovepipe_fsm.located.yaml_source import parse_yaml, parse_yaml_fast
from stovepipe_fsm.simulation.timeline import (
    Timeline,
    load_timeline,
    located_timeline,
)
from stovepipe_fsm.simulation.timeline_lines import timeline_lines
from stovepipe_fsm.simulation.timeline_shape import (
    builds_valid,
    changes_valid,
    commits_valid,
    header_valid,
    step_decided,
    step_valid,
)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted(
    [*(ROOT / "tests" / "timelines").glob("*.yaml"), *ROOT.glob("examples/**/timelines/*.yaml")]
)
SCHEMAS = ROOT / "stovepipe_fsm" / "located" / "schemas"


def _step_validator() -> Draft202012Validator:
    schema = load_schema("timeline")
    return Draft202012Validator({**schema["$defs"]["step"], "$defs": schema["$defs"]})


def _raw_steps(path: Path) -> list[Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return list(data.get("steps", []))


# Defects the fixtures do not hold: every kind of step made wrong in each way the schema
# can refuse it, and near misses it accepts.
CORPUS: list[Any] = [
    "run", "deliver", "walk", "", 3, None, [], {}, {"run": None}, {"ingest": "A", "run": 1},
    {"ingest": "A"}, {"ingest": ""}, {"ingest": 5}, {"ingest": None}, {"ingest": ["A"]},
    {"ingest": {"uri": "A"}}, {"ingest": {"uri": "A", "queue": "q/r"}}, {"ingest": {}},
    {"ingest": {"uri": ""}}, {"ingest": {"uri": "A", "queue": ""}}, {"ingest": {"queue": "q"}},
    {"ingest": {"uri": "A", "other": 1}}, {"ingest": {"uri": 1}}, {"redeliver": "A"},
    {"redeliver": {"uri": "A", "queue": 2}}, {"dead_letter": "A"}, {"dead_letter": ""},
    {"resume": {"uri": "A"}}, {"resume": True}, {"cancel": "A"}, {"cancel": ""},
    {"cancel": {"uri": "A", "queue": "q/r"}}, {"cancel": {"uri": "A", "outcome": "x"}},
    {"cancel": 1},
    {"advance_ms": 0}, {"advance_ms": 5}, {"advance_ms": -1}, {"advance_ms": 1.0},
    {"advance_ms": 1.5}, {"advance_ms": True}, {"advance_ms": "5"}, {"advance_ms": None},
    {"complete": {"uri": "A", "outcome": "succeeded"}},
    {"complete": {"uri": "A", "outcome": "succeeded", "queue": "q/r"}},
    {"complete": {"uri": "A", "outcome": "Succeeded"}},
    {"complete": {"uri": "A", "outcome": "ok\n"}},
    {"complete": {"uri": "A", "outcome": "1ok"}},
    {"complete": {"uri": "A", "outcome": ""}}, {"complete": {"uri": "A"}},
    {"complete": {"outcome": "succeeded"}}, {"complete": {"uri": "", "outcome": "x"}},
    {"complete": {"uri": "A", "outcome": "x", "queue": ""}},
    {"complete": {"uri": "A", "outcome": "x", "at": 1}}, {"complete": "A"},
    {"complete": {"uri": "A", "outcome": 1}},
    {"crash": "after_claim_slot"}, {"crash": "after_load_queue"}, {"crash": 1},
    {"stall": "after_load_queue"}, {"stall": "after_ack"}, {"stall": None},
    {"source_control": "down"}, {"source_control": "up"}, {"source_control": "sideways"},
    {"source_control": False},
    {"config": {"max_concurrent": 2}}, {"config": {"queue": "q/r", "paused": True}},
    {"config": {}}, {"config": {"queue": "q/r"}}, {"config": {"queue": ""}},
    {"config": {"queue": 1, "x": 1}}, {"config": {"x": None}}, {"config": {"x": {"a": 1}}},
    {"config": {"x": [1, "a"]}}, {"config": {"x": 1.5}}, {"config": "max_concurrent"},
    {"run_ms": 0}, {"run_ms": 5}, {"run_ms": -1}, {"run_ms": 1.5}, {"run_ms": "5"},
    {"return": "A"}, {"return": ""}, {"return": {"uri": "A", "queue": "q/r"}},
    {"retry": "A"}, {"retry": 1}, {"retry": {"uri": "A", "x": 1}},
    {"failing": "A"}, {"failing": None}, {"failing": {"queue": "q"}},
    {"explode": "A"},
]  # fmt: skip


def _fixture_steps() -> list[Any]:
    return [step for path in FIXTURES for step in _raw_steps(path)]


def test_every_fixture_is_in_the_corpus_of_the_equivalence() -> None:
    assert len(FIXTURES) > 30
    assert len(ACTING_ONLY) > 10
    assert any(not step_decided(s) for s in _fixture_steps()), "expect steps are left over"


@pytest.mark.parametrize("source", ["fixtures", "corpus", "mutants"])
def test_step_checks_answer_as_the_schema_does(source: str) -> None:
    steps = {"fixtures": _fixture_steps(), "corpus": CORPUS, "mutants": _mutants()}[source]
    validator = _step_validator()
    decided = [s for s in steps if step_decided(s)]
    assert decided
    for step in decided:
        assert step_valid(step) == validator.is_valid(step), step


def _mutants() -> list[Any]:
    """Each fixture step with each value replaced by values of every JSON type."""
    out: list[Any] = []
    replacements: list[Any] = ["", "x", 0, -1, 2.5, True, None, [], ["a"], {}, {"uri": "A"}]
    for step in _fixture_steps():
        if not isinstance(step, dict) or not step_decided(step):
            continue
        ((kind, value),) = step.items()
        out += [{kind: r} for r in replacements]
        if isinstance(value, dict):
            for key in value:
                for r in replacements:
                    out.append({kind: {**value, key: r}})
                out.append({kind: {k: v for k, v in value.items() if k != key}})
    return out


@pytest.mark.parametrize(
    "commits",
    [{}, {"a": []}, {"b": ["a"], "a": []}, {"a": [""]}, {"a": "b"}, {"a": [1]}, {"a": None}, []],
)
def test_history_check_answers_as_the_schema_does(commits: Any) -> None:
    schema = load_schema("timeline")
    validator = Draft202012Validator(schema["properties"]["history"])
    assert commits_valid(commits) == validator.is_valid(commits)


@pytest.mark.parametrize(
    "changes",
    [{}, {"a": ["p"]}, {"a": {"p": "100644 x", "q": ""}}, {"a": {"": "x"}}, {"a": {"p": 1}},
     {"a": {"p": None}}, {"a": [""]}, {"a": "p"}, {"a": None}, []],
)  # fmt: skip
def test_changes_check_answers_as_the_schema_does(changes: Any) -> None:
    validator = Draft202012Validator(load_schema("timeline")["properties"]["changes"])
    assert changes_valid(changes) == validator.is_valid(changes)


@pytest.mark.parametrize(
    "builds",
    [[], [{"uri": "A", "duration_ms": 5, "outcome": "succeeded"}],
     [{"uri": "A", "queue": "q/r", "duration_ms": 0, "outcome": "failed"}],
     [{"uri": "A", "duration_ms": -1, "outcome": "failed"}],
     [{"uri": "A", "duration_ms": 1.5, "outcome": "failed"}],
     [{"uri": "A", "duration_ms": 5, "outcome": "Failed"}],
     [{"uri": "", "duration_ms": 5, "outcome": "failed"}],
     [{"uri": "A", "duration_ms": 5}], [{"uri": "A", "duration_ms": 5, "outcome": "x", "y": 1}],
     [{"uri": "A", "queue": "", "duration_ms": 5, "outcome": "x"}], ["A"], {},
     [{"uri": "A", "admitted_ms": 7, "duration_ms": 5, "outcome": "x"}],
     [{"uri": "A", "admitted_ms": -7, "duration_ms": 5, "outcome": "x"}],
     [{"uri": "A", "admitted_ms": "7", "duration_ms": 5, "outcome": "x"}]],
)  # fmt: skip
def test_builds_check_answers_as_the_schema_does(builds: Any) -> None:
    schema = load_schema("timeline")
    validator = Draft202012Validator({**schema["properties"]["builds"], "$defs": schema["$defs"]})
    assert builds_valid(builds) == validator.is_valid(builds)


@pytest.mark.parametrize(
    "header",
    [{}, {"queue": "q/r"}, {"queue": ""}, {"config": {"max_concurrent": 0}}, {"nope": 1}],
)
def test_header_check_is_the_schema_on_the_header(header: dict[str, Any]) -> None:
    full = Draft202012Validator(load_schema("timeline"))
    assert header_valid(header) == full.is_valid({**header, "steps": []})


def _located(path: Path) -> Timeline:
    text = path.read_text(encoding="utf-8")
    return located_timeline(parse_yaml(text, str(path), max_values=len(text) + 100_000))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fast_path_loads_what_the_located_path_loads(path: Path) -> None:
    assert load_timeline(path) == _located(path)


def test_the_fast_path_is_taken_for_a_plain_file_and_left_for_anchors() -> None:
    plain = "queue: q/r\nsteps:\n  - ingest: A\n  - run\n"
    fast = parse_yaml_fast(plain, "t.yaml", "steps")
    assert fast is not None
    assert fast.items == (Location("t.yaml", 3, 5), Location("t.yaml", 4, 5))
    assert fast.top["queue"] == Location("t.yaml", 1, 8)
    assert parse_yaml_fast("a: &x [1]\nb: *x\n", "t.yaml", "steps") is None
    assert parse_yaml_fast("a: 1\na: 2\n", "t.yaml", "steps") is None  # duplicate key


def test_a_duplicate_key_is_still_reported_at_its_place(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("queue: q/r\nqueue: q/s\nsteps: [run]\n", encoding="utf-8")
    with pytest.raises(SpecError) as raised:
        load_timeline(path)
    assert str(raised.value.issues[0]).startswith(f"{path}:2:1: duplicate key 'queue'")


@pytest.mark.slow  # a 2 MiB timeline, written and parsed
def test_a_timeline_larger_than_a_policy_file_loads(tmp_path: Path) -> None:
    """Over the policy bounds (2 MiB, 100,000 values): recorded history is that large."""
    heads = 40_000
    history = "".join(f"  c{i}: [c{i - 1}]\n" if i else "  c0: []\n" for i in range(heads))
    steps = "".join(f"  - ingest: {{uri: c{i}, queue: q/r}}\n" for i in range(heads))
    path = tmp_path / "big.yaml"
    path.write_text(f"history:\n{history}steps:\n{steps}  - run\n", encoding="utf-8")
    assert path.stat().st_size > 2 * 1024 * 1024
    timeline = load_timeline(path)
    assert len(timeline.steps) == heads + 1
    assert timeline.history[f"c{heads - 1}"] == (f"c{heads - 2}",)
    assert timeline.steps[-1].location == Location(str(path), 2 * heads + 3, 5)


# --- JSON lines ---------------------------------------------------------------------------


def _without_locations(timeline: Timeline) -> Timeline:
    nowhere = Location("", 0, 0)
    return dataclasses.replace(
        timeline,
        file="",
        config_location=nowhere,
        steps=tuple(dataclasses.replace(s, location=nowhere) for s in timeline.steps),
    )


def _write_lines(doc: dict[str, Any], path: Path) -> Path:
    path.write_text("\n".join(timeline_lines(doc)) + "\n", encoding="utf-8")
    return path


# Timelines with expect steps are compared on locations of their own (below): their
# checks are located key by key.
ACTING_ONLY = [p for p in FIXTURES if all(step_decided(s) for s in _raw_steps(p))]


@pytest.mark.parametrize("path", ACTING_ONLY, ids=lambda p: p.name)
def test_json_lines_load_what_yaml_loads(path: Path, tmp_path: Path) -> None:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    lines = _write_lines(doc, tmp_path / "t.jsonl")
    assert _without_locations(load_timeline(lines)) == _without_locations(load_timeline(path))


def test_json_lines_are_sniffed_and_located_by_line(tmp_path: Path) -> None:
    doc = {
        "queue": "q/r",
        "history": {"A": [], "B": ["A"]},
        "changes": {"B": ["src/x.py"]},
        "steps": [{"ingest": "A"}, "run", {"advance_ms": 5}, {"ingest": "B"}, "run"],
    }
    path = _write_lines(doc, tmp_path / "exported.timeline")  # no suffix to go by
    timeline = load_timeline(path)
    assert timeline.changes == {"B": ("src/x.py",)}
    assert [s.location.line for s in timeline.steps] == [4, 5, 6, 7, 8]
    assert timeline.steps[3].uri == "B"


def test_json_lines_with_expect_steps_report_failed_checks_at_their_line(tmp_path: Path) -> None:
    lines = [
        '{"timeline": 1}',
        '{"ingest": "A"}',
        '{"expect": {"request": "A", "state": "accepted"}}',
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (_, expect) = load_timeline(path).steps
    assert expect.expect is not None
    assert expect.expect.checks[0].location == Location(str(path), 3, 1)


BAD_LINES = {
    "not_json": (['{"timeline": 1}', '{"ingest": "A"'], 2, 15, "not JSON"),
    "no_header": (['{"ingest": "A"}'], 1, 1, "the first line must be the header"),
    "bulk_in_header": (['{"timeline": 1, "steps": []}'], 1, 1, "does not go in the header"),
    "bad_step": (['{"timeline": 1}', '"run"', '{"advance_ms": -1}'], 3, 1, "minimum"),
    "unknown_step": (['{"timeline": 1}', '{"explode": "A"}'], 2, 1, "unknown step 'explode'"),
    "bad_queue": (['{"timeline": 1, "queue": "a b"}', '"run"'], 1, 1, "whitespace"),
    "twice": (
        ['{"timeline": 1}', '{"commit": "A", "parents": []}', '{"commit": "A", "parents": []}'],
        3,
        1,
        "listed twice (first at line 2)",
    ),
    "unknown_parent": (['{"timeline": 1}', '{"commit": "A", "parents": ["Q"]}'], 2, 1, "'Q'"),
    "duplicate_key": (['{"timeline": 1}', '{"ingest": "A", "ingest": "B"}'], 2, 1, "duplicate"),
}


@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_bad_json_lines_are_reported_at_their_line(name: str, tmp_path: Path) -> None:
    lines, line, column, fragment = BAD_LINES[name]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(SpecError) as raised:
        load_timeline(path)
    first = str(raised.value.issues[0])
    assert first.startswith(f"{path}:{line}:{column}: "), first
    assert fragment in str(raised.value)


def test_written_lines_follow_the_published_line_schema(tmp_path: Path) -> None:
    lines_schema = json.loads((SCHEMAS / "timeline-lines.schema.json").read_text())
    timeline_schema = load_schema("timeline")
    registry = Registry().with_resources(
        (s["$id"], Resource.from_contents(s)) for s in (lines_schema, timeline_schema)
    )
    validator = Draft202012Validator(lines_schema, registry=registry)
    written = 0
    for path in FIXTURES:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for line in timeline_lines(doc):
            assert validator.is_valid(json.loads(line)), (path.name, line)
            written += 1
    assert written > 500
    assert not validator.is_valid({"timeline": 2})
    assert not validator.is_valid({"commit": "A"})


# --- history order ------------------------------------------------------------------------


def _chain(commits: int) -> dict[str, list[str]]:
    """A linear history with a merge every 100 commits, oldest first."""
    history: dict[str, list[str]] = {"c0": []}
    for i in range(1, commits):
        parents = [f"c{i - 1}"] + ([f"c{i - 50}"] if i % 100 == 0 else [])
        history[f"c{i}"] = parents
    return history


async def test_a_history_listed_newest_first_gives_the_same_graph() -> None:
    oldest_first = _chain(8_000)
    newest_first = dict(reversed(list(oldest_first.items())))
    a, b = MemorySourceControl(oldest_first), MemorySourceControl(newest_first)
    assert a.commits() == b.commits()
    assert all(a.parents_of(c) == b.parents_of(c) for c in oldest_first)
    assert await b.is_ancestor("c0", "c7999") is True
    assert await b.is_ancestor("c7999", "c0") is False


def test_a_timeline_history_listed_newest_first_loads(tmp_path: Path) -> None:
    newest_first = dict(reversed(list(_chain(8_000).items())))
    path = _write_lines({"history": newest_first, "steps": ["run"]}, tmp_path / "h.jsonl")
    assert load_timeline(path).history["c7999"] == ("c7998",)
    cyclic = copy.deepcopy(newest_first)
    cyclic["c0"] = ["c5"]
    _write_lines({"history": cyclic, "steps": ["run"]}, path)
    with pytest.raises(SpecError, match="'c0' is on or descends from a parent cycle"):
        load_timeline(path)

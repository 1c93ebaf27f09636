"""Culprits and flakes in a replay (``simulation/builds.py``): a timeline declares which
commits broke the build and how flaky builds are; every build a replay ends, a head's or
a culprit search's probe, ends by that model; bad declarations are refused where they
are written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.domain.hooks import CULPRIT_FOUND
from stovepipe_fsm.located.errors import SpecError
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.replay import simulate
from stovepipe_fsm.simulation.timeline import load_timeline
from stovepipe_fsm.simulation.timeline_lines import timeline_lines

ROOT = Path(__file__).resolve().parent.parent
MACHINES = load_process_machines(ROOT / "machines")
Q = "monorepo/main"
TRUNK = [f"c{i}" for i in range(10)]


def trunk(**more: Any) -> dict[str, Any]:
    """A green base c0 built alone, then c1..c9 pushed at once; every recorded build green."""
    history = {c: ([TRUNK[i - 1]] if i else []) for i, c in enumerate(TRUNK)}
    steps: list[Any] = [{"ingest": "c0"}, {"run_ms": 1000}]
    steps += [{"ingest": c} for c in TRUNK[1:]] + [{"run_ms": 600_000}]
    builds = [{"uri": c, "duration_ms": 10_000, "outcome": "succeeded"} for c in ("c0", "c9")]
    doc = {"queue": Q, "config": {"gate_wait_delay_ms": 1000}, "history": history}
    return {**doc, "builds": builds, **more, "steps": steps}


def write(tmp_path: Path, doc: dict[str, Any], name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run(path: Path, seed: int = 0, **defaults: Any) -> Any:
    config = StaticConfigStore(
        {"defaults": {"gate_wait_delay_ms": 1000, **defaults}}, parameters=MACHINES.parameters
    )
    return simulate(load_timeline(path), MACHINES, config, seed=seed).world


def states(world: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in sorted(world.requests.snapshot(), key=lambda r: int(r.id.rsplit("/", 1)[1])):
        out.setdefault(r.uri, []).append(r.state)
    return out


def test_a_declared_culprit_turns_its_commit_and_every_later_one_red(tmp_path: Path) -> None:
    world = run(write(tmp_path, trunk(culprits=["c5"])))
    assert states(world)["c9"] == ["failed"], "recorded green, but c5 broke it"
    assert world.builds.breaking("c4") == frozenset()
    assert world.builds.breaking("c5") == world.builds.breaking("c9") == frozenset({"c5"})


def test_a_fix_ends_the_breakage_on_its_first_parent_line(tmp_path: Path) -> None:
    world = run(write(tmp_path, trunk(culprits=[{"commit": "c3", "fixed_by": "c7"}])))
    assert states(world)["c9"] == ["succeeded"]
    assert [bool(world.builds.breaking(c)) for c in TRUNK] == [
        False, False, False, True, True, True, True, False, False, False
    ]  # fmt: skip


def test_without_culprits_the_recorded_outcomes_hold(tmp_path: Path) -> None:
    world = run(write(tmp_path, trunk()))
    assert states(world)["c9"] == ["succeeded"]


def test_probe_builds_end_by_the_model_and_the_search_names_the_culprit(tmp_path: Path) -> None:
    world = run(write(tmp_path, trunk(culprits=["c5"])), probe_slots=2)
    [found] = [h.event().payload for h in world.published.hooks() if h.event_type == CULPRIT_FOUND]
    assert (found["culprit"], found["green_parent"]) == ("c5", "c4")
    probes = [r for r in world.requests.snapshot() if r.probe_of]
    assert probes and all(r.state in ("succeeded", "failed") for r in probes)
    assert all((r.state == "failed") == (r.uri >= "c5") for r in probes)
    assert world.builds.inferred == len(probes), "a probe's duration is drawn"
    assert not world.builds.running


def test_flakes_are_drawn_from_the_seed_and_only_turn_greens_red(tmp_path: Path) -> None:
    heads = [f"c{i}" for i in range(40)]
    history = {c: ([heads[i - 1]] if i else []) for i, c in enumerate(heads)}
    steps: list[Any] = []
    for c in heads:
        steps += [{"ingest": c}, {"run_ms": 20_000}]
    builds = [{"uri": c, "duration_ms": 10_000, "outcome": "succeeded"} for c in heads]
    doc = {"queue": Q, "history": history, "builds": builds, "steps": steps}
    path = write(tmp_path, {**doc, "flake_rate": 0.3})
    first, again = run(path, seed=3), run(path, seed=3)
    assert states(first) == states(again)
    reds = sum(s == ["failed"] for s in states(first).values())
    assert reds == first.builds.flaky and 0 < reds < len(heads)
    assert states(run(path, seed=4)) != states(first)
    none = run(write(tmp_path, {**doc, "flake_rate": 0.0}, "none.yaml"), seed=3)
    assert none.builds.flaky == 0 and all(s == ["succeeded"] for s in states(none).values())


def test_probes_never_change_what_the_heads_draw(tmp_path: Path) -> None:
    path = write(tmp_path, trunk(culprits=["c5"], flake_rate=0.2))
    off, on = run(path, seed=5), run(path, seed=5, probe_slots=2)
    heads = {r.id: r.state for r in off.requests.snapshot()}
    assert {r.id: r.state for r in on.requests.snapshot() if not r.probe_of} == heads


BAD = {
    "culprit not in the history": (
        {"culprits": ["c1", "zz"]},
        "culprits[1]: 'zz' is not a commit of the history",
    ),
    "fix not a commit": (
        {"culprits": [{"commit": "c3", "fixed_by": "zz"}]},
        "culprits[0]: fixed_by 'zz' is not a commit of the history",
    ),
    "fix before the culprit": (
        {"culprits": [{"commit": "c3", "fixed_by": "c2"}]},
        "culprits[0]: fixed_by 'c2' does not descend from 'c3' on its first-parent line",
    ),
    "flake rate of one": ({"flake_rate": 1}, "flake_rate"),
    "unknown key": ({"culprits": [{"commit": "c3", "fixed": "c4"}]}, "culprits[0]"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_declarations_are_reported_where_they_are_written(name: str, tmp_path: Path) -> None:
    more, message = BAD[name]
    doc = trunk()
    path = tmp_path / "bad.yaml"
    text = yaml.safe_dump({k: v for k, v in doc.items() if k != "steps"}, sort_keys=False)
    text += yaml.safe_dump(more, sort_keys=False)
    path.write_text(text + yaml.safe_dump({"steps": doc["steps"]}))
    line = text.count("\n") - yaml.safe_dump(more, sort_keys=False).count("\n") + 1
    with pytest.raises(SpecError) as raised:
        load_timeline(path)
    [issue] = raised.value.issues
    assert message in issue.message
    assert issue.location.file == str(path)
    assert line <= issue.location.line <= text.count("\n"), issue


def test_culprits_need_recorded_builds(tmp_path: Path) -> None:
    doc = {k: v for k, v in trunk(culprits=["c5"], flake_rate=0.1).items() if k != "builds"}
    with pytest.raises(SpecError) as raised:
        load_timeline(write(tmp_path, doc))
    found = [(i.location.line, i.message.split(":")[0]) for i in raised.value.issues]
    assert [key for _, key in found] == ["culprits", "flake_rate"]
    assert all(line > 1 for line, _ in found)


def test_json_lines_carry_them_in_the_header(tmp_path: Path) -> None:
    doc = trunk(culprits=[{"commit": "c3", "fixed_by": "c7"}], flake_rate=0.05)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(f"{line}\n" for line in timeline_lines(doc)))
    lines = load_timeline(path)
    yaml_form = load_timeline(write(tmp_path, doc))
    assert lines.flake_rate == yaml_form.flake_rate == 0.05
    assert lines.culprits is not None and yaml_form.culprits is not None
    assert [(c.commit, c.fixed_by) for c in lines.culprits] == [("c3", "c7")]
    assert [(c.commit, c.fixed_by) for c in yaml_form.culprits] == [("c3", "c7")]
    bad = path.read_text().replace('"c7"', '"zz"', 1)
    path.write_text(bad)
    with pytest.raises(SpecError) as raised:
        load_timeline(path)
    assert str(raised.value.issues[0]).startswith(f"{path}:1:1: culprits[0]: fixed_by 'zz'")

"""``check`` explores changed paths: each head after the first changes the paths of one
class derived from the policy's glob parameters, so a path rule is checked, a
counterexample carries the changes that break it, and a policy without globs explores
what it did before. A transition of the flow no exploration took is reported.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from check_mutants.paths import INVARIANT, path_catalog, write_policy

from stovepipe_fsm.apps.check.explorer import Explorer, Result, Setup
from stovepipe_fsm.apps.check.model import Bounds
from stovepipe_fsm.apps.check.observe import Observation
from stovepipe_fsm.apps.check.paths import OTHER, PathClass, example_path, path_classes
from stovepipe_fsm.apps.check.trace import as_timeline, replay, write_counterexample
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.domain.entities import FULL
from stovepipe_fsm.domain.path_globs import path_matches
from stovepipe_fsm.located.errors import Location
from stovepipe_fsm.machine.model import ParameterSpec
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.timeline import load_timeline

ROOT = Path(__file__).resolve().parent.parent
GLOBS = ["WORKSPACE", "**/BUILD.bazel"]
# One slot, two linear heads, no faults: the path branch alone is what is explored.
SMALL = Bounds(
    heads=2,
    rewrite=False,
    max_crashes=0,
    max_duplicates=0,
    max_dead_letters=0,
    max_outages=0,
    pauses=False,
)


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def config_file(directory: Path, globs: list[str]) -> Path:
    path = directory / "queues.yaml"
    flow = "[" + ", ".join(f'"{g}"' for g in globs) + "]"
    path.write_text(f"queues:\n  monorepo/main: {{full_build_paths: {flow}}}\n", encoding="utf-8")
    return path


def setup_of(machines: Path, config: Path) -> Setup:
    """One slot, the policy of ``machines`` (not linted: lint knows the shipped catalogue,
    without the path invariant) and ``config``."""
    return Setup(
        load_process_machines(machines, lint=False),
        load_policy_store(str(config)),
        SMALL,
        1,
        catalog=path_catalog(),
    )


def explore(machines: Path, config: Path) -> tuple[Explorer, Result]:
    explorer = Explorer(setup_of(machines, config))
    return explorer, explorer.run()


# --- the classes ----------------------------------------------------------------------


def _parameter(name: str, schema: tuple[tuple[str, object], ...]) -> ParameterSpec:
    here = Location("test", 1, 1)
    return ParameterSpec(name, schema, (), "", here, here)


GLOB_LIST = (("type", "array"), ("items", (("type", "string"),)))


def test_classes_come_from_every_glob_parameter_the_queue_sets() -> None:
    shipped = dict(load_process_machines(ROOT / "machines").parameters)
    assert path_classes(shipped, {}) == ()
    assert path_classes(shipped, {"full_build_paths": ()}) == ()
    classes = path_classes(shipped, {"full_build_paths": tuple(GLOBS)})
    assert classes == (
        PathClass(OTHER, ("src/main.c",)),
        PathClass("full_build_paths", ("WORKSPACE",)),
    )
    # A parameter the checker does not know by name: any list of strings is globs.
    skip = _parameter("skip_paths", GLOB_LIST)
    numbers = _parameter("ports", (("type", "array"), ("items", (("type", "integer"),))))
    policy = {**shipped, "skip_paths": skip, "ports": numbers}
    values = {"full_build_paths": ("**",), "skip_paths": ("docs/**",), "ports": (1, 2)}
    names = [c.name for c in path_classes(policy, values)]
    # "**" matches every path: there is no ordinary change, and no skip-only one.
    assert names == ["full_build_paths", "skip_paths"]
    values = {"full_build_paths": tuple(GLOBS), "skip_paths": ("docs/**", "**/*.md")}
    (other, full, docs) = path_classes(policy, values)
    assert (other.name, full.name, docs.name) == (OTHER, "full_build_paths", "skip_paths")
    assert not any(path_matches(other.paths[0], g) for g in [*GLOBS, "docs/**", "**/*.md"])
    assert docs.paths == ("docs/x",) and not any(path_matches("docs/x", g) for g in GLOBS)


@pytest.mark.parametrize("glob", ["WORKSPACE", "**/BUILD.bazel", "docs/**", "*.bzl", "a/?/b"])
def test_each_example_path_matches_its_glob(glob: str) -> None:
    path = example_path(glob)
    assert path is not None and path_matches(path, glob)


# --- exploring them -------------------------------------------------------------------


def test_a_build_file_change_is_explored_and_built_full(tmp_path: Path) -> None:
    machines = write_policy(tmp_path / "shipped", GLOBS, mutant=False)
    found, result = explore(machines, config_file(tmp_path, GLOBS))
    assert result.ok
    # One slot: A2 is admitted after A1 ended; with A1 green, a full build of A2 is the
    # path rule's doing.
    full_a2 = [obs for obs in found.observations if _full_after_green(obs)]
    assert full_a2 and all(dict(obs.changes)["A2"] == ("WORKSPACE",) for obs in full_a2)
    # Without globs no head changes anything: A2 after a green A1 is built incrementally.
    plain, result = explore(machines, ROOT / "config" / "queues.yaml")
    assert result.ok
    assert all(obs.changes == () for obs in plain.observations)
    assert not any(_full_after_green(obs) for obs in plain.observations)
    assert len(plain.observations) < len(found.observations)


def _full_after_green(obs: Observation) -> bool:
    by_uri = {r.uri: r for r in obs.requests}
    a1, a2 = by_uri.get("A1"), by_uri.get("A2")
    return (
        a1 is not None and a1.state == "succeeded" and a2 is not None and a2.build_strategy == FULL
    )


def test_a_strategy_that_ignores_paths_is_caught_with_the_changes_in_the_timeline(
    tmp_path: Path,
) -> None:
    machines = write_policy(tmp_path / "mutant", GLOBS, mutant=True)
    config = config_file(tmp_path, GLOBS)
    _, result = explore(machines, config)
    counterexample = result.counterexample
    assert counterexample is not None
    assert counterexample.violation.invariant == INVARIANT
    assert "A2" in counterexample.violation.detail
    assert [a.describe() for a in counterexample.trace] == [
        "ingest A1",
        "deliver",
        "complete A1 succeeded",
        "ingest A2 (changes WORKSPACE)",
        "deliver",
    ]
    setup = setup_of(machines, config)
    timeline = as_timeline(setup, counterexample)
    assert timeline.changes == {"A2": ("WORKSPACE",)}
    replayed = replay(timeline, setup.machines, setup.config, catalog=setup.catalog)
    assert replayed.violation is not None and replayed.violation.invariant == INVARIANT
    # The written file lists the changes, and reads back as the same timeline.
    out = write_counterexample(tmp_path / "cx.yaml", setup, counterexample, "replay")
    assert "changes: {A2: [WORKSPACE]}" in out.read_text(encoding="utf-8")
    assert load_timeline(out).changes == {"A2": ("WORKSPACE",)}
    # Without globs in the config, the heads change nothing and the mutant passes.
    assert explore(machines, ROOT / "config" / "queues.yaml")[1].ok


# --- what no exploration took ---------------------------------------------------------


def never_taken(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    capsys.readouterr()
    small = ["--heads", "2", "--max-concurrent", "2", "--max-dead-letters", "0"]
    small += ["--max-outages", "0", "--no-pauses", "--jobs", "1", "--quiet"]
    assert main(["check", *small, *args]) == 0
    out = capsys.readouterr().out
    return [line for line in out.splitlines() if line.startswith("never taken: ")]


def test_transitions_no_exploration_took_are_reported(capsys: pytest.CaptureFixture[str]) -> None:
    lag = (
        "never taken: queue_gate gate: latest -> held (conditions baseline_lag_exceeded; "
        "unless only_skip_paths_changed, gate_closed) machines/queue_gate.yaml:"
    )
    rewrite = (
        "never taken: queue_gate claim: derived -> held (conditions rewrite_waits_for_drain) "
        "machines/queue_gate.yaml:"
    )
    # Without the rewrite head, no head waits for the others to drain.
    lines = never_taken(capsys, "--no-rewrite")
    assert any(line.startswith(lag) for line in lines), lines
    assert any(line.startswith(rewrite) for line in lines), lines
    # With it, a rewrite does; the lag bound, 0 in the shipped config, never holds.
    lines = never_taken(capsys)
    assert any(line.startswith(lag) for line in lines), lines
    assert not any(line.startswith(rewrite) for line in lines), lines

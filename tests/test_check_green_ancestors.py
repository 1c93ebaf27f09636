"""check proves ``base_is_green_ancestor`` on a history with a rewrite.

The checked history is a trunk ``A1 … AN`` and ``R`` force-pushed onto ``A1``: once
``A2`` is green, ``A1`` is an older recorded green and the only one ``R`` descends from.
The shipped machines hold the invariant there; a witness invariant shows the state is
reached (R builds incremental on A1 while last green is past it); and a gate that builds
on the *oldest* recorded green ancestor instead is caught, with a replayable timeline.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from stovepipe_fsm.apps.check.explorer import Explorer, Result, Setup
from stovepipe_fsm.apps.check.invariants import Rules
from stovepipe_fsm.apps.check.model import REWRITE_HEAD, Bounds
from stovepipe_fsm.apps.check.observe import Observation
from stovepipe_fsm.apps.check.trace import as_timeline, replay
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.domain.entities import INCREMENTAL_SINCE_GREEN
from stovepipe_fsm.machine.invariants import INVARIANTS, InvariantCatalog
from stovepipe_fsm.process.catalog import load_process_machines

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "machines"
CONFIG = ROOT / "config" / "queues.yaml"
WITNESS = "never_on_an_older_green"
SMALL = Bounds(
    heads=2, max_crashes=0, max_duplicates=0, max_dead_letters=0, max_outages=0, pauses=False
)

OLDEST_PLUGIN = '''"""Build on the oldest recorded green that is an ancestor (the mistake)."""

from stovepipe_fsm.process.plugins import DeliveryContext, PluginRegistry, internal_gate


def register(plugin: PluginRegistry) -> None:
    @internal_gate(plugin).action()
    async def oldest_green_base(ctx: DeliveryContext) -> None:
        """Move an incremental base to the oldest recorded green R descends from."""
        if ctx.build_strategy != "incremental_since_green":
            return
        source = ctx.services.source_control.for_queue(ctx.request.queue)
        for green in reversed(ctx.queue.greens):
            if await source.is_ancestor(green.uri, ctx.request.uri):
                ctx.base_uri = green.uri
                return
'''


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def never_on_an_older_green(
    pre: Observation, post: Observation, rules: Rules, params: Mapping[str, Any]
) -> Iterator[str]:
    """Fails when R is admitted incremental on a green older than last green: a witness
    that the exploration reaches that state."""
    for after in post.requests:
        before = pre.by_id.get(after.id)
        row = pre.queue(after.queue)
        if before is None or row is None or before.build_strategy or not after.build_strategy:
            continue
        if after.build_strategy == INCREMENTAL_SINCE_GREEN and after.base_uri != row.last_green_uri:
            yield f"{after.uri} builds on {after.base_uri}, last green {row.last_green_uri}"


def catalog() -> InvariantCatalog:
    extended = INVARIANTS.copy()
    extended.transition(WITNESS)(never_on_an_older_green)
    return extended


def write_policy(policy_dir: Path, *, witness: bool = False, mutant: bool = False) -> Path:
    machines = policy_dir / "machines"
    shutil.copytree(SHIPPED, machines)
    path = machines / "queue_gate.yaml"
    gate: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    if witness:
        gate["invariants"].append(WITNESS)
    if mutant:
        (step,) = [t for t in gate["transitions"] if t.get("after") == "derive_strategy"]
        step["after"] = ["derive_strategy", "oldest_green_base"]
        gate["plugins"] = ["oldest_rules"]
        (policy_dir / "oldest_rules.py").write_text(OLDEST_PLUGIN, encoding="utf-8")
    path.write_text(yaml.safe_dump(gate, sort_keys=False), encoding="utf-8")
    return machines


def setup_of(machines: Path, max_concurrent: int = 1, heads: int = 2) -> Setup:
    return Setup(
        load_process_machines(machines, lint=False),
        load_policy_store(str(CONFIG)),
        replace(SMALL, heads=heads),
        max_concurrent,
        catalog=catalog(),
    )


def explore(setup: Setup) -> Result:
    return Explorer(setup).run()


def test_the_checked_history_has_a_rewrite_onto_the_first_head() -> None:
    assert SMALL.history()[REWRITE_HEAD] == ["A1"]
    assert "base_is_green_ancestor" in INVARIANTS


@pytest.mark.parametrize("max_concurrent", [1, 2])
def test_the_shipped_gate_builds_on_the_newest_green_ancestor(max_concurrent: int) -> None:
    result = explore(setup_of(SHIPPED, max_concurrent))
    assert result.ok, result.counterexample


def test_the_exploration_reaches_a_base_older_than_last_green(tmp_path: Path) -> None:
    setup = setup_of(write_policy(tmp_path / "witness", witness=True))
    result = explore(setup)
    counterexample = result.counterexample
    assert counterexample is not None and counterexample.violation.invariant == WITNESS
    assert "R builds on A1, last green A2" in counterexample.violation.detail


def test_a_gate_building_on_the_oldest_green_ancestor_is_caught(tmp_path: Path) -> None:
    # Two greens R descends from: A1 and A2 green, A3 admitted on one of them.
    setup = setup_of(write_policy(tmp_path / "mutant", mutant=True), heads=3)
    result = explore(setup)
    counterexample = result.counterexample
    assert counterexample is not None
    assert counterexample.violation.invariant == "base_is_green_ancestor"
    assert "is not the newest recorded green that is an ancestor (A2)" in (
        counterexample.violation.detail
    )
    timeline = as_timeline(setup, counterexample)
    replayed = replay(timeline, setup.machines, setup.config, catalog=setup.catalog)
    assert replayed.violation is not None
    assert replayed.violation.invariant == "base_is_green_ancestor"
    clean = replay(timeline, load_process_machines(SHIPPED), setup.config)
    assert clean.violation is None

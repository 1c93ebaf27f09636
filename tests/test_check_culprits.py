"""``check`` explores culprit finding: the shipped culprit machine holds its invariants, and
each invariant fails on a policy that breaks it.

Every run here is small (a blamelist of two commits and a newer head); the default
bounds run in the ``slow`` test at the end. The mutants are copies of the shipped
machines with one edit to ``culprit.yaml`` (loaded with ``--no-lint``), a wrong piece
of the search's evidence math, or a lifecycle variant, as the gate's mutants are.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from stovepipe_fsm.apps.check.culprit_invariants import CULPRIT_CHECKS
from stovepipe_fsm.apps.check.culprits import CulpritBounds, CulpritExplorer, CulpritSetup
from stovepipe_fsm.apps.check.variants import Variant
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.domain.culprit_search import section_probes
from stovepipe_fsm.domain.entities import Queue, Request
from stovepipe_fsm.process import culprit as culprit_process
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.process.lifecycle import RequestLifecycle

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "machines"
CONFIG = ROOT / "config" / "queues.yaml"
# The gate's exploration at its smallest, so the run is the culprit exploration's.
TINY_GATE = ["--heads", "1", "--no-rewrite", "--max-concurrent", "1", "--no-pauses"]
SMALL = [*TINY_GATE, "--culprit-commits", "2", "--jobs", "1", "--quiet"]


def run_check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["check", "--config", str(CONFIG), *args])
    return code, capsys.readouterr().out


def mutant(tmp_path: Path, edit: Any) -> Path:
    """A copy of the shipped machines with ``edit`` applied to culprit.yaml's document."""
    directory = tmp_path / "machines"
    shutil.copytree(SHIPPED, directory)
    path = directory / "culprit.yaml"
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    edit(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return directory


def transition(doc: dict[str, Any], trigger: str, source: str, dest: str) -> dict[str, Any]:
    (found,) = [
        t
        for t in doc["transitions"]
        if t["trigger"] == trigger
        and t["dest"] == dest
        and source in (t["source"] if isinstance(t["source"], list) else [t["source"]])
    ]
    return found  # type: ignore[no-any-return]


def explore(slots: int = 1, variant: Variant | None = None, **bounds: Any) -> Any:
    machines = load_process_machines(SHIPPED)
    store = load_policy_store(str(CONFIG), machines.parameters)
    setup = CulpritSetup(
        machines, store, CulpritBounds(**{"commits": 2, **bounds}), slots, variant or Variant()
    )
    return CulpritExplorer(setup).run()


def caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any
) -> tuple[str, list[str], str]:
    """``check`` of the mutant ``edit`` makes: the invariant it reports broken, the steps
    of its trace, and the whole output."""
    machines = mutant(tmp_path, edit)
    code, out = run_check(
        capsys, *SMALL, "--machines", str(machines), "--no-lint", "--probe-slots", "1"
    )
    assert code == 1, out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("invariant ")]
    steps = out.split("shortest trace", 1)[1].splitlines()[1:]
    invariant = line.split(":", 1)[0].removeprefix("invariant ")
    return invariant, [s.split(None, 1)[1] for s in steps], out


# --- the shipped policy -----------------------------------------------------------------


@pytest.mark.parametrize("slots", [1, 2])
def test_the_shipped_search_holds_every_invariant_and_reaches_each_end(slots: int) -> None:
    result = explore(slots)
    assert result.ok, result.counterexample
    assert result.named and result.unresolved
    assert result.states > 500


def test_check_runs_the_culprit_exploration_and_says_what_it_proves(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run_check(capsys, *SMALL, "--probe-slots", "1")
    assert code == 0, out
    assert (
        "check culprit: queue monorepo/main, green base c0, red head c2 (blamelist c1..c2), "
        "newer head c3; the culprit each commit or none; per path at most 1 flake(s), "
        "1 crash(es) after save_search, 1 repeated outcome(s); probe_slots 1"
    ) in out
    assert (
        "proves culprit: search_ends, probe_slots_bound, named_soundly, probes_never_delay_heads"
    ) in out
    (line,) = [ln for ln in out.splitlines() if "culprit probe_slots=1: ok - " in ln]
    assert "named" in line and "unresolved" in line


def test_a_queue_with_finding_off_is_not_explored(capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped config searches nowhere (probe_slots 0): nothing to prove, named or not."""
    for queue in (["--queue", "monorepo/main"], []):
        code, out = run_check(capsys, *SMALL, *queue)
        assert code == 0, out
        assert "culprit probe_slots" not in out and "check culprit" not in out


def test_a_policy_without_culprit_yaml_is_not_explored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "machines"
    shutil.copytree(SHIPPED, directory)
    (directory / "culprit.yaml").unlink()
    code, out = run_check(capsys, *SMALL, "--machines", str(directory))
    assert code == 0, out
    assert "check culprit" not in out


def test_an_invariant_declared_for_other_queues_is_not_proved_here(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["invariants"] = [
            {"name": name, "queues": ["team/*"]} if name == "named_soundly" else name
            for name in doc["invariants"]
        ]
        transition(doc, "judge", "weighed", "named").pop("conditions")  # breaks it

    machines = mutant(tmp_path, edit)
    code, out = run_check(
        capsys, *SMALL, "--machines", str(machines), "--no-lint", "--probe-slots", "1"
    )
    assert code == 0, out
    assert "proves culprit: search_ends, probe_slots_bound, probes_never_delay_heads" in out


def test_the_config_scopes_a_culprit_invariant_like_any_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "queues.yaml"
    config.write_text("invariants:\n  search_ends: [team/*]\n", encoding="utf-8")
    code, out = run_check(capsys, "--config", str(config), *SMALL, "--probe-slots", "1")
    assert code == 0, out
    assert "proves culprit: probe_slots_bound, named_soundly, probes_never_delay_heads" in out


# --- each invariant can fail --------------------------------------------------------------


def test_naming_without_culprit_confirmed_breaks_named_soundly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def edit(doc: dict[str, Any]) -> None:
        named = transition(doc, "judge", "weighed", "named")
        assert named.pop("conditions") == "culprit_confirmed"

    invariant, steps, out = caught(tmp_path, capsys, edit)
    assert invariant == "named_soundly"
    assert "has no green result" in out
    assert steps[-1] == "complete c2 failed"


def test_a_search_that_starts_no_probe_breaks_search_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def edit(doc: dict[str, Any]) -> None:
        sections = [t for t in doc["transitions"] if "choose_sections" in t.get("after", [])]
        (searching,) = sections
        searching["after"].remove("choose_sections")

    invariant, _, out = caught(tmp_path, capsys, edit)
    assert invariant == "search_ends"
    assert "open with nothing in flight" in out


def test_a_redelivery_that_does_not_heal_the_crash_breaks_search_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The row is written, the record crashes before the probe is published: only the
    outcome's redelivery, ignored by the search, can publish it (ensure_probes)."""

    def edit(doc: dict[str, Any]) -> None:
        for t in doc["transitions"]:
            if t["trigger"] == "decide" and t["dest"] == "ignored":
                assert t.pop("after") == "ensure_probes"

    invariant, steps, _ = caught(tmp_path, capsys, edit)
    assert invariant == "search_ends"
    assert any("crashing after save_search" in s for s in steps)
    assert steps[-1].endswith(" again")


def test_probes_chosen_without_counting_those_in_flight_break_probe_slots_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def ignoring_slots(tallies: Any, in_flight: Any, slots: int, confirm: int) -> Any:
        return section_probes(tallies, (), slots, confirm)

    monkeypatch.setattr(culprit_process, "section_probes", ignoring_slots)
    result = explore(1)
    assert result.counterexample is not None
    assert result.counterexample.violation.invariant == "probe_slots_bound"
    assert "probe_slots 1" in result.counterexample.violation.detail


class SlotTakingProbes(RequestLifecycle):
    """A probe that claims one of its queue's build slots as it starts."""

    async def start_probe(
        self, request_id: str, queue: str, commit: str, *, probe_of: str, base: str
    ) -> Request:
        probe = await super().start_probe(request_id, queue, commit, probe_of=probe_of, base=base)

        def claim(row: Queue) -> Queue:
            return replace(row, slot_holders=(*row.slot_holders, request_id))

        await self.update_queue(queue, claim)
        return probe


def test_a_probe_holding_a_build_slot_breaks_probes_never_delay_heads() -> None:
    result = explore(1, Variant(lifecycle=SlotTakingProbes), newer_head=False)
    assert result.counterexample is not None
    violation = result.counterexample.violation
    assert violation.invariant == "probes_never_delay_heads"
    assert "hold build slots" in violation.detail


def test_a_head_held_behind_a_probe_breaks_probes_never_delay_heads() -> None:
    """With the probe's slot claim cleaned from the row's view, the newer head's delivery
    still waits for it: decided with probes in flight, it differs from without them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(CULPRIT_CHECKS, "probes_never_delay_heads", lambda *_: iter(()))
        result = explore(1, Variant(lifecycle=SlotTakingProbes))
    assert result.counterexample is not None
    violation = result.counterexample.violation
    assert violation.invariant == "probes_never_delay_heads"
    assert "without them" in violation.detail
    assert result.counterexample.trace[-1].kind == "deliver"


@pytest.mark.slow
def test_three_commits_hold_every_invariant_at_one_and_two_probe_slots(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run_check(
        capsys,
        *TINY_GATE,
        "--culprit-commits",
        "3",
        "--probe-slots",
        "1",
        "2",
        "--jobs",
        "1",
        "--quiet",
    )
    assert code == 0, out
    assert "culprit probe_slots=1: ok" in out and "culprit probe_slots=2: ok" in out

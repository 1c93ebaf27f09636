"""The checker explores an operator's ``cancel`` racing the process stage, and catches a
cancel that writes without its compare-and-set.

``--max-cancels N`` lets each path run the real verb (``pipeline/verbs.py``, through the
``cancel`` timeline step) on any head not yet ended, at every interleaving point: before
or after an admission's write, after a crash left a claimed slot, between a hold and its
recheck. A cancel the verb refuses (a running head) writes nothing and is no edge, so the
states reached are those of cancels of waiting heads. Off by default.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from check_mutants.cancel import blind_cancel
from fixture_policy import CONFIG, MACHINES

from stovepipe_fsm.apps.check.actions import enabled
from stovepipe_fsm.apps.check.explorer import Explorer, Setup
from stovepipe_fsm.apps.check.invariants import Rules
from stovepipe_fsm.apps.check.model import CANCEL, Bounds, Budget
from stovepipe_fsm.apps.check.observe import observe
from stovepipe_fsm.apps.check.trace import replay
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.pipeline import verbs
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.timeline import load_timeline

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--heads", "2", "--no-rewrite", "--max-concurrent", "1", "--jobs", "1", "--quiet"]
STATES = re.compile(r"ok: every invariant holds - (\d+) states")


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def run_check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["check", *args, "--machines", str(MACHINES), "--config", str(CONFIG)])
    return code, capsys.readouterr().out


def test_cancels_explored_hold_every_invariant_and_reach_more_states(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, plain = run_check(capsys, *SMALL)
    assert code == 0, plain
    assert "operator cancel" not in plain
    code, with_cancels = run_check(capsys, *SMALL, "--max-cancels", "1")
    assert code == 0, with_cancels
    assert "1 operator cancel(s)" in with_cancels
    assert "superseded_never_started" in with_cancels  # declares the withdrawal checks
    (before,) = STATES.findall(plain)
    (after,) = STATES.findall(with_cancels)
    assert int(after) > int(before)


def test_a_cancel_lands_between_a_crashed_claim_and_its_redelivery() -> None:
    """A crash after the claim leaves the waiting head holding a slot; a cancel there is
    explored, and the verb gives the claim back (no holder is left to wedge the queue)."""
    machines = load_process_machines(MACHINES)
    bounds = Bounds(heads=1, rewrite=False, max_cancels=1)
    explorer = Explorer(Setup(machines, load_policy_store(str(CONFIG)), bounds, 1))
    result = explorer.run()
    assert result.counterexample is None and result.complete
    after_crash = []
    for sid, obs in enumerate(explorer.observations):
        labels = [a.describe() for a in explorer.trace(sid)]
        if labels[-1:] == ["cancel A1"] and "crash after_claim_slot; deliver" in labels:
            after_crash.append(obs)
    assert after_crash
    for obs in after_crash:
        (request,) = obs.requests
        (row,) = obs.queues
        assert request.state in machines.roles.withdrawn_states
        assert row.slot_holders == () and row.serial_holder == ""


def test_no_cancel_is_enabled_without_the_withdraw_role_or_budget() -> None:
    machines = load_process_machines(MACHINES)
    bounds = Bounds(heads=1, rewrite=False, max_cancels=1)
    world = Setup(machines, load_policy_store(str(CONFIG)), bounds, 1).new_world()
    world.ingest(bounds.queue, "A1")
    obs = observe(world)
    rules = Rules.for_machines(machines, max_concurrent=1, history=bounds.history())
    kinds = [a.kind for a in enabled(obs, Budget(), bounds, rules)]
    assert kinds.count(CANCEL) == 1
    assert CANCEL not in [a.kind for a in enabled(obs, Budget(cancels=1), bounds, rules)]
    off = Bounds(heads=1, rewrite=False)
    assert CANCEL not in [a.kind for a in enabled(obs, Budget(), off, rules)]
    without_role = Rules(**{**rules.__dict__, "withdrawn_states": frozenset()})
    assert CANCEL not in [a.kind for a in enabled(obs, Budget(), bounds, without_role)]


def test_a_cancel_without_compare_and_set_is_caught_and_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verbs, "cancel", blind_cancel)
    out = tmp_path / "cx.yaml"

    code, stdout = run_check(capsys, *SMALL, "--max-cancels", "1", "--out", str(out))

    assert code == 1, stdout
    assert "invariant withdraws_only_waiting:" in stdout
    assert "was withdrawn while processing" in stdout
    text = out.read_text(encoding="utf-8")
    assert "- {cancel: A1}" in text
    timeline = load_timeline(out)
    assert [s.describe() for s in timeline.steps] == ["ingest A1", "deliver", "cancel A1"]
    machines = load_process_machines(MACHINES)
    store = load_policy_store(str(CONFIG))
    broken = replay(timeline, machines, store)
    assert broken.violation is not None
    assert broken.violation.invariant == "withdraws_only_waiting"
    assert broken.step == len(timeline.steps)
    (request,) = broken.world.requests.snapshot()
    assert request.state == "cancelled" and not request.build_strategy
    assert [p.request_id for p in broken.world.published.builds()] == [request.id]

    code, stdout = run_check(capsys, "--replay", str(out), "--machines", str(MACHINES))
    assert code == 1
    assert "invariant withdraws_only_waiting is broken" in stdout

    monkeypatch.undo()  # the real verb refuses the same cancel: the running build goes on
    monkeypatch.chdir(ROOT)
    clean = replay(timeline, machines, store)
    assert clean.violation is None
    (request,) = clean.world.requests.snapshot()
    assert request.state == "processing"

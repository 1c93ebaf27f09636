"""The optional ``preempt`` role: a newer head ends the running build of an older one.

A policy opts in by declaring the role in its request machine and naming the gate action
``preempt_older_builds`` (``examples/policies/cancel_in_progress``). The lifecycle ends
the build (terminal, slot freed, ``superseded_by`` naming the newer head), the end is
announced on the hook topic and noted in the trail, and an outcome reported afterwards
is moot. The shipped policy declares none of it, so nothing it runs is ever preempted.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from stovepipe_fsm.apps.check.invariants import Rules, check_edge
from stovepipe_fsm.apps.check.observe import Observation
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.domain.entities import Queue, Request
from stovepipe_fsm.located.errors import SpecError
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.broker import run_sync
from stovepipe_fsm.simulation.replay import simulate
from stovepipe_fsm.simulation.timeline import load_timeline
from stovepipe_fsm.views.explain import sentence

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "examples" / "policies" / "cancel_in_progress"
TIMELINE = POLICY / "timelines" / "newer_head_cancels_running_build.yaml"
Q = "monorepo/main"


def rid(n: int) -> str:
    return f"request/{Q}/{n}"


def test_the_shipped_machines_never_preempt(capsys: pytest.CaptureFixture[str]) -> None:
    machines = load_process_machines(ROOT / "machines")
    assert machines.roles.preempt == "" and machines.roles.preempted_states == frozenset()
    actions = {
        ref.name for t in machines.queue_gate.spec.transitions for ref in (*t.before, *t.after)
    }
    assert "preempt_older_builds" not in actions
    slot_states = set(machines.request.slot_states)
    for t in machines.request.spec.transitions:
        if slot_states & set(t.source_names):
            # Only a build outcome or the dead-letter reconciler ends a running build.
            assert t.trigger in {o.trigger for o in machines.roles.outcomes.values()} | {
                machines.roles.dead_letter
            }, t.trigger
    small = ["--heads", "2", "--max-concurrent", "1", "--jobs", "1", "--quiet"]
    assert main(["check", *small]) == 0
    assert "ok: every invariant holds" in capsys.readouterr().out


def test_a_declaring_policy_preempts_announces_and_notes() -> None:
    machines = load_process_machines(POLICY / "machines")
    assert machines.roles.preempt == "preempt"
    assert machines.roles.preempted_states == frozenset({"preempted"})
    config = load_policy_store(str(POLICY / "config/queues.yaml"), machines.parameters)
    sim = simulate(load_timeline(TIMELINE), machines, config)
    assert sim.failures == []
    world = sim.world
    a, b, c = (run_sync(world.requests.get(rid(n))) for n in (1, 2, 3))
    assert (a.state, a.superseded_by) == ("preempted", b.id)
    assert (b.state, b.superseded_by) == ("preempted", c.id)
    assert c.state == "succeeded"
    types = [(h.event_type, h.request_id) for h in world.published.hooks()]
    assert ("validation.repository.preempted", a.id) in types
    assert ("validation.repository.preempted", b.id) in types
    # A's late outcome re-announced its end under the same id: one event downstream.
    ids = {h.dedup_id for h in world.published.hooks() if h.request_id == a.id}
    assert len(ids) == 2  # started, preempted
    assert world.trail is not None
    said = [sentence(r) for r in run_sync(world.trail.history(a.id))]
    assert f"preempted by {b.id}: running build ended, slot freed" in said
    assert any(
        "outcome succeeded reported by build after the build was preempted: moot" in s for s in said
    )
    queue = run_sync(world.queues.get(Q))
    assert queue.last_green_uri == "C" and queue.slot_holders == ()


def test_validate_refuses_a_gate_that_preempts_without_the_role(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machines = tmp_path / "machines"
    shutil.copytree(POLICY / "machines", machines)
    request = machines / "request.yaml"
    text = request.read_text(encoding="utf-8")
    request.write_text(
        text.replace("  preempt: preempt ", "  # preempt: preempt "), encoding="utf-8"
    )
    code = main(["validate", str(machines), str(POLICY / "config/queues.yaml")])
    out = capsys.readouterr()
    assert code != 0
    assert "queue_gate.yaml:" in out.out + out.err
    assert "action 'preempt_older_builds' fires the request machine's role 'preempt'" in (
        out.out + out.err
    )
    with pytest.raises(SpecError, match="role 'preempt'"):
        load_process_machines(machines)


def test_lint_refuses_a_preempt_role_that_ends_a_waiting_head(tmp_path: Path) -> None:
    machines = tmp_path / "machines"
    shutil.copytree(POLICY / "machines", machines)
    request = machines / "request.yaml"
    text = request.read_text(encoding="utf-8")
    old = "  - trigger: preempt\n    source: processing\n"
    assert old in text
    request.write_text(
        text.replace(old, "  - trigger: preempt\n    source: [accepted, processing]\n"),
        encoding="utf-8",
    )
    with pytest.raises(SpecError) as raised:
        load_process_machines(machines)
    assert "must leave only slot-holding states" in str(raised.value)
    assert "it also leaves accepted" in str(raised.value)


def _obs(*requests: Request, holders: tuple[str, ...] = ()) -> Observation:
    queue = Queue(Q, latest_request_id=requests[-1].id, slot_holders=holders, version=0)
    return Observation(
        requests=tuple(requests),
        queues=(queue,),
        pending=(),
        builds=frozenset(),
        hooks=frozenset(),
        dead_lettered=frozenset(),
        source_control_up=True,
        armed_crash="",
    )


def _req(n: int, uri: str, state: str, by: str = "") -> Request:
    strategy = "full" if state != "accepted" else ""
    return Request(rid(n), Q, uri, state=state, build_strategy=strategy, superseded_by=by)


@pytest.fixture(scope="module")
def rules() -> Rules:
    machines = load_process_machines(POLICY / "machines")
    return Rules.for_machines(machines, max_concurrent=1, history={"A": [], "B": ["A"]})


def test_preempts_only_older_holds_for_a_newer_head(rules: Rules) -> None:
    running = _obs(_req(1, "A", "processing"), _req(2, "B", "accepted"), holders=(rid(1),))
    fair = _obs(_req(1, "A", "preempted", rid(2)), _req(2, "B", "processing"), holders=(rid(2),))
    assert check_edge(running, fair, rules) is None


def test_preempts_only_older_fires_on_a_waiting_head_or_an_older_one(rules: Rules) -> None:
    waiting = _obs(_req(1, "A", "accepted"), _req(2, "B", "accepted"))
    ended = _obs(_req(1, "A", "preempted", rid(2)), _req(2, "B", "accepted"))
    violation = check_edge(waiting, ended, rules)
    assert violation is not None and violation.invariant == "preempts_only_older"
    running = _obs(_req(1, "A", "accepted"), _req(2, "B", "processing"), holders=(rid(2),))
    backwards = _obs(_req(1, "A", "accepted"), _req(2, "B", "preempted", rid(1)))
    violation = check_edge(running, backwards, rules)
    assert violation is not None and violation.invariant == "preempts_only_older"
    # A policy without the role has nothing to check here.
    without = replace(rules, preempted_states=frozenset())
    violation = check_edge(running, backwards, without)
    assert violation is None or violation.invariant != "preempts_only_older"


def test_a_crash_right_after_preempting_is_finished_by_the_redelivery(tmp_path: Path) -> None:
    timeline = tmp_path / "crash.yaml"
    timeline.write_text(
        "queue: monorepo/main\n"
        "config: {gate_wait_delay_ms: 1000}\n"
        "history: {A: [], B: [A]}\n"
        "steps:\n"
        "  - ingest: A\n"
        "  - run\n"
        "  - ingest: B\n"
        "  - crash: after_preempt_older_builds\n"
        "  - deliver\n"
        "  - expect: {request: A, state: preempted, superseded_by: B}\n"
        "  - expect: {request: B, state: accepted}\n"
        "  - expect: {in_flight: 0}\n"
        "  - run\n"
        "  - expect: {request: B, state: processing, holds: 0}\n"
        "  - expect: {in_flight: 1, builds: [A, B]}\n",
        encoding="utf-8",
    )
    machines = load_process_machines(POLICY / "machines")
    config = load_policy_store(str(POLICY / "config/queues.yaml"), machines.parameters)
    sim = simulate(load_timeline(timeline), machines, config)
    assert sim.failures == [] and len(sim.results) > 0
    preempted = [h for h in sim.world.published.hooks() if h.event_type.endswith(".preempted")]
    assert [h.request_id for h in preempted] == [rid(1)]

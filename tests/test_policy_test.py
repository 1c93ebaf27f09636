"""``stovepipe-fsm test``: timelines with expect steps as a policy's test suite.

Every kind of check is made to fail once, and must come back as exactly one line
``file:line:column: expected X, got Y`` at the key that failed, with exit code 1. Bad
input (a malformed expect step, a state the machine does not declare, an unreadable
path or policy) is exit code 2 with the location, like ``simulate``. The timelines under
``tests/timelines`` that carry expect steps are the seed's rules on the shipped policy,
run here through the command exactly as a user runs them.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
from check_mutants.mutants import write_mutant
from fixture_policy import CONFIG, MACHINES, copy_policy

from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.domain.entities import Queue, QueueConfig, Request
from stovepipe_fsm.located.errors import Location
from stovepipe_fsm.machine.compiler import Step
from stovepipe_fsm.machine.model import NameRef, TransitionSpec
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.broker import run_sync
from stovepipe_fsm.simulation.world import World, hold_reason

ROOT = Path(__file__).resolve().parent.parent
TIMELINES = ROOT / "tests" / "timelines"
POLICY = ["--machines", str(MACHINES), "--config", str(CONFIG)]

# A holds the slot; B superseded by C on sight; C latest, gate closed: held once.
BASE = """\
config: {max_concurrent: 1, gate_wait_delay_ms: 1000}
history: {A: [], B: [A], C: [B]}
steps:
  - ingest: A
  - run
  - ingest: B
  - ingest: C
  - run
"""


def run_test(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["test", *args])
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def position(text: str, line_fragment: str, key: str) -> tuple[int, int]:
    """1-based line of the line holding ``line_fragment``, and the column of ``key:`` on it."""
    lines = text.splitlines()
    [number] = [n for n, line in enumerate(lines, 1) if line_fragment in line]
    return number, lines[number - 1].index(f"{key}:") + 1


# --- the timelines of the shipped policy ------------------------------------------------


def test_the_timelines_with_expect_steps_pass_on_the_shipped_policy(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the shipped machines/ and config/, as a user runs it
    code, out, err = run_test(capsys, "tests/timelines")
    with_expect = [p for p in sorted(TIMELINES.glob("*.yaml")) if "- expect:" in p.read_text()]
    assert len(with_expect) >= 6
    total = len(list(TIMELINES.glob("*.yaml")))
    assert (code, out) == (0, ""), err
    summary = (
        f"{len(with_expect)} passed, 0 failed; {total - len(with_expect)} without expect steps"
    )
    assert summary in err.splitlines()


def test_the_default_path_is_tests_timelines(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    assert run_test(capsys)[0] == 0
    assert run_test(capsys, "tests/timelines")[2] == run_test(capsys)[2]


def test_the_walkthrough_passes_as_a_single_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_test(capsys, str(TIMELINES / "waiting_for_a_slot.yaml"), *POLICY)
    assert (code, out) == (0, "")
    assert err.splitlines()[-1] == "1 passed, 0 failed"


def test_every_check_can_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = BASE + (
        "  - expect: {request: A, state: processing, strategy: full, base: null}\n"
        "  - expect: {request: A, superseded_by: null, holds: 0, hold_reason: null}\n"
        "  - expect: {request: B, state: superseded, superseded_by: C, strategy: null}\n"
        "  - expect:\n"
        "      request: C\n"
        "      state: accepted\n"
        "      holds: 1\n"
        "      hold_reason: gate_closed\n"
        "  - expect: {in_flight: 1, last_green: null, latest: C, builds: [A], holds: 1}\n"
        "  - expect: {queue: monorepo/main, in_flight: 1}\n"
        "  - complete: {uri: A, outcome: succeeded}\n"
        "  - expect: {request: A, state: succeeded}\n"
        "  - expect: {in_flight: 0, last_green: A}\n"
    )
    code, out, err = run_test(capsys, str(write(tmp_path, "ok.yaml", text)), *POLICY)
    assert (code, out) == (0, ""), err
    assert err.splitlines()[-1] == "1 passed, 0 failed"


# --- the worked example of docs/testing-policy.md, on the shipped policy ------------------

DOC = ROOT / "docs" / "testing-policy.md"


def _doc_blocks(kind: str, section: str = "") -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    if section:
        text = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{kind}\n(.*?)```", text, re.S)


def test_the_worked_example_prints_what_the_docs_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    [timeline] = _doc_blocks("yaml", "A worked example")
    passing, failing = _doc_blocks("console", "A worked example")
    (tmp_path / "tests" / "timelines").mkdir(parents=True)
    write(tmp_path / "tests" / "timelines", "two_slots.yaml", timeline)
    shutil.copytree(ROOT / "machines", tmp_path / "machines")
    shutil.copytree(ROOT / "config", tmp_path / "config")
    no_gate = write_mutant("no_gate", tmp_path / "no_gate")
    monkeypatch.chdir(tmp_path)
    assert main(["validate", str(no_gate)]) == 0  # "the machine still validates"
    for session, machines in ((passing, "machines"), (failing, str(no_gate))):
        command, *shown = session.splitlines()
        args = shlex.split(command.removeprefix("$ "))
        assert args[:2] == ["stovepipe-fsm", "test"]
        code, out, err = run_test(capsys, *args[2:], "--machines", machines)
        assert out.splitlines() + err.splitlines() == shown
        assert code == (0 if session is passing else 1)
    # The located error shown for a misspelt state, on the same timeline.
    [shown] = [b for b in _doc_blocks("text", "Expect steps") if "acepted" in b]
    write(
        tmp_path / "tests" / "timelines",
        "two_slots.yaml",
        timeline.replace("state: accepted", "state: acepted"),
    )
    code, out, err = run_test(capsys, "tests/timelines/two_slots.yaml")
    assert (code, out) == (2, "")
    assert err.splitlines()[0] == shown.strip()


# --- every kind of check, failing --------------------------------------------------------

# (expect step, the key it fails at, the message after the location)
FAILING = {
    "state": (
        "{request: A, state: succeeded}",
        "state",
        "request A state succeeded, got processing",
    ),
    "strategy": (
        "{request: A, strategy: incremental_since_green}",
        "strategy",
        "request A strategy incremental_since_green, got full",
    ),
    "strategy_none": (
        "{request: A, strategy: null}",
        "strategy",
        "request A strategy none, got full",
    ),
    "base": ("{request: A, base: B}", "base", "request A base B, got none"),
    "superseded_by": (
        "{request: B, superseded_by: A}",
        "superseded_by",
        "request B superseded_by A, got C",
    ),
    "not_superseded": (
        "{request: C, superseded_by: B}",
        "superseded_by",
        "request C superseded_by B, got none",
    ),
    "request_holds": ("{request: C, holds: 2}", "holds", "request C holds 2, got 1"),
    "hold_reason": (
        "{request: C, hold_reason: latest_not_stamped}",
        "hold_reason",
        "request C hold_reason latest_not_stamped, got gate_closed",
    ),
    "never_held": (
        "{request: A, hold_reason: gate_closed}",
        "hold_reason",
        "request A hold_reason gate_closed, got none",
    ),
    "no_request": (
        "{request: Z, state: accepted}",
        "request",
        "a request for Z in queue monorepo/main, got none",
    ),
    "in_flight": ("{in_flight: 0}", "in_flight", "queue monorepo/main in_flight 0, got 1"),
    "last_green": ("{last_green: A}", "last_green", "queue monorepo/main last_green A, got none"),
    "latest": ("{latest: B}", "latest", "queue monorepo/main latest B, got C"),
    "builds": ("{builds: [A, C]}", "builds", "queue monorepo/main builds [A, C], got [A]"),
    "queue_holds": ("{holds: 0}", "holds", "queue monorepo/main holds 0, got 1"),
    "no_queue_row": (
        "{queue: mobile/ios, in_flight: 0}",
        "in_flight",
        "queue mobile/ios in_flight 0, got no queue row",
    ),
}


@pytest.mark.parametrize("kind", sorted(FAILING))
def test_a_failed_check_is_one_located_line_and_exit_1(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    step, key, message = FAILING[kind]
    text = BASE + f"  - expect: {step}\n"
    path = write(tmp_path, f"{kind}.yaml", text)
    code, out, err = run_test(capsys, str(path), *POLICY)
    line, column = position(text, "- expect:", key)
    assert code == 1, err
    assert out == f"{path}:{line}:{column}: expected {message}\n"
    assert err.splitlines()[-1] == "0 passed, 1 failed"


def test_a_failed_timeline_shows_what_deliveries_raised_at_their_yaml_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        "history: {A: [], B: [A]}\n"
        "steps:\n"
        "  - ingest: A\n"
        "  - run\n"
        "  - complete: {uri: A, outcome: succeeded}\n"
        "  - source_control: down\n"
        "  - ingest: B\n"
        "  - run\n"
        "  - expect: {in_flight: 1}\n"
    )
    path = write(tmp_path, "down.yaml", text)
    code, out, err = run_test(capsys, str(path), *POLICY)
    assert code == 1, err
    failed, *raised = out.splitlines()
    assert failed.startswith(f"{path}:9:")
    assert raised == [
        f"{path}: request/monorepo/main/2 raised {MACHINES / 'queue_gate.yaml'}:"
        f"{derive_strategy_line()}: in machine 'queue_gate', state 'latest', trigger 'gate', "
        "action 'derive_strategy': SourceControlOutage: source control unavailable"
    ]


def derive_strategy_line() -> str:
    """``line:column`` of ``derive_strategy`` in the tests' copy of the gate."""
    lines = (MACHINES / "queue_gate.yaml").read_text(encoding="utf-8").splitlines()
    [(number, text)] = [
        (n, t) for n, t in enumerate(lines, 1) if "after:" in t and "derive_strategy" in t
    ]
    return f"{number}:{text.index('derive_strategy') + 1}"


def test_each_failed_key_of_a_block_step_is_reported_at_its_own_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = BASE + (
        "  - expect:\n"
        "      request: C\n"
        "      state: processing\n"
        "      holds: 1\n"  # passes: not reported
        "      base: A\n"
        "  - expect: {in_flight: 1, builds: []}\n"
    )
    path = write(tmp_path, "block.yaml", text)
    code, out, _ = run_test(capsys, str(path), *POLICY)
    assert code == 1
    state, base = position(text, "state: processing", "state"), position(text, "base: A", "base")
    builds = position(text, "builds: []", "builds")
    assert out.splitlines() == [
        f"{path}:{state[0]}:{state[1]}: expected request C state processing, got accepted",
        f"{path}:{base[0]}:{base[1]}: expected request C base A, got none",
        f"{path}:{builds[0]}:{builds[1]}: expected queue monorepo/main builds [], got [A]",
    ]


def test_expectations_are_checked_where_they_stand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A check reads the world at its step: the same check before and after an ingest."""
    text = BASE + "  - expect: {latest: C}\n  - ingest: D\n  - expect: {latest: C}\n"
    text = text.replace("C: [B]}", "C: [B], D: [C]}")
    path = write(tmp_path, "where.yaml", text)
    code, out, _ = run_test(capsys, str(path), *POLICY)
    last = len(text.splitlines())
    assert code == 1
    assert out == f"{path}:{last}:14: expected queue monorepo/main latest C, got D\n"


def test_passed_and_failed_timelines_are_counted_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    write(suite, "a_passes.yaml", BASE + "  - expect: {in_flight: 1}\n")
    write(suite, "b_fails.yaml", BASE + "  - expect: {in_flight: 2}\n")
    write(suite, "c_plain.yml", BASE)
    write(suite, "notes.txt", "not a timeline")
    code, out, err = run_test(capsys, str(suite), *POLICY)
    assert code == 1
    assert [line.split(": ", 1)[0] for line in out.splitlines()] == [
        f"{suite / 'b_fails.yaml'}:9:14"
    ]
    assert err.splitlines()[-1] == "1 passed, 1 failed; 1 without expect steps"


# --- bad input --------------------------------------------------------------------------

# (expect step, key or value the error is located at, a fragment of the message)
INVALID = {
    "unknown_key": (
        "{request: A, stat: processing}",
        "stat",
        "unknown key 'stat' in steps[5].expect; allowed: base, builds,",
    ),
    "queue_check_on_a_request": (
        "{request: A, in_flight: 1}",
        "in_flight",
        "'in_flight' is about a queue",
    ),
    "request_check_without_request": (
        "{state: processing}",
        "state",
        "'state' is about a request: name it with 'request: URI'",
    ),
    "asserts_nothing": (
        "{request: A}",
        "request",
        "expect asserts nothing about the request; give at least one of: state,",
    ),
    "asserts_nothing_about_a_queue": (
        "{queue: monorepo/main}",
        "expect",
        "expect asserts nothing about the queue",
    ),
    "undeclared_state": (
        "{request: A, state: procesing}",
        "state",
        "state 'procesing' is not a state of the request machine; declared states: accepted, "
        "processing, superseded, succeeded, failed, cancelled",
    ),
    "wrong_type": (
        "{in_flight: many}",
        "many",
        "steps[5].expect.in_flight: 'many' is not of type 'integer'",
    ),
    "negative_holds": ("{holds: -1}", "-1", "less than the minimum of 0"),
    "empty_strategy": ("{request: A, strategy: ''}", "''", "should be non-empty"),
    "bad_queue_name": ('{queue: "bad queue", in_flight: 0}', '"bad queue"', "whitespace"),
}


@pytest.mark.parametrize("kind", sorted(INVALID))
def test_a_malformed_expect_step_is_bad_input_at_its_location(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    step, anchor, fragment = INVALID[kind]
    text = BASE + f"  - expect: {step}\n"
    path = write(tmp_path, f"{kind}.yaml", text)
    code, out, err = run_test(capsys, str(path), *POLICY)
    line = len(text.splitlines())
    column = text.splitlines()[-1].index(anchor) + 1
    assert (code, out) == (2, ""), err
    first = err.splitlines()[0]
    assert first.startswith(f"{path}:{line}:{column}: "), err
    assert fragment in first
    assert err.splitlines()[-1] == "0 passed, 0 failed; 1 invalid"
    # simulate refuses the same timeline the same way
    capsys.readouterr()
    assert main(["simulate", str(path), *POLICY]) == 2
    assert capsys.readouterr().err.splitlines()[0] == first


def test_bad_input_in_one_timeline_does_not_stop_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = write(tmp_path, "a_broken.yaml", BASE + "  - complete: {uri: Q, outcome: succeeded}\n")
    failing = write(tmp_path, "b_failing.yaml", BASE + "  - expect: {in_flight: 3}\n")
    code, out, err = run_test(capsys, str(broken), str(failing), *POLICY)
    assert code == 2
    assert out == f"{failing}:9:14: expected queue monorepo/main in_flight 3, got 1\n"
    assert err.startswith(f"{broken}:9:5: step 6 (complete Q succeeded): no request for uri 'Q'")
    assert err.splitlines()[-1] == "0 passed, 1 failed; 1 invalid"


def test_states_are_the_machines_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Under a machine whose initial state is renamed, expectations name the new state."""
    policy = copy_policy(tmp_path / "policy")
    request_yaml = policy / "machines" / "request.yaml"
    text = request_yaml.read_text(encoding="utf-8")
    request_yaml.write_text(re.sub(r"\baccepted\b", "queued", text), encoding="utf-8")
    renamed_policy = ["--machines", str(policy / "machines"), "--config", str(CONFIG)]
    good = write(tmp_path, "renamed.yaml", BASE + "  - expect: {request: C, state: queued}\n")
    assert run_test(capsys, str(good), *renamed_policy)[0] == 0
    old = write(tmp_path, "old.yaml", BASE + "  - expect: {request: C, state: accepted}\n")
    code, _, err = run_test(capsys, str(old), *renamed_policy)
    assert code == 2
    assert "state 'accepted' is not a state of the request machine; declared states: queued," in err


def test_a_path_that_does_not_exist_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_test(capsys, str(tmp_path / "absent.yaml"), *POLICY)
    assert (code, out) == (2, "")
    assert err == f"error: No such file or directory: '{tmp_path / 'absent.yaml'}'\n"


def test_a_directory_without_timelines_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_test(capsys, str(tmp_path), *POLICY)
    assert code == 2
    assert err == f"error: no timeline files (*.yaml) in directory: '{tmp_path}'\n"


def test_nothing_to_test_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Timelines without expect steps test nothing: a run of only those must not pass CI."""
    path = write(tmp_path, "plain.yaml", BASE)
    code, out, err = run_test(capsys, str(path), *POLICY)
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "0 passed, 0 failed; 1 without expect steps",
        "no timeline has expect steps: nothing was tested",
    ]


def test_an_invalid_policy_is_bad_input_at_its_location(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = copy_policy(tmp_path / "policy")
    gate = policy / "machines" / "queue_gate.yaml"
    gate.write_text(
        gate.read_text(encoding="utf-8").replace(
            "conditions: gate_closed", "conditions: gate_shut"
        ),
        encoding="utf-8",
    )
    path = write(tmp_path, "t.yaml", BASE + "  - expect: {in_flight: 1}\n")
    code, out, err = run_test(
        capsys, str(path), "--machines", str(policy / "machines"), "--config", str(CONFIG)
    )
    assert (code, out) == (2, "")
    assert re.search(rf"^{re.escape(str(gate))}:\d+:\d+: .*'gate_shut'", err, re.M), err


# --- simulate shows expectations, and never fails on them ------------------------------


def test_simulate_shows_failed_checks_in_its_rows_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = BASE + "  - expect: {request: C, state: processing, holds: 1}\n"
    path = write(tmp_path, "t.yaml", text)
    capsys.readouterr()
    assert main(["simulate", str(path), *POLICY]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("6 ")]
    assert [re.split(r"\s{2,}", row)[2:] for row in rows] == [
        ["expect request C", "FAILED expected request C state processing, got accepted"],
        ["expect request C", "ok (holds)"],
    ]
    assert out.rstrip().endswith("expectations: 1 passed, 1 failed")
    capsys.readouterr()
    assert main(["simulate", str(path), "--json", *POLICY]) == 0
    doc = json.loads(capsys.readouterr().out)
    line, column = position(text, "- expect:", "state")
    assert doc["expectations"] == {
        "passed": 1,
        "failed": [
            {
                "line": line,
                "column": column,
                "message": "expected request C state processing, got accepted",
            }
        ],
    }


def test_expect_steps_leave_the_world_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def end_state(text: str) -> dict[str, object]:
        path = write(tmp_path, "t.yaml", text)
        capsys.readouterr()
        assert main(["simulate", str(path), "--json", *POLICY]) == 0
        doc: dict[str, object] = json.loads(capsys.readouterr().out)
        return doc

    plain = end_state(BASE)
    checked = end_state(BASE + "  - expect: {request: C, holds: 1}\n  - expect: {builds: [A]}\n")
    assert "expectations" not in plain
    assert checked.pop("expectations") == {"passed": 2, "failed": []}
    assert checked == plain


# --- hold reasons --------------------------------------------------------------------------


def test_a_hold_before_ingest_stamped_the_head_is_recorded_as_not_stamped() -> None:
    world = World(load_process_machines(MACHINES), StaticConfigStore(QueueConfig()), {"A": []})
    request_id = "request/monorepo/main/1"
    run_sync(world.queues.create(Queue("monorepo/main")))
    run_sync(world.requests.create(Request(request_id, "monorepo/main", "A", "accepted")))
    world.broker.publish("monorepo/main", request_id, 0)
    report = world.deliver_next()
    assert report is not None
    assert (report.outcome, report.hold_reason) == ("held", "latest_not_stamped")
    [hold] = world.hold_log
    assert (hold.request_id, hold.queue, hold.reason) == (
        request_id,
        "monorepo/main",
        "latest_not_stamped",
    )


def _step(conditions: tuple[str, ...], unless: tuple[str, ...], description: str) -> Step:
    """The step of a transition ``gate: latest -> held`` declared with these guards."""
    where = Location("gate.yaml", 1, 1)
    spec = TransitionSpec(
        0,
        "gate",
        (NameRef("latest", where),),
        NameRef("held", where),
        where,
        conditions=tuple(NameRef(name, where) for name in conditions),
        unless=tuple(NameRef(name, where) for name in unless),
        description=description,
    )
    return Step("gate", "latest", "held", ("hold",), False, False, transition=spec)


@pytest.mark.parametrize(
    ("conditions", "unless", "description", "reason"),
    [
        (("gate_closed",), (), "wait", "gate_closed"),
        (("paused", "gate_closed"), ("draining",), "", "paused and gate_closed"),
        ((), ("window_open",), "outside the window", "not window_open"),
        ((), (), "always wait", "always wait"),
        ((), (), "", "gate from latest"),
    ],
)
def test_a_hold_reason_is_what_the_transition_into_the_held_state_tests(
    conditions: tuple[str, ...], unless: tuple[str, ...], description: str, reason: str
) -> None:
    """A user's own hold transitions get reasons by the same rule as the shipped ones."""
    assert hold_reason(_step(conditions, unless, description)) == reason
    assert hold_reason(None) == ""

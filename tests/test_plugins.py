"""Plugins: a policy adds conditions and actions in its own Python module.

The fixture policy ``tests/fixtures/plugins/freeze_window`` ships ``freeze_rules.py``
beside its ``machines/`` directory; the tests load it the ways a user would (the
``validate``, ``diagram``, ``simulate`` and ``check`` commands, ``load_process_machines``)
and run deliveries through it. Broken plugins are written into a copy of that policy in
a temporary directory; each must be one located issue at the ``plugins:`` item that names
it. An installed plugin is a ``*.dist-info`` directory with an ``entry_points.txt`` on
``sys.path``, which is all ``importlib.metadata`` needs to find it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.domain.entities import QueueConfig, Request
from stovepipe_fsm.located.errors import SpecError
from stovepipe_fsm.machine import plugins as plugins_module
from stovepipe_fsm.machine.compiler import IllegalTransition
from stovepipe_fsm.machine.diagrams import render_mermaid
from stovepipe_fsm.machine.plugin_calls import PluginExited, StepOverBudget
from stovepipe_fsm.process.catalog import REGISTRIES, load_policy, load_process_machines
from stovepipe_fsm.process.lifecycle import RequestLifecycle
from stovepipe_fsm.simulation.broker import run_sync
from stovepipe_fsm.simulation.world import World

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "plugins" / "freeze_window"
GATE_FILE = "machines/queue_gate.yaml"
REQUEST_FILE = "machines/request.yaml"
Q = "monorepo/main"
HOUR_MS = 3_600_000
LISTED = "plugins:\n  - freeze_rules\n"


def copy_policy(tmp_path: Path, name: str = "policy") -> Path:
    """A copy of the fixture policy: machines/ and the plugin module beside it."""
    target = tmp_path / name
    shutil.copytree(FIXTURE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"expected exactly one {old!r} in {path.name}"
    path.write_text(text.replace(old, new), encoding="utf-8")


def freeze_on(policy: Path, condition: str, instead_of: str = "in_freeze_window") -> None:
    """The gate's three freeze branches decide on ``condition`` instead."""
    path = policy / GATE_FILE
    head, transitions = path.read_text(encoding="utf-8").split("\ntransitions:\n")
    assert transitions.count(instead_of) == 3
    transitions = transitions.replace(instead_of, condition)
    path.write_text(f"{head}\ntransitions:\n{transitions}", encoding="utf-8")


def line_of(path: Path, needle: str) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    [number] = [i for i, line in enumerate(lines, 1) if needle in line]
    return number


def validate(
    policy: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, list[str]]:
    monkeypatch.chdir(policy)
    capsys.readouterr()
    code = main(["validate", "machines"])
    return code, capsys.readouterr().out.splitlines()


def world(machines_dir: Path) -> World:
    config = StaticConfigStore(QueueConfig.of(max_concurrent=1, gate_wait_delay_ms=10))
    return World(load_process_machines(machines_dir), config, {"A": []})


def drain(w: World) -> None:
    while w.deliver_next() is not None:
        pass


# --- the fixture policy ---------------------------------------------------------------


def test_a_plugin_beside_the_machines_is_loaded_and_runs_on_the_delivery_context() -> None:
    w = world(FIXTURE / "machines")
    metrics = w.stages.controller.services.metrics
    w.ingest(Q, "A")
    drain(w)  # 00:00 UTC: inside the freeze
    [request] = w.requests.snapshot()
    assert request.state == "accepted"
    assert metrics.total("freeze_holds") == 1
    assert metrics.total("admissions_logged") == 0
    w.advance(HOUR_MS)  # 01:00: the window is over
    drain(w)
    [request] = w.requests.snapshot()
    assert request.state == "processing"
    assert metrics.total("admissions_logged") == 1  # the async plugin action ran
    assert [b.request_id for b in w.published.builds()] == [request.id]


def test_the_plugin_is_part_of_that_policy_only() -> None:
    policy = load_policy(FIXTURE / "machines")
    gate = policy.registries["queue_gate"]
    assert {"in_freeze_window"} <= set(gate.conditions)
    assert {"count_freeze_hold", "log_admission"} <= set(gate.actions)
    assert gate.conditions["in_freeze_window"].origin == "freeze_rules"
    # The built-in registries are untouched, and the shipped policy never sees the names.
    assert "in_freeze_window" not in REGISTRIES["queue_gate"].conditions
    shipped = load_process_machines(ROOT / "machines").registries["queue_gate"]
    assert "in_freeze_window" not in shipped.conditions
    assert "log_admission" not in shipped.actions
    # Loading again builds new registries: nothing is shared between two loads.
    again = load_policy(FIXTURE / "machines").registries["queue_gate"]
    assert again is not gate and again.conditions is not gate.conditions


def test_lint_reports_the_registered_plugin_names_for_a_misspelling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = copy_policy(tmp_path)
    edit(policy / GATE_FILE, "    conditions: in_freeze_window\n", "    conditions: in_freeze\n")
    code, out = validate(policy, capsys, monkeypatch)
    assert code == 1
    [line] = [line for line in out if "'in_freeze'" in line]
    assert line.startswith(f"{GATE_FILE}:{line_of(policy / GATE_FILE, 'conditions: in_freeze')}:")
    assert "registered conditions: baseline_lag_exceeded, gate_closed, in_freeze_window, " in line


def test_persist_before_publish_knows_the_facts_a_plugin_action_requires(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = copy_policy(tmp_path)
    edit(
        policy / GATE_FILE,
        "[mark_processing, release_lost_claim, log_admission,",
        "[log_admission, mark_processing, release_lost_claim,",
    )
    code, out = validate(policy, capsys, monkeypatch)
    line = line_of(policy / GATE_FILE, "[log_admission,")
    assert (code, out) == (
        1,
        [
            f"{GATE_FILE}:{line}:13: persist before publish: 'log_admission' needs "
            "'request_processing' (established by release_lost_claim, conditions: "
            "request_is_processing) but runs from state 'slot_claimed' on a path where it "
            "is not yet established"
        ],
    )


def test_a_fact_a_plugin_provides_satisfies_a_requirement(tmp_path: Path) -> None:
    policy = copy_policy(tmp_path)
    edit(
        policy / "freeze_rules.py",
        "    @gate.action()\n    def count_freeze_hold",
        "    @gate.action(requires=[ADMISSION_LOGGED])\n    def announce_logged(ctx):\n"
        '        """Needs the admission logged."""\n\n'
        "    @gate.action()\n    def count_freeze_hold",
    )
    edit(
        policy / GATE_FILE, "log_admission, announce,", "log_admission, announce_logged, announce,"
    )
    load_process_machines(policy / "machines")  # log_admission runs first: clean
    edit(policy / GATE_FILE, "log_admission, announce_logged,", "announce_logged, log_admission,")
    with pytest.raises(SpecError) as caught:
        load_process_machines(policy / "machines")
    [issue] = caught.value.issues
    assert issue.rule == "persist-before-publish"
    assert "'announce_logged' needs 'admission_logged' (established by log_admission)" in str(issue)


def test_diagrams_show_plugin_docstrings_facts_and_origin(tmp_path: Path) -> None:
    policy = load_policy(FIXTURE / "machines")
    page = render_mermaid(policy.specs["queue_gate"], policy.registries["queue_gate"])
    assert (
        "| `in_freeze_window` | condition (plugin `freeze_rules`) | `gate` | The clock is "
        "inside the daily freeze window (00:00-01:00 UTC). |  |"
    ) in page
    assert (
        "| `log_admission` | action (plugin `freeze_rules`) | `admit` | Log R's strategy and "
        "base as admitted, and note the admission in the trail. | requires "
        "`request_processing`; provides `admission_logged` |"
    ) in page
    # Through the command, from the policy's own directory.
    out = tmp_path / "diagrams"
    code = main(["diagram", "--machines", str(FIXTURE / "machines"), "--out", str(out)])
    assert code == 0
    assert "condition (plugin `freeze_rules`)" in (out / "queue_gate.md").read_text()
    assert (
        main(["diagram", "--check", "--machines", str(FIXTURE / "machines"), "--out", str(out)])
        == 0
    )


def test_simulate_runs_the_plugin_policy(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    code = main(
        [
            "simulate",
            "--json",
            "--machines",
            str(FIXTURE / "machines"),
            str(FIXTURE / "freeze.yaml"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert [r["state"] for r in result["requests"]] == ["processing"]
    assert result["holds"] == 1  # held by the freeze at 00:00, admitted at 01:00
    assert result["builds"] == [f"request/{Q}/1"]


def test_check_explores_a_policy_with_plugin_actions_on_the_admit_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The window emptied: the plugin's condition never holds, its action runs on every
    # admission, under crashes after each step. A copy with the same module name: the
    # policy imports its own freeze_rules, not the fixture's.
    policy = copy_policy(tmp_path)
    edit(policy / "freeze_rules.py", "range(0, 1)", "range(0, 0)")
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    machines = str(policy / "machines")
    code = main(["check", "--machines", machines, "--heads", "2", "--quiet", "--jobs", "1"])
    out, _ = capsys.readouterr()
    assert code == 0, out
    assert "ok: every invariant holds" in out
    frozen = load_policy(FIXTURE / "machines").registries["queue_gate"]
    emptied = load_policy(policy / "machines").registries["queue_gate"]
    assert frozen.conditions["in_freeze_window"].fn is not emptied.conditions["in_freeze_window"].fn


# --- where plugins are imported from --------------------------------------------------


RULES = '''\
from stovepipe_fsm.plugin import PluginContext, PluginRegistry


def register(plugin: PluginRegistry) -> None:
    @plugin.queue_gate.condition(name="{name}")
    def rule(ctx: PluginContext) -> bool:
        """{doc}"""
        return False
'''


def two_policies(tmp_path: Path) -> tuple[Path, Path]:
    """Two policies, each with its own module ``rules`` registering a different name."""
    made = []
    for name in ("alpha", "beta"):
        policy = copy_policy(tmp_path, name)
        (policy / "rules.py").write_text(
            RULES.format(name=f"{name}_rule", doc=f"{name}'s rule."), encoding="utf-8"
        )
        edit(policy / GATE_FILE, LISTED, "plugins:\n  - freeze_rules\n  - rules\n")
        freeze_on(policy, f"{name}_rule")
        made.append(policy)
    return made[0], made[1]


def test_two_policies_with_a_same_named_module_each_import_their_own(tmp_path: Path) -> None:
    alpha, beta = two_policies(tmp_path)
    for policy, own, other in (
        (alpha, "alpha", "beta"),
        (beta, "beta", "alpha"),
        (alpha, "alpha", "beta"),
    ):
        conditions = load_policy(policy / "machines").registries["queue_gate"].conditions
        assert f"{own}_rule" in conditions
        assert f"{other}_rule" not in conditions
        assert conditions[f"{own}_rule"].doc == f"{own}'s rule."


def test_validate_of_two_policies_in_one_run_keeps_them_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, beta = two_policies(tmp_path)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["validate", "alpha/machines", "beta/machines"]) == 0
    # beta's gate naming alpha's rule is an error: alpha's plugin is not beta's.
    freeze_on(beta, "alpha_rule", instead_of="beta_rule")
    capsys.readouterr()
    assert main(["validate", "alpha/machines", "beta/machines"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3  # one per branch that names it
    for line in lines:
        assert line.startswith("beta/machines/queue_gate.yaml:")
        assert "no condition named 'alpha_rule' is registered for machine 'queue_gate'" in line


def test_the_policy_directory_is_off_the_path_after_loading(tmp_path: Path) -> None:
    policy = copy_policy(tmp_path)
    before = list(sys.path)
    load_policy(policy / "machines")
    assert sys.path == before


def test_a_module_listed_by_both_machine_files_is_loaded_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = copy_policy(tmp_path)
    edit(policy / REQUEST_FILE, "initial: accepted\n", "initial: accepted\n" + LISTED)
    assert validate(policy, capsys, monkeypatch) == (0, [])


# --- the request machine ----------------------------------------------------------------


def test_a_request_condition_guards_a_lifecycle_trigger(tmp_path: Path) -> None:
    policy = copy_policy(tmp_path)
    (policy / "cancel_rules.py").write_text(
        "from stovepipe_fsm.plugin import PluginRegistry, Request\n\n\n"
        "def register(plugin: PluginRegistry) -> None:\n"
        "    @plugin.request.condition()\n"
        "    def cancellable(request: Request) -> bool:\n"
        '        """Only a full build may be cancelled."""\n'
        '        return request.build_strategy == "full"\n',
        encoding="utf-8",
    )
    edit(
        policy / REQUEST_FILE, "initial: accepted\n", "initial: accepted\nplugins: [cancel_rules]\n"
    )
    edit(
        policy / REQUEST_FILE,
        "  - trigger: cancel\n    source: processing\n",
        "  - trigger: cancel\n    source: processing\n    conditions: cancellable\n",
    )
    w = world(policy / "machines")
    w.advance(HOUR_MS)  # out of the freeze
    w.ingest(Q, "A")
    drain(w)
    [request] = w.requests.snapshot()
    assert (request.state, request.build_strategy) == ("processing", "full")
    lifecycle = w.stages.lifecycle
    assert run_sync(lifecycle.plan(request, "cancel")).dest == "cancelled"
    incremental = replace(request, build_strategy="incremental_since_green")
    with pytest.raises(IllegalTransition, match="had its conditions met"):
        run_sync(lifecycle.plan(incremental, "cancel"))


def guarded_cancel(tmp_path: Path, body: str) -> tuple[World, Request]:
    """A world whose request machine guards ``cancel`` by a plugin condition running
    ``body``, with one head processing."""
    policy = copy_policy(tmp_path)
    (policy / "cancel_guard.py").write_text(
        "import sys\nimport threading\n\n"
        "from stovepipe_fsm.plugin import PluginRegistry, Request\n\n"
        "RELEASE = threading.Event()\n\n\n"
        "def register(plugin: PluginRegistry) -> None:\n"
        "    @plugin.request.condition()\n"
        "    def cancellable(request: Request) -> bool:\n"
        '        """Asks somebody else."""\n'
        f"        {body}\n"
        "        return True\n",
        encoding="utf-8",
    )
    edit(
        policy / REQUEST_FILE, "initial: accepted\n", "initial: accepted\nplugins: [cancel_guard]\n"
    )
    edit(
        policy / REQUEST_FILE,
        "  - trigger: cancel\n    source: processing\n",
        "  - trigger: cancel\n    source: processing\n    conditions: cancellable\n",
    )
    w = world(policy / "machines")
    w.advance(HOUR_MS)
    w.ingest(Q, "A")
    drain(w)
    [request] = w.requests.snapshot()
    return w, request


def offloaded(w: World) -> RequestLifecycle:
    """The world's request lifecycle as a service builds it: plugin guards offloaded."""
    lc = w.stages.lifecycle
    return RequestLifecycle(lc.machine, lc.roles, lc.requests, lc.queues, offload=True)


async def test_a_request_guard_that_hangs_fails_the_write_while_the_event_loop_runs_on(
    tmp_path: Path,
) -> None:
    w, request = guarded_cancel(tmp_path, "RELEASE.wait(30)")
    lifecycle = offloaded(w)
    lifecycle.machine.watch.budget_s = 0.2
    asked = asyncio.ensure_future(lifecycle.apply(request, "cancel"))
    ticks = 0
    while not asked.done():
        ticks += 1
        await asyncio.sleep(0.01)
    with pytest.raises(StepOverBudget, match=r"request\.yaml:\d+.*trigger 'cancel'"):
        await asked
    assert ticks > 0, "the event loop ran while the guard hung"
    [(where, count)] = lifecycle.machine.watch.over_budget.items()
    assert count == 1 and "request.yaml" in where
    [unchanged] = w.requests.snapshot()
    assert unchanged.state == "processing", "a guard that never answered wrote nothing"
    guard = lifecycle.machine.registry.conditions["cancellable"].fn
    inspect.unwrap(guard).__globals__["RELEASE"].set()
    cancelled = await lifecycle.apply(unchanged, "cancel")
    assert cancelled.state == "cancelled"


async def test_a_request_guard_that_exits_fails_the_write_not_the_process(
    tmp_path: Path,
) -> None:
    w, request = guarded_cancel(tmp_path, "sys.exit(7)")
    with pytest.raises(PluginExited, match="the plugin called exit"):
        await offloaded(w).apply(request, "cancel")
    [unchanged] = w.requests.snapshot()
    assert unchanged.state == "processing"


# --- problems: one located issue per plugin, at the item that names it ------------------


@dataclass(frozen=True)
class Case:
    """A broken plugin: the modules written beside the machines, the ``plugins:`` list of
    the gate, and the one line ``validate`` must print for it."""

    id: str
    rule: str
    listed: tuple[str, ...]
    modules: dict[str, str]
    message: str
    item: str  # the listed name the issue is located at


def _module(body: str) -> str:
    return (
        "from stovepipe_fsm.plugin import PluginContext, PluginRegistry\n\n\n"
        "def register(plugin: PluginRegistry) -> None:\n" + body
    )


CASES = [
    Case(
        "import-missing",
        "plugin-import",
        ("freeze_rules", "audit_rules"),
        {},
        "plugin 'audit_rules' cannot be imported: ModuleNotFoundError: No module named "
        "'audit_rules'",
        "audit_rules",
    ),
    Case(
        "import-raises",
        "plugin-import",
        ("freeze_rules", "audit_rules"),
        {"audit_rules.py": 'raise RuntimeError("AUDIT_TOKEN is not set")\n'},
        "plugin 'audit_rules' cannot be imported: RuntimeError: AUDIT_TOKEN is not set",
        "audit_rules",
    ),
    Case(
        "import-exits",
        "plugin-import",
        ("freeze_rules", "audit_rules"),
        {"audit_rules.py": "import sys\n\nsys.exit(3)\n"},
        "plugin 'audit_rules' cannot be imported: SystemExit: 3",
        "audit_rules",
    ),
    Case(
        "import-own-package",
        "plugin-import",
        ("freeze_rules", "stovepipe_fsm.process.gate"),
        {},
        "plugin 'stovepipe_fsm.process.gate' is a module of stovepipe-fsm itself; a plugin is "
        "a module of your own with a register(plugin) function",
        "stovepipe_fsm.process.gate",
    ),
    Case(
        "no-register",
        "plugin-entry",
        ("freeze_rules", "audit_rules"),
        {"audit_rules.py": "def setup(plugin):\n    pass\n"},
        "plugin 'audit_rules' has no register(plugin) function; define "
        "'def register(plugin: PluginRegistry) -> None' in audit_rules",
        "audit_rules",
    ),
    Case(
        "async-condition",
        "plugin-register",
        ("freeze_rules", "audit_rules"),
        {
            "audit_rules.py": _module(
                "    @plugin.queue_gate.condition()\n"
                "    async def audit_pending(ctx: PluginContext) -> bool:\n"
                "        return False\n"
            )
        },
        "plugin 'audit_rules': queue_gate: condition 'audit_pending' is a coroutine function; "
        "conditions must be synchronous predicates (load what a condition reads in an action "
        "that runs before it)",
        "audit_rules",
    ),
    Case(
        "register-raises",
        "plugin-register",
        ("freeze_rules", "audit_rules"),
        {"audit_rules.py": _module('    raise KeyError("audit_queue")\n')},
        "plugin 'audit_rules': register() raised KeyError: 'audit_queue'",
        "audit_rules",
    ),
    Case(
        "register-exits",
        "plugin-register",
        ("freeze_rules", "audit_rules"),
        {"audit_rules.py": "import sys\n\n\ndef register(plugin):\n    sys.exit('no audit')\n"},
        "plugin 'audit_rules': register() raised SystemExit: no audit",
        "audit_rules",
    ),
    Case(
        "request-action",
        "plugin-register",
        ("freeze_rules", "audit_rules"),
        {
            "audit_rules.py": _module(
                "    @plugin.request.action()\n"
                "    def audit(request: object) -> None:\n"
                "        pass\n"
            )
        },
        "plugin 'audit_rules': request: the request machine runs no actions (its writes are "
        "the lifecycle's compare-and-set); register the step on queue_gate",
        "audit_rules",
    ),
    Case(
        "not-an-identifier",
        "plugin-register",
        ("freeze_rules", "audit_rules"),
        {
            "audit_rules.py": _module(
                '    @plugin.queue_gate.action(name="Audit-Log")\n'
                "    def audit(ctx: PluginContext) -> None:\n"
                "        pass\n"
            )
        },
        "plugin 'audit_rules': queue_gate: action name 'Audit-Log' is not an identifier a "
        "machine file can name (lower-case letters, digits and '_', starting with a letter)",
        "audit_rules",
    ),
    Case(
        "duplicate-builtin",
        "plugin-duplicate",
        ("freeze_rules", "audit_rules"),
        {
            "audit_rules.py": _module(
                "    @plugin.queue_gate.condition()\n"
                "    def gate_closed(ctx: PluginContext) -> bool:\n"
                "        return False\n"
            )
        },
        "plugin 'audit_rules' registers condition 'gate_closed' for machine 'queue_gate', "
        "which the built-in vocabulary already registers; choose another name",
        "audit_rules",
    ),
    Case(
        "duplicate-other-plugin",
        "plugin-duplicate",
        ("freeze_rules", "audit_rules"),
        {
            "audit_rules.py": _module(
                "    @plugin.queue_gate.action()\n"
                "    def log_admission(ctx: PluginContext) -> None:\n"
                "        pass\n"
            )
        },
        "plugin 'audit_rules' registers action 'log_admission' for machine 'queue_gate', "
        "which plugin 'freeze_rules' already registers; choose another name",
        "audit_rules",
    ),
    Case(
        "duplicate-in-one-plugin",
        "plugin-duplicate",
        ("freeze_rules", "audit_rules"),
        {
            "audit_rules.py": _module(
                "    @plugin.queue_gate.action()\n"
                "    def audit(ctx: PluginContext) -> None:\n"
                "        pass\n\n"
                '    @plugin.queue_gate.condition(name="audit")\n'
                "    def audit_condition(ctx: PluginContext) -> bool:\n"
                "        return False\n"
            )
        },
        "plugin 'audit_rules': queue_gate: 'audit' is registered twice",
        "audit_rules",
    ),
]


def broken_policy(tmp_path: Path, case: Case) -> Path:
    policy = copy_policy(tmp_path)
    listed = "".join(f"  - {name}\n" for name in case.listed)
    edit(policy / GATE_FILE, LISTED, f"plugins:\n{listed}")
    for filename, text in case.modules.items():
        (policy / filename).write_text(text, encoding="utf-8")
    return policy


def expected_line(policy: Path, case: Case) -> str:
    line = line_of(policy / GATE_FILE, f"  - {case.item}")
    return f"{GATE_FILE}:{line}:5: {case.message}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_broken_plugin_is_one_located_validate_error(
    case: Case,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = broken_policy(tmp_path, case)
    code, out = validate(policy, capsys, monkeypatch)
    assert (code, out) == (1, [expected_line(policy, case)])
    capsys.readouterr()
    assert main(["validate", "machines", "--format", "json"]) == 1
    [issue] = json.loads(capsys.readouterr().out)["issues"]
    assert issue["rule"] == case.rule


@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: c.id)
def test_commands_that_run_the_policy_refuse_a_broken_plugin(
    case: Case,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = broken_policy(tmp_path, case)
    monkeypatch.chdir(policy)
    capsys.readouterr()
    assert main(["diagram", "--machines", "machines", "--out", "diagrams"]) == 2
    assert capsys.readouterr().err.splitlines() == [expected_line(policy, case)]
    with pytest.raises(SpecError) as caught:
        load_process_machines("machines", lint=False)  # even without lint
    assert [str(i) for i in caught.value.issues] == [expected_line(policy, case)]


def test_a_plugin_that_fails_is_reported_at_every_file_that_lists_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = broken_policy(tmp_path, CASES[0])
    edit(
        policy / REQUEST_FILE, "initial: accepted\n", "initial: accepted\nplugins: [audit_rules]\n"
    )
    code, out = validate(policy, capsys, monkeypatch)
    assert code == 1
    assert out == [  # files in the order validate reads them: machines/*.yaml sorted
        expected_line(policy, CASES[0]),
        f"{REQUEST_FILE}:{line_of(policy / REQUEST_FILE, 'plugins:')}:11: {CASES[0].message}",
    ]


def test_a_plugin_name_must_be_a_module_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = copy_policy(tmp_path)
    edit(policy / GATE_FILE, LISTED, "plugins:\n  - freeze_rules\n  - audit-rules.py\n")
    code, out = validate(policy, capsys, monkeypatch)
    line = line_of(policy / GATE_FILE, "audit-rules.py")
    assert (code, out) == (
        1,
        [
            f"{GATE_FILE}:{line}:5: plugins[1]: a plugin is an importable module name: "
            "identifiers joined by dots, such as my_policy.rules"
        ],
    )


# --- installed plugins: entry points --------------------------------------------------


ACME = '''\
"""Quiet hours for every policy installed next to it."""

from stovepipe_fsm.plugin import PluginContext, PluginRegistry


def register(plugin: PluginRegistry) -> None:
    @plugin.queue_gate.condition()
    def acme_quiet_hours(ctx: PluginContext) -> bool:
        """ACME's quiet hours: never, in this test."""
        return False
'''


def install(site: Path, entry_points: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``acme_rules`` 1.0 installed into ``site`` (a directory put on ``sys.path``)."""
    (site / "acme_rules").mkdir(parents=True)
    (site / "acme_rules" / "__init__.py").write_text(ACME, encoding="utf-8")
    info = site / "acme_rules-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: acme-rules\nVersion: 1.0\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(entry_points, encoding="utf-8")
    monkeypatch.syspath_prepend(str(site))
    for name in [m for m in sys.modules if m.partition(".")[0] == "acme_rules"]:
        monkeypatch.delitem(sys.modules, name)  # one installed in an earlier test
    return info / "entry_points.txt"


def uses_quiet_hours(policy: Path) -> None:
    freeze_on(policy, "acme_quiet_hours")


def test_an_installed_entry_point_plugin_serves_every_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = copy_policy(tmp_path)
    uses_quiet_hours(policy)
    code, out = validate(policy, capsys, monkeypatch)
    assert code == 1 and "no condition named 'acme_quiet_hours'" in out[0]  # not installed
    install(tmp_path / "site", "[stovepipe_fsm.plugins]\nacme = acme_rules\n", monkeypatch)
    assert validate(policy, capsys, monkeypatch) == (0, [])
    gate = load_policy(policy / "machines").registries["queue_gate"]
    assert gate.conditions["acme_quiet_hours"].origin == "acme-rules:acme"
    assert "acme_quiet_hours" in load_policy(ROOT / "machines").registries["queue_gate"].conditions


def test_an_entry_point_may_name_the_register_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = copy_policy(tmp_path)
    uses_quiet_hours(policy)
    install(tmp_path / "site", "[stovepipe_fsm.plugins]\nacme = acme_rules:register\n", monkeypatch)
    load_process_machines(policy / "machines")


def test_a_failing_entry_point_names_the_distribution_and_the_entry_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = copy_policy(tmp_path)
    entry_points = install(
        tmp_path / "site",
        "[console_scripts]\nacme = acme_rules:main\n\n"
        "[stovepipe_fsm.plugins]\nacme = acme_rules.missing\n",
        monkeypatch,
    )
    code, out = validate(policy, capsys, monkeypatch)
    assert (code, out) == (
        1,
        [
            f"{entry_points}:5:1: plugin entry point 'acme = acme_rules.missing' of "
            "distribution 'acme-rules' cannot be imported: ModuleNotFoundError: No module "
            "named 'acme_rules.missing'"
        ],
    )


def test_a_yaml_plugin_clashing_with_an_installed_one_is_reported_at_the_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = copy_policy(tmp_path)
    install(tmp_path / "site", "[stovepipe_fsm.plugins]\nacme = acme_rules\n", monkeypatch)
    (policy / "audit_rules.py").write_text(
        _module(
            "    @plugin.queue_gate.condition()\n"
            "    def acme_quiet_hours(ctx: PluginContext) -> bool:\n"
            "        return True\n"
        ),
        encoding="utf-8",
    )
    edit(policy / GATE_FILE, LISTED, "plugins:\n  - freeze_rules\n  - audit_rules\n")
    code, out = validate(policy, capsys, monkeypatch)
    line = line_of(policy / GATE_FILE, "- audit_rules")
    assert (code, out) == (
        1,
        [
            f"{GATE_FILE}:{line}:5: plugin 'audit_rules' registers condition "
            "'acme_quiet_hours' for machine 'queue_gate', which plugin 'acme-rules:acme' "
            "already registers; choose another name"
        ],
    )


# --- the reference: docstring and docs/machines.md -------------------------------------

DOC = ROOT / "docs" / "machines.md"


def test_every_plugin_rule_in_the_loader_docstring_has_a_case() -> None:
    documented = set(re.findall(r"^- ``(plugin-[a-z-]+)``", plugins_module.__doc__ or "", re.M))
    assert documented == {c.rule for c in CASES}


def plugin_rule_sections() -> dict[str, str]:
    """``### `plugin-...` `` sections of the lint reference, by rule."""
    text = DOC.read_text(encoding="utf-8")
    lint = text.split("## Lint rules", 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"^### `([a-z-]+)`$", lint, flags=re.M)
    return {
        rule: body
        for rule, body in zip(parts[1::2], parts[2::2], strict=True)
        if rule.startswith("plugin-")
    }


def test_every_plugin_rule_is_in_the_lint_reference() -> None:
    assert set(plugin_rule_sections()) == {c.rule for c in CASES}


def test_every_message_shown_for_a_plugin_rule_is_what_validate_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    printed = set()
    for i, case in enumerate(CASES):
        policy = broken_policy(tmp_path / str(i), case)
        printed |= set(validate(policy, capsys, monkeypatch)[1])
    site = tmp_path / "ep"
    entry_points = install(
        site, "[stovepipe_fsm.plugins]\nacme = acme_rules.missing\n", monkeypatch
    )
    _, lines = validate(copy_policy(tmp_path / "ep-policy"), capsys, monkeypatch)
    printed |= {line.replace(str(site), "site-packages") for line in lines}
    assert entry_points.is_file()
    sections = plugin_rule_sections()
    shown = [
        line
        for body in sections.values()
        for block in re.findall(r"```text\n(.*?)```", body, re.S)
        for line in block.splitlines()
    ]
    assert len(shown) >= len(sections)
    assert [line for line in shown if line not in printed] == []


def test_the_worked_example_in_the_docs_is_the_fixture_plugin() -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## Plugins", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(python|yaml)\n(.*?)```", section, re.S)
    python = [body for lang, body in blocks if lang == "python"]
    assert (FIXTURE / "freeze_rules.py").read_text(encoding="utf-8") in python
    gate = (FIXTURE / "machines" / "queue_gate.yaml").read_text(encoding="utf-8")
    yaml_blocks = [body for lang, body in blocks if lang == "yaml"]
    excerpts = [b for b in yaml_blocks if "in_freeze_window" in b]
    assert excerpts
    for excerpt in excerpts:  # every line shown is in the fixture machine, in order
        remaining = iter(gate.splitlines())
        for line in excerpt.splitlines():
            if line.strip() not in ("", "..."):
                assert line in remaining, f"{line!r} is not in the fixture, in this order"


def test_check_reports_what_a_failing_plugin_condition_raised_at_its_yaml_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = copy_policy(tmp_path)
    edit(
        policy / "freeze_rules.py",
        "        hour = ctx.now_ms() % DAY_MS // HOUR_MS\n        return hour in FREEZE_HOURS_UTC",
        '        raise RuntimeError("calendar service down")',
    )
    capsys.readouterr()
    args = ["--machines", str(policy / "machines"), "--out", str(tmp_path / "cx.yaml")]
    code = main(["check", *args, "--heads", "1", "--max-concurrent", "1", "--jobs", "1"])
    out = capsys.readouterr().out
    assert code == 0, out  # every delivery fails and is dead-lettered: no invariant breaks
    [line] = [ln for ln in out.splitlines() if ln.startswith("raised while exploring: ")]
    gate = policy / GATE_FILE
    step = f"{gate}:{line_of(gate, 'conditions: in_freeze_window')}:"
    assert line.startswith(f"raised while exploring: {step}")
    assert "condition 'in_freeze_window': RuntimeError: calendar service down" in line
    assert f"raised in plugin code at {policy / 'freeze_rules.py'}:" in line

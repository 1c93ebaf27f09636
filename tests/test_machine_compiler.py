"""The compiler: lifecycle steps with derived slot effects, and the flow driver.

The lifecycle tests run the tests' copy of ``request.yaml`` (``tests/fixtures``), so
they pin the slot rules the process stage relies on (admit takes a slot; every way into a
terminal state releases it). The flow tests use a tiny machine with sync and async
actions to pin the driver's contract: conditions see what earlier actions loaded,
actions run in the written order after the machine decided, a probe sees each action,
and a cycle hits the step budget.
"""

from __future__ import annotations

import asyncio
import traceback
from dataclasses import dataclass, field
from typing import Any

import pytest
from fixture_policy import MACHINES

from stovepipe_fsm.domain.errors import Retryable, StovepipeError, described
from stovepipe_fsm.located.yaml_source import parse_yaml
from stovepipe_fsm.machine import compiler as compiler_module
from stovepipe_fsm.machine.compiler import (
    CompiledFlow,
    CompiledLifecycle,
    FlowDidNotSettle,
    IllegalTransition,
    Step,
)
from stovepipe_fsm.machine.lint import lint_machine
from stovepipe_fsm.machine.loader import load_machine, parse_machine
from stovepipe_fsm.machine.model import MachineSpec
from stovepipe_fsm.machine.registry import Registry
from stovepipe_fsm.process.catalog import REGISTRIES, REQUEST
from stovepipe_fsm.simulation.broker import run_sync


def spec_of(text: str) -> MachineSpec:
    return parse_machine(parse_yaml(text, "m.yaml"))


@pytest.fixture(scope="module")
def request_machine() -> CompiledLifecycle:
    return CompiledLifecycle(load_machine(MACHINES / "request.yaml", REGISTRIES), REQUEST)


# --- lifecycle: the request machine (the tests' copy) ---------------------------------

# (source, trigger) -> (dest, takes_slot, releases_slot)
REQUEST_STEPS = {
    ("accepted", "admit"): ("processing", True, False),
    ("accepted", "supersede"): ("superseded", False, True),
    ("accepted", "fail_closed"): ("failed", False, True),
    ("processing", "succeed"): ("succeeded", False, True),
    ("processing", "fail"): ("failed", False, True),
    ("processing", "cancel"): ("cancelled", False, True),
    ("processing", "fail_closed"): ("failed", False, True),
}
STATES = ("accepted", "processing", "superseded", "succeeded", "failed", "cancelled")
TRIGGERS = ("admit", "supersede", "succeed", "fail", "cancel", "fail_closed")


@pytest.mark.parametrize(("source", "trigger"), sorted(REQUEST_STEPS))
def test_lifecycle_fire_returns_dest_and_derived_slot_effects(
    request_machine: CompiledLifecycle, source: str, trigger: str
) -> None:
    dest, takes, releases = REQUEST_STEPS[(source, trigger)]
    step = run_sync(request_machine.decide(source, trigger, object()))
    assert step == Step(
        trigger=trigger,
        source=source,
        dest=dest,
        actions=(),
        takes_slot=takes,
        releases_slot=releases,
    )


ILLEGAL = [(s, t) for s in STATES for t in TRIGGERS if (s, t) not in REQUEST_STEPS]


def test_the_grid_of_states_and_triggers_is_covered() -> None:
    assert len(ILLEGAL) + len(REQUEST_STEPS) == len(STATES) * len(TRIGGERS)
    assert len(ILLEGAL) == 29


@pytest.mark.parametrize(("state", "trigger"), ILLEGAL)
def test_every_other_trigger_is_illegal(
    request_machine: CompiledLifecycle, state: str, trigger: str
) -> None:
    with pytest.raises(IllegalTransition) as caught:
        run_sync(request_machine.decide(state, trigger, object()))
    assert f"trigger {trigger!r} is not allowed from state {state!r}" in str(caught.value)
    assert isinstance(caught.value, StovepipeError)


def test_refused_trigger_leaves_the_machine_usable(request_machine: CompiledLifecycle) -> None:
    with pytest.raises(IllegalTransition):
        run_sync(request_machine.decide("succeeded", "admit", object()))
    assert run_sync(request_machine.decide("accepted", "admit", object())).dest == "processing"


@pytest.mark.parametrize(
    ("state", "trigger", "fragment"),
    [
        ("accepted", "approve", "trigger 'approve' is not declared; declared triggers: admit,"),
        ("queued", "admit", "'queued' is not a state of this machine; declared states: accepted,"),
    ],
)
def test_undeclared_trigger_or_state_is_illegal_not_a_library_error(
    request_machine: CompiledLifecycle, state: str, trigger: str, fragment: str
) -> None:
    with pytest.raises(IllegalTransition) as caught:
        run_sync(request_machine.decide(state, trigger, object()))
    assert fragment in str(caught.value)


def test_lifecycle_queries_follow_the_declarations(request_machine: CompiledLifecycle) -> None:
    assert [s for s in STATES if request_machine.is_terminal(s)] == [
        "superseded",
        "succeeded",
        "failed",
        "cancelled",
    ]
    assert [s for s in STATES if request_machine.holds_slot(s)] == ["processing"]
    assert request_machine.dest_of("admit") == frozenset({"processing"})
    assert request_machine.dest_of("fail_closed") == frozenset({"failed"})


def test_one_machine_and_one_model_however_often_it_fires(
    request_machine: CompiledLifecycle,
) -> None:
    machine = request_machine.machine
    models_before = list(machine.models)
    assert len(models_before) == 1
    for i in range(1000):
        source, trigger = sorted(REQUEST_STEPS)[i % len(REQUEST_STEPS)]
        run_sync(request_machine.decide(source, trigger, object()))
    assert request_machine.machine is machine
    assert machine.models == models_before


def test_compiling_builds_exactly_one_transitions_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[object] = []
    real = compiler_module.Machine

    class CountingMachine(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(compiler_module, "Machine", CountingMachine)
    compiled = CompiledLifecycle(load_machine(MACHINES / "request.yaml", REGISTRIES), REQUEST)
    assert built == [compiled.machine]
    for _ in range(50):
        run_sync(compiled.decide("accepted", "admit", object()))
    assert len(built) == 1


def test_kind_mismatch_is_refused() -> None:
    request_spec = load_machine(MACHINES / "request.yaml", REGISTRIES)
    gate_spec = load_machine(MACHINES / "queue_gate.yaml", REGISTRIES)
    with pytest.raises(ValueError, match="not a flow"):
        CompiledFlow(request_spec, REQUEST)
    with pytest.raises(ValueError, match="not a lifecycle"):
        CompiledLifecycle(gate_spec, REGISTRIES["queue_gate"])


# --- lifecycle: conditions, actions and slot rules on a toy --------------------------

TOY = Registry("toy")


@TOY.condition()
def approved(ctx: Any) -> bool:
    """The context says so."""
    return bool(ctx["approved"])


@TOY.action()
def audit(ctx: Any) -> None:
    """Never called by fire(): fire only decides."""
    ctx["audited"] = True


@TOY.action()
def notify(ctx: Any) -> None:
    """Never called by fire()."""
    ctx["notified"] = True


TOY_LIFECYCLE = """\
name: toy
initial: idle
states:
  - idle
  - name: running
    holds_slot: true
  - name: boosted
    holds_slot: true
  - name: stopped
    terminal: true
transitions:
  - {trigger: start, source: idle, dest: running, conditions: approved,
     before: audit, after: notify}
  - {trigger: boost, source: running, dest: boosted}
  - {trigger: stop, source: [idle, running, boosted], dest: stopped}
"""


@pytest.fixture
def toy() -> CompiledLifecycle:
    spec = spec_of(TOY_LIFECYCLE)
    assert lint_machine(spec, {"toy": TOY}) == []
    return CompiledLifecycle(spec, TOY)


def test_fire_names_actions_in_order_without_running_them(toy: CompiledLifecycle) -> None:
    ctx = {"approved": True}
    step = run_sync(toy.decide("idle", "start", ctx))
    assert step.actions == ("audit", "notify")
    assert ctx == {"approved": True}


def test_false_condition_refuses_the_trigger(toy: CompiledLifecycle) -> None:
    with pytest.raises(IllegalTransition, match="had its conditions met"):
        run_sync(toy.decide("idle", "start", {"approved": False}))


def test_moving_between_slot_states_takes_no_second_slot(toy: CompiledLifecycle) -> None:
    step = run_sync(toy.decide("running", "boost", {}))
    assert (step.dest, step.takes_slot, step.releases_slot) == ("boosted", False, False)


@pytest.mark.parametrize("source", ["idle", "running", "boosted"])
def test_entering_a_terminal_state_releases_from_any_source(
    toy: CompiledLifecycle, source: str
) -> None:
    # Release is idempotent downstream, so it is requested even when none may be held
    # (an idle request can hold one after a crash between claim and mark).
    step = run_sync(toy.decide(source, "stop", {}))
    assert (step.dest, step.takes_slot, step.releases_slot) == ("stopped", False, True)


# --- flow driver ---------------------------------------------------------------------


@dataclass
class Ctx:
    """What a flow's conditions read and its actions fill in."""

    available: bool
    ready: bool = False
    log: list[str] = field(default_factory=list)
    explode: bool = False


FLOW = Registry("toy_flow")


@FLOW.condition()
def ready(ctx: Ctx) -> bool:
    """Set by the async 'load' action: decisions see what earlier actions loaded."""
    return ctx.ready


@FLOW.action()
def prepare(ctx: Ctx) -> None:
    """Sync, in 'before'."""
    ctx.log.append("prepare")


@FLOW.action()
async def load(ctx: Ctx) -> None:
    """Async: yields to the loop before it records, like real I/O."""
    await asyncio.sleep(0)
    ctx.ready = ctx.available
    ctx.log.append("load")


@FLOW.action()
def note(ctx: Ctx) -> None:
    """Sync, after an async one."""
    ctx.log.append("note")


@FLOW.action()
async def publish(ctx: Ctx) -> None:
    """Async; may fail."""
    await asyncio.sleep(0)
    if ctx.explode:
        raise RuntimeError("broker down")
    ctx.log.append("publish")


@FLOW.action(finishes=True)
def finish(ctx: Ctx) -> None:
    """Sync finisher."""
    ctx.log.append("finish")


@FLOW.action(finishes=True)
async def park(ctx: Ctx) -> None:
    """Async finisher."""
    await asyncio.sleep(0)
    ctx.log.append("park")


TOY_FLOW = """\
name: toy_flow
kind: flow
initial: start
states:
  - start
  - fetched
  - name: done
    terminal: true
  - name: parked
    terminal: true
transitions:
  - {trigger: fetch, source: start, dest: fetched, before: prepare, after: [load, note]}
  - {trigger: decide, source: fetched, dest: done, conditions: ready,
     after: [publish, finish]}
  - {trigger: decide, source: fetched, dest: parked, unless: ready, after: park}
"""


@pytest.fixture
def flow() -> CompiledFlow:
    spec = spec_of(TOY_FLOW)
    assert lint_machine(spec, {"toy_flow": FLOW}) == []
    return CompiledFlow(spec, FLOW)


async def test_flow_runs_sync_and_async_actions_in_order(flow: CompiledFlow) -> None:
    ctx = Ctx(available=True)
    seen: list[str] = []
    assert await flow.run(ctx, probe=seen.append) == "done"
    assert ctx.log == ["prepare", "load", "note", "publish", "finish"]
    assert seen == ctx.log  # the probe sees each action, after it ran


async def test_flow_branches_on_what_an_earlier_action_loaded(flow: CompiledFlow) -> None:
    ctx = Ctx(available=False)
    seen: list[str] = []
    assert await flow.run(ctx, probe=seen.append) == "parked"
    assert seen == ["prepare", "load", "note", "park"]


async def test_probe_is_called_after_each_action_not_before(flow: CompiledFlow) -> None:
    ctx = Ctx(available=True)
    snapshots: list[tuple[str, int]] = []
    await flow.run(ctx, probe=lambda name: snapshots.append((name, len(ctx.log))))
    assert snapshots == [("prepare", 1), ("load", 2), ("note", 3), ("publish", 4), ("finish", 5)]


@pytest.mark.parametrize(
    ("available", "dest", "guard"), [(True, "done", "conditions"), (False, "parked", "unless")]
)
async def test_a_finished_cursor_names_the_transition_that_settled_it(
    flow: CompiledFlow, available: bool, dest: str, guard: str
) -> None:
    """What the simulated world reads a hold reason from: the declaration, located."""
    start = flow.start()
    assert start.via is None
    paused = await flow.advance(Ctx(available=available), start, pause_after="load")
    assert paused.via is not None and paused.via.dest == "fetched"  # where it stopped
    cursor = await flow.advance(Ctx(available=available), start)
    assert cursor.finished and cursor.via is not None
    assert (cursor.via.source, cursor.via.dest) == ("fetched", dest)
    transition = cursor.via.transition
    assert transition is not None
    assert [ref.name for ref in getattr(transition, guard)] == ["ready"]
    lines = TOY_FLOW.splitlines()
    declared = next(n for n, line in enumerate(lines, 1) if f"dest: {dest}" in line)
    assert transition.location.line == declared


async def test_failing_action_stops_the_flow_and_propagates(flow: CompiledFlow) -> None:
    ctx = Ctx(available=True, explode=True)
    seen: list[str] = []
    with pytest.raises(RuntimeError, match="broker down"):
        await flow.run(ctx, probe=seen.append)
    assert seen == ["prepare", "load", "note"]  # never the finisher
    # The machine itself is unharmed: the next delivery runs normally.
    assert await flow.run(Ctx(available=True)) == "done"


def frames_of(exc: BaseException) -> list[tuple[str, int, str]]:
    return [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(exc.__traceback__)]


async def test_a_failing_action_names_its_yaml_step_first(flow: CompiledFlow) -> None:
    with pytest.raises(RuntimeError, match="broker down") as caught:
        await flow.run(Ctx(available=True, explode=True))
    line = next(n for n, text in enumerate(TOY_FLOW.splitlines(), 1) if "publish" in text)
    column = TOY_FLOW.splitlines()[line - 1].index("publish") + 1
    where = (
        f"m.yaml:{line}:{column}: in machine 'toy_flow', state 'fetched', "
        "trigger 'decide', action 'publish'"
    )
    assert caught.value.__notes__ == [f"declared at {where}"]
    assert described(caught.value) == f"{where}: RuntimeError: broker down"
    # The frame right above the action's own is labelled with the YAML step.
    frames = frames_of(caught.value)
    assert frames[-1][2] == "publish"
    assert frames[-2] == ("m.yaml", line, "action publish")


class Unready:
    """A context whose ``ready`` answer fails, as a plugin condition might."""

    def __init__(self) -> None:
        self.available, self.explode, self.log = True, False, list[str]()

    @property
    def ready(self) -> bool:
        raise KeyError("ready")

    @ready.setter
    def ready(self, value: bool) -> None:
        """What ``load`` fills in is not what the condition reads here."""


async def test_a_failing_condition_names_its_yaml_step_first(flow: CompiledFlow) -> None:
    with pytest.raises(KeyError) as caught:
        await flow.run(Unready())
    lines = TOY_FLOW.splitlines()
    line = next(n for n, text in enumerate(lines, 1) if "conditions: ready" in text)
    column = lines[line - 1].index("ready") + 1
    where = (
        f"m.yaml:{line}:{column}: in machine 'toy_flow', state 'fetched', "
        "trigger 'decide', condition 'ready'"
    )
    assert described(caught.value) == f"{where}: KeyError: 'ready'"
    frames = frames_of(caught.value)
    assert [name for _file, _line, name in frames[-2:]] == ["ready", "ready"]  # fn, property
    assert frames[-3] == ("m.yaml", line, "condition ready")
    # The machine is unharmed: the next delivery decides normally.
    assert await flow.run(Ctx(available=True)) == "done"


SPIN = Registry("spin")


@SPIN.condition()
def busy(ctx: Any) -> bool:
    """The context says whether to go round again."""
    return bool(ctx["busy"])


@SPIN.action()
def tick(ctx: Any) -> None:
    """Counts steps."""
    ctx["ticks"] += 1


@SPIN.action(finishes=True)
def settle(ctx: Any) -> None:
    """Ends the flow."""
    ctx["settled"] = True


SPIN_FLOW = """\
name: spin
kind: flow
initial: claim
states:
  - claim
  - check
  - name: out
    terminal: true
transitions:
  - {trigger: go, source: claim, dest: check, after: tick}
  - {trigger: go, source: check, dest: claim, conditions: busy, after: tick}
  - {trigger: go, source: check, dest: out, unless: busy, after: [tick, settle]}
"""


def spin(max_steps: int) -> CompiledFlow:
    spec = spec_of(SPIN_FLOW)
    assert lint_machine(spec, {"spin": SPIN}) == []
    return CompiledFlow(spec, SPIN, max_steps=max_steps)


async def test_step_budget_stops_a_cycle() -> None:
    ctx = {"busy": True, "ticks": 0}
    with pytest.raises(FlowDidNotSettle) as caught:
        await spin(max_steps=7).run(ctx)
    assert ctx["ticks"] == 7
    assert "no terminal state after 7 steps" in str(caught.value)
    assert isinstance(caught.value, Retryable)  # redelivery may find the contention gone


async def test_a_flow_that_needs_exactly_the_budget_settles() -> None:
    ctx = {"busy": False, "ticks": 0}
    assert await spin(max_steps=2).run(ctx) == "out"
    assert ctx == {"busy": False, "ticks": 2, "settled": True}
    with pytest.raises(FlowDidNotSettle):
        await spin(max_steps=1).run({"busy": False, "ticks": 0})


async def test_default_budget_is_generous_but_finite() -> None:
    compiled = CompiledFlow(spec_of(SPIN_FLOW), SPIN)
    ctx = {"busy": True, "ticks": 0}
    with pytest.raises(FlowDidNotSettle):
        await compiled.run(ctx)
    assert ctx["ticks"] == compiled.max_steps >= 16


async def test_flow_with_a_dead_end_fails_clearly_when_lint_is_bypassed() -> None:
    text = SPIN_FLOW.replace("  - check\n", "  - check\n  - stuck\n").replace(
        "dest: check, after: tick}", "dest: stuck, after: tick}"
    )
    spec = spec_of(text)
    assert {i.rule for i in lint_machine(spec, {"spin": SPIN})} >= {"dead-end"}
    with pytest.raises(IllegalTransition, match="'stuck' has no single trigger"):
        await CompiledFlow(spec, SPIN).run({"busy": False, "ticks": 0})


async def test_gate_flow_compiles_with_one_trigger_per_open_state() -> None:
    spec = load_machine(MACHINES / "queue_gate.yaml", REGISTRIES)
    compiled = CompiledFlow(spec, REGISTRIES["queue_gate"])
    assert set(compiled.trigger_for) == set(spec.state_names) - spec.terminal_states
    assert compiled.trigger_for["received"] == "load"
    assert compiled.trigger_for["slot_claimed"] == "admit"


# --- registration -----------------------------------------------------------------------


class AsyncPredicate:
    """A callable object whose ``__call__`` is a coroutine function."""

    async def __call__(self, ctx: Any) -> bool:
        return False


async def admitted(ctx: Any) -> bool:
    """Never awaited as a condition: the machine would see a (truthy) coroutine object."""
    return False


@pytest.mark.parametrize(
    ("fn", "name"), [(admitted, None), (admitted, "is_admitted"), (AsyncPredicate(), "gate")]
)
def test_a_coroutine_condition_is_refused_at_registration(fn: Any, name: str | None) -> None:
    registry = Registry("toy")
    with pytest.raises(ValueError) as caught:
        registry.condition(name)(fn)
    key = name or "admitted"
    assert str(caught.value) == (
        f"toy: condition {key!r} is a coroutine function; conditions must be synchronous "
        "predicates (load what a condition reads in an action that runs before it)"
    )
    assert registry.conditions == {}


async def test_sync_conditions_and_async_actions_still_register() -> None:
    registry = Registry("toy")
    registry.condition("ready")(lambda ctx: True)
    registry.action("fetch")(admitted)
    assert set(registry.conditions) == {"ready"}
    assert set(registry.actions) == {"fetch"}
    assert await registry.actions["fetch"].fn(None) is False

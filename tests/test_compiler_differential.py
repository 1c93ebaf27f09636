"""The compiled machine decides exactly as a stock ``transitions.Machine`` does.

A compiled machine is a ``transitions.Machine`` whose conditions are the registered
predicates (each asked at most once per fire) and whose one ``after`` callback records
the transition that won; the driver runs the winner's actions afterwards. Each test here
builds, from one spec, both the compiled machine and a stock ``Machine`` whose conditions
are the registered predicates and whose ``before``/``after`` callbacks are the registered
actions, and holds the compiled one, through the very methods production calls
(``_fire``, ``run``, ``advance``), to the stock one: the same transition (destination,
and the same actions in the same order) or the same refusal (the trigger is not allowed
from the state; no transition had its conditions met).

- The shipped machines are enumerated: every state x every trigger x every answer of
  every condition the machine names, on one compiled instance (so an answer kept from one
  fire into the next would show).
- Generated machines cover shapes the shipped ones lack: several sources per transition,
  sibling transitions repeating and negating each other's guards, repeated conditions and
  actions, actions on both sides, transitions out of terminal states.
- Whole flows are driven both ways, ``run`` and ``advance`` with a pause, against a driver
  that fires the stock machine, with condition answers that change as actions run.
- A delivery through the process controller and a request write through the lifecycle
  are shown to be fires of the library's machine, step for step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memory_stages import memory_stages
from transitions import Machine, MachineError
from transitions.core import Event

from stovepipe_fsm.adapters.memory import (
    MemoryDelivery,
    MemorySourceControl,
    MemorySourceControlProvider,
)
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.domain.entities import QueueConfig
from stovepipe_fsm.located.errors import Location
from stovepipe_fsm.machine.compiler import (
    CompiledFlow,
    CompiledLifecycle,
    FlowDidNotSettle,
    IllegalTransition,
    _Compiled,
)
from stovepipe_fsm.machine.loader import load_machine
from stovepipe_fsm.machine.model import FLOW, LIFECYCLE, MachineSpec, NameRef, StateSpec
from stovepipe_fsm.machine.model import TransitionSpec as TSpec
from stovepipe_fsm.machine.registry import Registry
from stovepipe_fsm.process.catalog import REGISTRIES, load_process_machines

ROOT = Path(__file__).resolve().parents[1]
MACHINES = ROOT / "machines"
HERE = Location("<generated>", 1, 1)

# What one fire did, the same shape from both machines:
#   ("fired", dest, actions run in order) | ("not allowed",) | ("conditions unmet",)
# and what one flow did: (how it ended, the state it ended in, actions run in order).
Outcome = tuple[Any, ...]


@dataclass
class Ctx:
    """What the conditions read and the actions write: fixed answers, or answers that
    change with every action that runs (``bits``/``offsets``), and the actions' log."""

    answers: dict[str, bool] = field(default_factory=dict)
    bits: tuple[bool, ...] = ()
    offsets: dict[str, int] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def answer(self, condition: str) -> bool:
        if self.bits:
            return self.bits[(self.offsets[condition] + len(self.log)) % len(self.bits)]
        return self.answers[condition]


def recording_registry(machine: str, conditions: set[str], actions: set[str]) -> Registry:
    """Plain callbacks under the spec's names: predicates that read the context's answers,
    actions that log their own name."""
    registry = Registry(machine)
    for name in sorted(conditions):
        registry.condition(name)(_predicate(name))
    for name in sorted(actions):
        registry.action(name)(_logger(name))
    return registry


def _predicate(name: str) -> Callable[[Ctx], bool]:
    def predicate(ctx: Ctx) -> bool:
        return ctx.answer(name)

    return predicate


#: More actions than any flow here runs within its step budget: a driver that loses
#: count of its steps fails here instead of looping for ever.
RUNAWAY = 10_000


def _logger(name: str) -> Callable[[Ctx], None]:
    def action(ctx: Ctx) -> None:
        if len(ctx.log) >= RUNAWAY:
            raise AssertionError(f"{RUNAWAY} actions run: the driver ignores its step budget")
        ctx.log.append(name)

    return action


def names_in(spec: MachineSpec) -> tuple[set[str], set[str]]:
    """The condition and action names a spec refers to."""
    conditions = {c.name for t in spec.transitions for c in (*t.conditions, *t.unless)}
    actions = {a.name for t in spec.transitions for a in t.actions}
    return conditions, actions


class StockModel:
    """The model of the stock machine; the machine adds ``state`` and its methods."""

    state: str


def stock_machine(spec: MachineSpec, registry: Registry) -> tuple[Machine, StockModel]:
    """A stock ``transitions.Machine`` from the spec, with the registry's callables."""
    model = StockModel()
    machine = Machine(
        model=model,
        states=list(spec.state_names),
        initial=spec.initial.name,
        transitions=[
            {
                "trigger": t.trigger,
                "source": list(t.source_names),
                "dest": t.dest.name,
                "conditions": [registry.conditions[c.name].fn for c in t.conditions],
                "unless": [registry.conditions[u.name].fn for u in t.unless],
                "before": [registry.actions[a.name].fn for a in t.before],
                "after": [registry.actions[a.name].fn for a in t.after],
            }
            for t in spec.transitions
        ],
        auto_transitions=False,
        send_event=False,
        ignore_invalid_triggers=False,
    )
    return machine, model


def stock_fire(machine: Machine, model: StockModel, state: str, trigger: str, ctx: Ctx) -> Outcome:
    machine.set_state(state, model)
    ctx.log.clear()
    try:
        fired = machine.events[trigger].trigger(model, ctx)
    except MachineError:
        return ("not allowed",)
    if not fired:
        assert model.state == state
        return ("conditions unmet",)
    return ("fired", model.state, tuple(ctx.log))


def compiled_fire(compiled: _Compiled, state: str, trigger: str, ctx: Ctx) -> Outcome:
    """Fire the compiled machine, then run the actions it picked, as the driver does."""
    ctx.log.clear()
    try:
        step, calls = compiled._fire(state, trigger, ctx)
    except IllegalTransition as refused:
        if f"trigger {trigger!r} is not allowed from state {state!r}" in str(refused):
            return ("not allowed",)
        assert "had its conditions met" in str(refused), refused
        return ("conditions unmet",)
    assert (step.trigger, step.source) == (trigger, state)
    assert step.actions == tuple(call.name for call in calls)
    for call in calls:
        assert not call.is_async
        call.call(ctx)
    assert ctx.log == list(step.actions)
    return ("fired", step.dest, tuple(ctx.log))


def answer_grid(conditions: set[str]) -> Iterator[dict[str, bool]]:
    """Every combination of answers of ``conditions``."""
    names = sorted(conditions)
    for answers in itertools.product((False, True), repeat=len(names)):
        yield dict(zip(names, answers, strict=True))


@dataclass
class Comparison:
    """What the two machines did on every (state, trigger, answers) of a spec."""

    cases: int = 0
    mismatches: list[str] = field(default_factory=list)
    kinds: set[str] = field(default_factory=set)
    picked: set[tuple[str, str, tuple[str, ...]]] = field(default_factory=set)


def compare_everywhere(spec: MachineSpec, compiled: _Compiled, registry: Registry) -> Comparison:
    """Fire both machines on every state x trigger x answers of the spec's conditions."""
    machine, model = stock_machine(spec, registry)
    conditions, _ = names_in(spec)
    seen = Comparison()
    for state, trigger in itertools.product(spec.state_names, spec.triggers):
        for answers in answer_grid(conditions):
            seen.cases += 1
            ours = compiled_fire(compiled, state, trigger, Ctx(answers))
            stock = stock_fire(machine, model, state, trigger, Ctx(answers))
            if ours != stock:
                seen.mismatches.append(
                    f"{state} --{trigger}--> {answers}: ours {ours}, stock {stock}"
                )
            seen.kinds.add(ours[0])
            if ours[0] == "fired":
                seen.picked.add((state, ours[1], ours[2]))
    return seen


def compile_spec(spec: MachineSpec, registry: Registry) -> _Compiled:
    if spec.kind == FLOW:
        return CompiledFlow(spec, registry)
    return CompiledLifecycle(spec, registry)


# --- the shipped machines, enumerated ------------------------------------------------


@pytest.mark.parametrize("file", ["request.yaml", "queue_gate.yaml"])
def test_shipped_machine_decides_like_stock_transitions_everywhere(file: str) -> None:
    spec = load_machine(MACHINES / file, REGISTRIES)
    conditions, actions = names_in(spec)
    registry = recording_registry(spec.name, conditions, actions)
    seen = compare_everywhere(spec, compile_spec(spec, registry), registry)

    assert seen.mismatches == [], "\n".join(seen.mismatches[:20])
    assert seen.cases == len(spec.state_names) * len(spec.triggers) * 2 ** len(conditions)
    # Every (source, transition) pair of the file was picked under some answers.
    assert seen.picked == {
        (source, t.dest.name, tuple(a.name for a in t.actions))
        for t in spec.transitions
        for source in t.source_names
    }
    # The shipped guards are exhaustive (lint), so neither file can leave a trigger with
    # no transition; that refusal is compared on the generated machines below.
    assert seen.kinds >= {"fired", "not allowed"}


# --- generated machines ----------------------------------------------------------------

CONDITIONS = ("c0", "c1", "c2", "c3")
ACTIONS = ("a0", "a1", "a2", "a3", "a4")


def ref(name: str) -> NameRef:
    return NameRef(name, HERE)


def refs(names: list[str]) -> tuple[NameRef, ...]:
    return tuple(ref(n) for n in names)


@st.composite
def machine_specs(draw: st.DrawFn) -> MachineSpec:
    """A random machine: any states may be terminal or hold a slot, transitions take one
    to three sources (or every state), guards and actions may repeat."""
    n = draw(st.integers(2, 6))
    states = tuple(
        StateSpec(
            f"s{i}",
            HERE,
            terminal=i > 0 and draw(st.booleans()),
            holds_slot=draw(st.booleans()),
        )
        for i in range(n)
    )
    names = [s.name for s in states]
    guards = st.lists(st.sampled_from(CONDITIONS), max_size=3)
    actions = st.lists(st.sampled_from(ACTIONS), max_size=3)
    transitions = []
    for index in range(draw(st.integers(1, 10))):
        wildcard = draw(st.integers(0, 9)) == 0
        sources = (
            names
            if wildcard
            else draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
        )
        transitions.append(
            TSpec(
                index=index,
                trigger=f"t{draw(st.integers(0, 3))}",
                sources=refs(sources),
                dest=ref(draw(st.sampled_from(names))),
                location=HERE,
                conditions=refs(draw(guards)),
                unless=refs(draw(guards)),
                before=refs(draw(actions)),
                after=refs(draw(actions)),
                wildcard_source=wildcard,
            )
        )
    return MachineSpec(
        name="generated",
        kind=LIFECYCLE,
        initial=ref("s0"),
        states=states,
        transitions=tuple(transitions),
        file="<generated>",
    )


@st.composite
def flow_specs(draw: st.DrawFn) -> MachineSpec:
    """A random flow: mostly one trigger out of each open state, its transitions shared
    with other states leaving by the same trigger, guarded by answers the actions change;
    now and then a dead end or a state with two triggers (the driver refuses both)."""
    n = draw(st.integers(2, 6))
    terminal = [False, *(draw(st.booleans()) for _ in range(n - 1))]
    terminal[-1] = terminal[-1] or not any(terminal)
    states = tuple(StateSpec(f"s{i}", HERE, terminal=terminal[i]) for i in range(n))
    names = [s.name for s in states]
    open_states = [s.name for s in states if not s.terminal]
    way_out = {s: draw(st.sampled_from(("t0", "t1", "t2"))) for s in open_states}
    guards = st.lists(st.sampled_from(CONDITIONS), max_size=1)
    actions = st.lists(st.sampled_from(ACTIONS), min_size=1, max_size=3)
    drafts = []
    for state in open_states:
        trigger = way_out[state]
        alike = [s for s in open_states if s != state and way_out[s] == trigger]
        for _ in range(draw(st.sampled_from((1, 2, 2, 3, 3, 3, 0)))):
            also = draw(st.lists(st.sampled_from(alike), max_size=2, unique=True)) if alike else []
            drafts.append((trigger, [state, *also]))
    if draw(st.integers(0, 9)) == 0:  # a second trigger out of one state
        drafts.append((draw(st.sampled_from(("t3", "t4"))), [draw(st.sampled_from(names))]))
    drafts = draw(st.permutations(drafts))
    transitions = tuple(
        TSpec(
            index=index,
            trigger=trigger,
            sources=refs(sources),
            dest=ref(draw(st.sampled_from(names))),
            location=HERE,
            conditions=refs(draw(guards)),
            unless=refs(draw(guards)),
            before=refs(draw(st.lists(st.sampled_from(ACTIONS), max_size=1))),
            after=refs(draw(actions)),
        )
        for index, (trigger, sources) in enumerate(drafts)
    )
    return MachineSpec(
        name="generated",
        kind=FLOW,
        initial=ref("s0"),
        states=states,
        transitions=transitions,
        file="<generated>",
    )


def full_registry(spec: MachineSpec) -> Registry:
    return recording_registry(spec.name, set(CONDITIONS), set(ACTIONS))


def test_every_kind_of_outcome_is_compared() -> None:
    # One guarded transition: fired, refused for its conditions, refused for its source.
    spec = MachineSpec(
        name="generated",
        kind=LIFECYCLE,
        initial=ref("s0"),
        states=(StateSpec("s0", HERE), StateSpec("s1", HERE, terminal=True)),
        transitions=(
            TSpec(
                0,
                "t0",
                refs(["s0"]),
                ref("s1"),
                HERE,
                conditions=refs(["c0"]),
                after=refs(["a0", "a1"]),
            ),
        ),
        file="<generated>",
    )
    registry = full_registry(spec)
    seen = compare_everywhere(spec, compile_spec(spec, registry), registry)
    assert seen.mismatches == []
    assert seen.kinds == {"fired", "not allowed", "conditions unmet"}
    assert seen.picked == {("s0", "s1", ("a0", "a1"))}


@settings(max_examples=200, deadline=None)
@given(machine_specs())
def test_generated_machine_decides_like_stock_transitions(spec: MachineSpec) -> None:
    registry = full_registry(spec)
    seen = compare_everywhere(spec, compile_spec(spec, registry), registry)
    assert seen.mismatches == [], "\n".join(seen.mismatches[:20])


# --- whole flows: run and advance against a driver of the stock machine ---------------


def stock_drive(spec: MachineSpec, registry: Registry, ctx: Ctx, max_steps: int) -> Outcome:
    """The flow driver's contract, deciding with the stock machine: fire the one trigger
    leaving each open state until a terminal state, within ``max_steps`` fires."""
    machine, model = stock_machine(spec, registry)
    state, steps = spec.initial.name, 0
    while state not in spec.terminal_states:
        if steps >= max_steps:
            return ("did not settle", state, tuple(ctx.log))
        triggers = {t.trigger for t in spec.outgoing(state)}
        if len(triggers) != 1:
            return ("no way out", state, tuple(ctx.log))
        machine.set_state(state, model)
        if not machine.events[triggers.pop()].trigger(model, ctx):
            return ("conditions unmet", state, tuple(ctx.log))
        state, steps = model.state, steps + 1
    return ("settled", state, tuple(ctx.log))


def finished(coro: Coroutine[Any, Any, Any]) -> Any:
    """Drive a coroutine that never suspends (every action here is synchronous)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the flow suspended")


def drive(flow: CompiledFlow, ctx: Ctx, pause_after: str) -> Outcome:
    """``run`` when ``pause_after`` is empty; else ``advance`` paused once, then resumed."""
    try:
        if not pause_after:
            state = finished(flow.run(ctx))
        else:
            cursor = finished(flow.advance(ctx, flow.start(), pause_after=pause_after))
            state = cursor.state
            if not cursor.finished:
                assert ctx.log[-1] == pause_after
                cursor = finished(flow.advance(ctx, cursor))
                state = cursor.state
            assert cursor.finished
    except FlowDidNotSettle as exc:
        return ("did not settle", str(exc).rsplit("(last ", 1)[1][1:-2], tuple(ctx.log))
    except IllegalTransition as exc:
        text = str(exc)
        where = text.split("state ", 1)[1].split("'")[1]
        kind = "no way out" if "no single trigger" in text else "conditions unmet"
        return (kind, where, tuple(ctx.log))
    return ("settled", state, tuple(ctx.log))


def flow_runs_alike(
    spec: MachineSpec, registry: Registry, bits: list[bool], offsets: list[int], pause: str
) -> None:
    max_steps = 12
    conditions = sorted(registry.conditions)

    def fresh() -> Ctx:
        return Ctx(bits=tuple(bits), offsets=dict(zip(conditions, offsets, strict=False)))

    stock = stock_drive(spec, registry, fresh(), max_steps)
    flow = CompiledFlow(spec, registry, max_steps=max_steps)
    assert drive(flow, fresh(), "") == stock
    assert drive(flow, fresh(), pause) == stock


answer_bits = st.lists(st.booleans(), min_size=1, max_size=8)
answer_offsets = st.lists(st.integers(0, 7), min_size=12, max_size=12)  # one per condition


@settings(max_examples=200, deadline=None)
@given(
    flow_specs(),
    answer_bits,
    answer_offsets,
    st.sampled_from(("", *ACTIONS)),
)
def test_generated_flow_runs_like_a_stock_driver(
    spec: MachineSpec, bits: list[bool], offsets: list[int], pause: str
) -> None:
    flow_runs_alike(spec, full_registry(spec), bits, offsets, pause)


GATE_SPEC = load_machine(MACHINES / "queue_gate.yaml", REGISTRIES)
GATE_CONDITIONS, GATE_ACTIONS = names_in(GATE_SPEC)


@settings(max_examples=200, deadline=None)
@given(answer_bits, answer_offsets, st.sampled_from(("", *sorted(GATE_ACTIONS))))
def test_shipped_flow_runs_like_a_stock_driver(
    bits: list[bool], offsets: list[int], pause: str
) -> None:
    registry = recording_registry(GATE_SPEC.name, GATE_CONDITIONS, GATE_ACTIONS)
    flow_runs_alike(GATE_SPEC, registry, bits, offsets, pause)


# --- production decisions are fires of the library's machine ---------------------------


@dataclass
class Fired:
    machine: Machine
    trigger: str
    source: str
    dest: str
    result: bool


@pytest.fixture
def fires(monkeypatch: pytest.MonkeyPatch) -> list[Fired]:
    """Every ``transitions`` event fired while the test runs, as the library saw it."""
    seen: list[Fired] = []
    real = Event.trigger

    def trigger(self: Event, model: Any, *args: Any, **kwargs: Any) -> bool:
        source = model.state
        result = real(self, model, *args, **kwargs)
        seen.append(Fired(self.machine, self.name, source, model.state, result))
        return result

    monkeypatch.setattr(Event, "trigger", trigger)
    return seen


async def test_a_delivery_is_decided_by_firing_the_machines(fires: list[Fired]) -> None:
    machines = load_process_machines(MACHINES)
    stages = memory_stages(
        machines,
        source_control=MemorySourceControlProvider(default=MemorySourceControl({"A": []})),
        config=StaticConfigStore(QueueConfig.of(max_concurrent=1, gate_wait_delay_ms=1000)),
    )
    queue = "monorepo/main"
    requests = stages.services.requests
    await stages.ingest.ingest(queue, "A")
    request = await requests.get(f"request/{queue}/1")
    fires.clear()  # what ingest fired is not the delivery's
    decision = await stages.controller.decide(MemoryDelivery(queue, request.id))

    assert decision.outcome == "acked"
    gate = [f for f in fires if f.machine is machines.queue_gate.machine]
    lifecycle = [f for f in fires if f.machine is machines.request.machine]
    assert len(gate) + len(lifecycle) == len(fires)
    # The flow's every step is a fire that moved the library's cursor, from the initial
    # state along the transitions taken to the terminal state the decision names.
    assert gate and all(f.result for f in gate)
    assert gate[0].source == machines.queue_gate.spec.initial.name
    assert [f.source for f in gate[1:]] == [f.dest for f in gate[:-1]]
    assert decision.via is not None
    assert (gate[-1].trigger, gate[-1].source, gate[-1].dest) == (
        decision.via.trigger,
        decision.via.source,
        decision.via.dest,
    )
    # The request's admission was the lifecycle machine's own fire.
    assert [(f.source, f.dest) for f in lifecycle if f.result] == [("accepted", "processing")]
    assert (await requests.get(request.id)).state == "processing"

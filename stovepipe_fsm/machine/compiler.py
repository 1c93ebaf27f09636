"""Compile a validated :class:`MachineSpec` into a ``transitions`` machine, and drive it.

Theory of operation
-------------------
Each spec compiles into one ``transitions.Machine`` built from the library's own
classes, with one cursor model attached for the life of the process. Every decision is
a fire of that machine: the cursor is set to the entity's state
(``Machine.set_state``) and ``model.trigger(name, ctx)`` offers the context to the
trigger's transitions from that state, in declaration order; the first whose
conditions all hold moves the cursor, and its one ``after`` callback records which
transition won. Nothing else happens inside the machine: its callbacks do no I/O and
never await, so a fire is atomic and one cursor serves every caller of an event loop.
The driver then awaits the winner's actions, in order, outside the machine: the
machine decides, the driver does the I/O (the sans-I/O core). ``AsyncMachine`` is not
used because its transitions are not atomic: an await inside a callback lets another
coroutine observe a half-made transition.

Two shapes:

- :class:`CompiledLifecycle` (``kind: lifecycle``): ``fire(state, trigger, ctx)``
  answers the destination and the slot effects derived from the
  ``holds_slot``/``terminal`` declarations.
- :class:`CompiledFlow` (``kind: flow``): ``advance(ctx, cursor)`` drives one delivery
  from a :class:`FlowCursor` to a terminal state, firing the single trigger that leaves
  each open state, and can stop right after a named action, so a delivery can be held
  half-done while other deliveries run (``check`` explores overlapping deliveries that
  way). ``run`` and ``settle`` are ``advance`` from the start.

Conditions are asked at most once per fire (sibling transitions repeat one guard as
``conditions`` and ``unless``; within a fire nothing can change its answer). A
condition or an action that raises is called through a frame labelled with the YAML
file and line of the transition it belongs to (:func:`_located`), and the exception
carries a note naming that location, the machine, state, trigger and step, so a
traceback and a settle reason point at the YAML first.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from types import FunctionType
from typing import Any, TypeAlias, TypeVar, cast

from transitions import Machine, MachineError
from transitions.core import EventData

from ..domain.errors import STEP_NOTE, Retryable, StovepipeError
from ..located.errors import Location
from .model import FLOW_KINDS, LIFECYCLE, MachineSpec, TransitionSpec
from .plugin_calls import StepWatch, Worker, contained, contained_async, within_budget
from .registry import Registry
from .roles import leads_to

T = TypeVar("T")

#: Called with each action's name after it ran (``check`` and the tests observe with it).
Probe = Callable[[str], None]


class IllegalTransition(StovepipeError):
    """A trigger that the machine does not allow from the entity's current state."""


class _Cursor:
    """A model attached to a compiled machine: its ``state``, and what the fire in
    progress on it picked and which condition answers it computed."""

    state: str

    def __init__(self) -> None:
        self.answers: dict[str, bool] = {}
        self.picked: list[Picked] = []


@dataclass(frozen=True)
class Step:
    """The outcome of firing one trigger.

    ``transition`` is the declaration the machine picked (its conditions, description and
    location), so a caller can say *why* a delivery ended where it did; it takes no part
    in comparisons, which are about what the step does.
    """

    trigger: str
    source: str
    dest: str
    actions: tuple[str, ...]
    takes_slot: bool
    releases_slot: bool
    transition: TransitionSpec | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ActionCall:
    """One action of a transition, resolved at compile time: its name, and the callable
    that runs it through a frame labelled with where the YAML names it; ``plugin`` with
    the YAML step (``where``) when a plugin registered it."""

    name: str
    call: Callable[[Any], Any]
    is_async: bool
    plugin: bool = False
    where: str = ""


#: What one fire decides: the step, and the actions it runs.
Picked: TypeAlias = tuple[Step, tuple[ActionCall, ...]]


def _sync_step(fn: Callable[[Any], Any], ctx: Any) -> Any:
    return fn(ctx)


async def _async_step(fn: Callable[[Any], Coroutine[Any, Any, Any]], ctx: Any) -> Any:
    return await fn(ctx)


def _located(template: Callable[..., Any], where: Location, label: str) -> Callable[..., Any]:
    """``template`` as a function whose frame reads ``where`` (file, line) and ``label``.

    A traceback through it shows ``File "machines/queue_gate.yaml", line 42, in
    <label>`` (with the YAML line itself when the file is readable) right above the
    plugin's own frame. Only the code object's file name, first line and name change;
    its instructions are the template's.
    """
    code = template.__code__
    lines = [line for _start, _end, line in code.co_lines() if line is not None]
    first = max(code.co_firstlineno + where.line - max(lines), 0)
    relabeled = code.replace(
        co_filename=where.file, co_name=label, co_qualname=label, co_firstlineno=first
    )
    # Bare globals: with the compiler module's own, a traceback would show this module's
    # source at the YAML's line numbers when the YAML file cannot be read.
    return cast(Callable[..., Any], FunctionType(relabeled, {"__builtins__": __builtins__}, label))


def _where(
    spec: MachineSpec, t: TransitionSpec, source: str, kind: str, name: str, at: Location
) -> str:
    return (
        f"{at}: in machine {spec.name!r}, state {source!r}, trigger {t.trigger!r}, {kind} {name!r}"
    )


def _noted(exc: BaseException, where: str) -> None:
    """Name the YAML step in ``exc`` once (a re-raise through an outer step adds none)."""
    if not any(note.startswith(STEP_NOTE) for note in getattr(exc, "__notes__", ())):
        exc.add_note(f"{STEP_NOTE}{where}")


def _guard(
    name: str, fn: Callable[[Any], Any], where: str, at: Location
) -> Callable[[EventData], bool]:
    """A registered condition as one transition names it: asked at most once per fire.

    The answers live on the cursor the fire runs on (cleared before each fire).
    """
    call = _located(_sync_step, at, f"condition {name}")

    def guard(event: EventData) -> bool:
        answers = cast(_Cursor, event.model).answers
        answer = answers.get(name)
        if answer is None:
            try:
                ctx = cast("tuple[Any, ...]", event.args)[0]
                answer = answers[name] = bool(call(fn, ctx))
            except Exception as exc:
                _noted(exc, where)
                raise
        return answer

    return guard


class _Compiled:
    """One ``transitions.Machine`` plus the steps its transitions decide."""

    def __init__(
        self, spec: MachineSpec, registry: Registry, *, watch: StepWatch | None = None
    ) -> None:
        self.spec = spec
        self.registry = registry
        self.terminal = spec.terminal_states
        self.slot_states = spec.slot_states
        self._cursor = _Cursor()
        #: The budget and the counters of this machine's plugin steps.
        self.watch = watch or StepWatch()
        #: What each (transition, source) pair decides, in declaration order.
        self.steps: list[Picked] = []
        self.machine = Machine(
            model=None,
            states=list(spec.state_names),
            transitions=[
                self._transition(t, source) for t in spec.transitions for source in t.source_names
            ],
            initial=spec.initial.name,
            auto_transitions=False,
            send_event=True,
            ignore_invalid_triggers=False,
        )
        self.machine.add_model(self._cursor, initial=spec.initial.name)
        # The (state, trigger) pairs whose way out asks a plugin condition, with where
        # the YAML declares it: a service decides them off its event loop, on a cursor of
        # their own (the worker's), so a loop fire never shares a cursor with them.
        plugin_conditions = {n for n, info in registry.conditions.items() if info.origin}
        self._plugin_guarded = {
            (state, t.trigger): f"{t.location}: in machine {spec.name!r}, state {state!r}, "
            f"trigger {t.trigger!r}"
            for t in spec.transitions
            if {c.name for c in (*t.conditions, *t.unless)} & plugin_conditions
            for state in t.source_names
        }
        self._worker = Worker(spec.name)
        self._worker_cursor = _Cursor()
        if self._plugin_guarded:
            self.machine.add_model(self._worker_cursor, initial=spec.initial.name)

    def _transition(self, t: TransitionSpec, source: str) -> dict[str, Any]:
        """One ``transitions`` transition per source, so the recorder knows the source."""
        spec, conditions = self.spec, self.registry.conditions
        dest = t.dest.name
        step = Step(
            trigger=t.trigger,
            source=source,
            dest=dest,
            actions=tuple(a.name for a in t.actions),
            takes_slot=dest in self.slot_states and source not in self.slot_states,
            releases_slot=dest in self.terminal,
            transition=t,
        )
        calls = tuple(self._action(t, source, a.name, a.location) for a in t.actions)

        def guards(refs: tuple[Any, ...]) -> list[Callable[[EventData], bool]]:
            return [
                _guard(
                    ref.name,
                    conditions[ref.name].fn,
                    _where(spec, t, source, "condition", ref.name, ref.location),
                    ref.location,
                )
                for ref in refs
            ]

        return {
            "trigger": t.trigger,
            "source": source,
            "dest": dest,
            "conditions": guards(t.conditions),
            "unless": guards(t.unless),
            "after": [self._recorder((step, calls))],
        }

    def _action(self, t: TransitionSpec, source: str, name: str, at: Location) -> ActionCall:
        info = self.registry.actions[name]
        fn, plugin = info.fn, bool(info.origin)
        is_async = inspect.iscoroutinefunction(fn)
        step = _located(_async_step if is_async else _sync_step, at, f"action {name}")
        where = _where(self.spec, t, source, "action", name, at)

        if is_async:

            async def run_async(ctx: Any) -> Any:
                try:
                    return await step(fn, ctx)
                except Exception as exc:
                    _noted(exc, where)
                    raise

            return ActionCall(name, run_async, True, plugin, where)

        def run(ctx: Any) -> Any:
            try:
                return step(fn, ctx)
            except Exception as exc:
                _noted(exc, where)
                raise

        return ActionCall(name, run, False, plugin, where)

    def _recorder(self, picked: Picked) -> Callable[..., None]:
        self.steps.append(picked)

        def record(event: EventData) -> None:
            cast(_Cursor, event.model).picked.append(picked)

        return record

    async def decide(self, state: str, trigger: str, ctx: Any, *, offload: bool = False) -> Step:
        """Fire ``trigger`` from ``state``: the step the machine picks (a plugin condition
        asked as :meth:`_decide` asks it; without one, atomic: no await inside)."""
        return (await self._decide(state, trigger, ctx, offload))[0]

    async def _decide(self, state: str, trigger: str, ctx: Any, offload: bool) -> Picked:
        """Fire ``trigger`` from ``state``. A way out that asks a plugin condition is
        timed, and with ``offload`` (a service) decided off the event loop within the
        budget; a ``SystemExit`` from the plugin fails the decision, retryably."""
        where = self._plugin_guarded.get((state, trigger))
        if where is None:
            return self._fire(state, trigger, ctx)
        cursor = self._worker_cursor if offload else None
        return await self._plugin_call(
            lambda: self._fire(state, trigger, ctx, cursor), where, offload
        )

    async def _plugin_call(self, call: Callable[[], T], where: str, offload: bool) -> T:
        """A synchronous plugin step, timed: with ``offload``, on the worker within the
        budget; a ``SystemExit`` from it fails the delivery, retryably."""
        if offload:
            return await self._worker.run(lambda: contained(where, call), self.watch, where)
        with self.watch.timed(where):
            return contained(where, call)

    def _fire(self, state: str, trigger: str, ctx: Any, cursor: _Cursor | None = None) -> Picked:
        """Let the machine pick among ``trigger``'s transitions from ``state``.

        A trigger or state the machine does not declare (code out of step with the YAML,
        or a row written under an older machine) is refused up front: ``transitions``
        would raise ``AttributeError``/``ValueError``, which no caller classifies.
        """
        machine = self.machine
        if trigger not in machine.events:
            raise IllegalTransition(
                f"{self.spec.name}: trigger {trigger!r} is not declared; declared triggers: "
                f"{', '.join(self.spec.triggers)}"
            )
        if state not in machine.states:
            raise IllegalTransition(
                f"{self.spec.name}: {state!r} is not a state of this machine; declared "
                f"states: {', '.join(self.spec.state_names)}"
            )
        cursor = cursor or self._cursor
        machine.set_state(state, model=cursor)
        cursor.answers.clear()
        cursor.picked.clear()
        try:
            fired = cursor.trigger(trigger, ctx)  # type: ignore[attr-defined]
        except MachineError:
            raise IllegalTransition(
                f"{self.spec.name}: trigger {trigger!r} is not allowed from state {state!r}"
            ) from None
        if not fired or not cursor.picked:
            raise IllegalTransition(
                f"{self.spec.name}: no transition for trigger {trigger!r} from state "
                f"{state!r} had its conditions met"
            )
        return cursor.picked[-1]


class CompiledLifecycle(_Compiled):
    """An entity lifecycle (``machines/request.yaml``)."""

    def __init__(
        self, spec: MachineSpec, registry: Registry, *, watch: StepWatch | None = None
    ) -> None:
        if spec.kind != LIFECYCLE:
            raise ValueError(f"{spec.name} is a {spec.kind} machine, not a lifecycle")
        super().__init__(spec, registry, watch=watch)

    def is_terminal(self, state: str) -> bool:
        return state in self.terminal

    def holds_slot(self, state: str) -> bool:
        return state in self.slot_states

    def dest_of(self, trigger: str) -> frozenset[str]:
        """Every state ``trigger`` can lead to (for conditions that ask "admitted?")."""
        return leads_to(self.spec, trigger)


@dataclass(frozen=True)
class FlowCursor:
    """How far a delivery got: the flow state, and the actions of the transition into it
    that have not run yet.

    With the context the actions fill in, that is all a paused delivery is: the machine
    itself is stateless between fires (its cursor model is set on every decision), so
    one compiled flow can hold any number of deliveries half-done. ``via`` is the step
    that led into ``state`` (``None`` before the first decision): for a finished
    delivery, the transition that settled it.
    """

    state: str
    pending: tuple[ActionCall, ...] = ()
    steps: int = 0
    finished: bool = False
    via: Step | None = None

    @property
    def pending_names(self) -> tuple[str, ...]:
        return tuple(call.name for call in self.pending)


class FlowDidNotSettle(Retryable):
    """A flow exceeded its step budget (e.g. a queue row contended on every claim)."""


class CompiledFlow(_Compiled):
    """A per-delivery decision procedure (``machines/queue_gate.yaml``), or a queue's
    culprit search run once per ended build (``kind: search``, ``machines/culprit.yaml``)."""

    def __init__(
        self,
        spec: MachineSpec,
        registry: Registry,
        *,
        max_steps: int = 64,
        watch: StepWatch | None = None,
    ) -> None:
        if spec.kind not in FLOW_KINDS:
            raise ValueError(f"{spec.name} is a {spec.kind} machine, not a flow")
        super().__init__(spec, registry, watch=watch)
        self.max_steps = max_steps
        self.trigger_for: dict[str, str] = {}
        for state in spec.state_names:
            triggers = {t.trigger for t in spec.outgoing(state)}
            if len(triggers) == 1:
                self.trigger_for[state] = triggers.pop()
        self._initial = spec.initial.name

    def start(self) -> FlowCursor:
        """The cursor of a delivery that has not run anything yet."""
        return FlowCursor(self._initial)

    async def run(self, ctx: Any, *, probe: Probe | None = None, offload: bool = False) -> str:
        """Drive ``ctx`` from the initial state to a terminal one; return that state."""
        return (await self.advance(ctx, self.start(), probe=probe, offload=offload)).state

    async def settle(
        self, ctx: Any, *, probe: Probe | None = None, offload: bool = False
    ) -> Step | None:
        """:meth:`run`, answering the step into the terminal state (``None``: none taken)."""
        return (await self.advance(ctx, self.start(), probe=probe, offload=offload)).via

    async def advance(
        self,
        ctx: Any,
        cursor: FlowCursor,
        *,
        pause_after: str = "",
        probe: Probe | None = None,
        offload: bool = False,
    ) -> FlowCursor:
        """Run ``cursor``'s pending actions, then fire the way out of each open state and
        run its actions, until a terminal state: the one driver of every delivery.

        Stops right after the first action named ``pause_after`` (``""``: never) and
        returns where it stopped, with what that transition has left to run; otherwise
        returns a ``finished`` cursor in the terminal state. The step budget carries
        over, so pausing never buys a flow extra steps. A context with a ``via``
        attribute is told the step whose actions run. ``offload``: run plugin steps off
        the event loop, within their budget (a service); otherwise inline (a driver with
        no event loop of its own, such as the simulated world).
        """
        state, calls, steps, via = cursor.state, cursor.pending, cursor.steps, cursor.via
        tell = hasattr(ctx, "via")
        if tell:
            ctx.via = via
        while True:
            for i, action in enumerate(calls):
                if action.plugin:
                    await self._plugin_action(action, ctx, offload)
                elif action.is_async:
                    await action.call(ctx)
                else:
                    action.call(ctx)
                if probe is not None:
                    probe(action.name)
                if action.name == pause_after:
                    return FlowCursor(state, calls[i + 1 :], steps, via=via)
            if state in self.terminal:
                return FlowCursor(state, (), steps, finished=True, via=via)
            if steps >= self.max_steps:
                raise FlowDidNotSettle(
                    f"{self.spec.name}: no terminal state after {self.max_steps} steps "
                    f"(last {state!r})"
                )
            trigger = self.trigger_for.get(state)
            if trigger is None:  # only reachable with lint off (dead end, several triggers)
                raise IllegalTransition(
                    f"{self.spec.name}: flow state {state!r} has no single trigger to leave by"
                )
            via, calls = await self._decide(state, trigger, ctx, offload)
            if tell:
                ctx.via = via
            steps += 1
            state = via.dest

    async def _plugin_action(self, action: ActionCall, ctx: Any, offload: bool) -> None:
        """A plugin's action: with ``offload``, within its budget, and off the event loop
        if synchronous."""
        where, call = action.where, action.call
        if not action.is_async:
            await self._plugin_call(lambda: call(ctx), where, offload)
        elif offload:
            await within_budget(call(ctx), self.watch, where)
        else:
            with self.watch.timed(where):
                await contained_async(where, call(ctx))

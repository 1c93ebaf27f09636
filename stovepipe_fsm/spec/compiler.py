"""Compile a validated :class:`MachineSpec` into a ``transitions`` machine.

Theory of operation
-------------------
One ``transitions.Machine`` is built per spec, with one cursor model attached to it for
the life of the process. Firing a trigger is *synchronous and atomic*: the machine
evaluates the registered conditions against a context, picks the transition, moves the
cursor, and its callbacks merely *record* the names of the actions to run. The caller
then awaits those actions, in order, outside the machine.

Why not ``AsyncMachine``: it stops processing after a cancelled transition and its
transitions are not atomic (an await inside a callback lets another coroutine observe a
half-made transition). Keeping the machine synchronous sidesteps both and keeps the
core sans-I/O: the machine decides, the driver does the I/O. Diagrams are generated
offline from the spec, never with ``GraphMachine`` in a service (it grows memory).

Cost: a delivery fires five flow triggers and one or two lifecycle ones, so the machine
is built from lean subclasses of the library's own extension points (``state_cls``,
``transition_cls``, ``condition_cls``, ``event_cls``), and decisions are taken from a
table read off the built machine: per trigger and source state, the event's transitions
in the library's order, each with its condition objects (targets included) and the step
its recorder notes. Deciding walks that table exactly as ``Event._trigger`` walks the
event (candidates in order, a candidate's conditions in order until one fails, the
first candidate whose conditions all hold wins), without the cursor model, event record
and callback the machine needs to say the same; firing the machine itself stays
available (``_decide_by_machine``) and tests/test_compiler_differential.py holds both
to a stock ``transitions.Machine``. Each (transition, source) pair's :class:`Step` and
action callables are resolved at compile time, and a condition is evaluated at most once
per decision. ``python -m bench`` measures the result against a plain-Python reference
of the same algorithm.

Two shapes:

- :class:`CompiledLifecycle` (``kind: lifecycle``): ``fire(state, trigger, ctx)`` answers
  the destination and the slot effects derived from the ``holds_slot``/``terminal``
  declarations.
- :class:`CompiledFlow` (``kind: flow``): ``run(ctx)`` drives one delivery from
  ``initial`` to a terminal state, firing the single trigger that leaves each state.
  ``advance(ctx, cursor, pause_after=...)`` does the same from a :class:`FlowCursor`
  and can stop right after a named action, so a delivery can be held half-done while
  other deliveries run (``check`` explores overlapping deliveries that way). ``advance``
  walks the table in a driver loop; ``run`` takes the same table written out as one
  generated coroutine function (:mod:`.flow_codegen`), which the differential tests
  hold to the loop and to a stock machine.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from transitions import Event, Machine, MachineError, State, Transition
from transitions.core import Condition, EventData

from ..domain.errors import Retryable, StovepipeError
from .flow_codegen import Call, Row, Settle, generate
from .flow_codegen import Probe as Probe  # re-exported: callers name it from here
from .model import FLOW, LIFECYCLE, MachineSpec, TransitionSpec
from .registry import Registry
from .roles import leads_to


class IllegalTransition(StovepipeError):
    """A trigger that the machine does not allow from the entity's current state."""


class _Cursor:
    """The one model attached to a compiled machine; it only carries ``state``."""

    state: str


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


ActionCall = Call  # name, callable, is a coroutine fn
# What one transition decides: its step and resolved actions.
_Picked = tuple[Step, tuple[ActionCall, ...]]
# A candidate of the decision table: (condition name, predicate, answer it needs) in
# the machine's order, and what the transition decides when all of them hold.
_Row = Row[Step]


def _walk(candidates: tuple[_Row, ...], ctx: Any) -> _Picked | None:
    """The candidate ``Event._trigger`` would pick: the first, in the machine's order,
    whose conditions all hold, each condition asked at most once (``None``: none does).

    Both deciding paths use it: :meth:`_Compiled._decide` for a fire, and the flow
    driver's loop, which reaches the candidates of each open state without a lookup.
    """
    answers: dict[str, bool] = {}
    for guards, picked in candidates:
        for name, fn, target in guards:
            answer = answers.get(name)
            if answer is None:
                answer = answers[name] = bool(fn(ctx))
            if answer != target:
                break
        else:
            return picked
    return None


class _NamedState(State):
    """A state whose name is a plain string (``State.name`` first checks for an Enum)."""

    @property
    def name(self) -> str:
        # A compiled machine is built from string names only (the spec's identifiers).
        return cast(str, self._name)


class _DirectEvent(Event):
    """``Event.trigger`` without the hop through ``Machine._process`` and a new EventData.

    For a machine without a transition queue (a compiled machine never has one),
    ``Machine._process`` just calls the partial it is handed, and ``EventData`` is a
    plain record the library fills in; building both cost more than the rest of a
    small trigger. One record is kept per event and reset before use (a re-entrant
    trigger gets a fresh one). The library's ``_trigger`` still checks the source state
    and walks the transitions in declaration order.
    """

    _spare: EventData | None = None

    def trigger(self, model: Any, *args: Any, **kwargs: Any) -> bool:
        """``Event.trigger`` + ``_trigger`` + ``_process`` for a machine without event hooks.

        The library's versions also run the machine's prepare/finalize/on_exception
        callback lists and log each stage; a compiled machine declares none of those
        hooks (``_Compiled`` asserts it), so what remains is the decision itself: refuse
        an invalid source state, then offer the event to each transition of that state
        in declaration order until one's conditions hold.
        """
        event_data = self._spare
        if event_data is None:
            event_data = EventData(None, self, self.machine, model, args=args, kwargs=kwargs)
        else:
            self._spare = None
            event_data.model = model
            event_data.args = args
            event_data.kwargs = kwargs
            event_data.transition = None
            event_data.error = None
            event_data.result = False
        try:
            state = event_data.state = self.machine.get_model_state(model)
            candidates = self.transitions.get(state.name)
            if candidates is None:
                raise MachineError(f"Can't trigger event {self.name} from state {state.name}!")
            for transition in candidates:
                event_data.transition = transition
                if transition.execute(event_data):
                    event_data.result = True
                    return True
            return False
        finally:
            event_data.args = ()  # do not keep the caller's context alive
            self._spare = event_data


def _model_state(machine: Machine, model: Any) -> State:
    """``Machine.get_model_state`` for string state names (no Enum check, one lookup)."""
    return machine.states[getattr(model, machine.model_attribute)]


@dataclass(frozen=True)
class _Guard:
    """A registered condition plus the per-fire answer memo it shares with its twins."""

    name: str
    fn: Callable[[Any], Any]
    answers: dict[str, bool]

    def __call__(self, ctx: Any) -> bool:
        return bool(self.fn(ctx))


class _DirectCondition(Condition):
    """A condition whose function is a :class:`_Guard`, answered at most once per fire.

    ``Condition.check`` first resolves ``func`` (it may name a model attribute or a
    dotted path) and then branches on ``send_event``; a compiled machine always hands it
    a guard and never sends events. Sibling transitions repeat each other's guards
    (``conditions: x`` on one, ``unless: x`` on the next), so the library would evaluate
    one condition up to three times per trigger; within one fire nothing can change its
    answer (no action runs until the machine has decided), so it is asked once.
    """

    def check(self, event_data: Any) -> bool:
        guard = cast(_Guard, self.func)  # the compiler hands every condition a _Guard
        answers = guard.answers
        try:
            answer = answers[guard.name]
        except KeyError:
            answer = answers[guard.name] = bool(guard.fn(event_data.args[0]))
        return answer == self.target


class _DecidingTransition(Transition):
    """A ``transitions`` transition without the plumbing the compiler never uses.

    ``Transition.execute`` runs prepare and before callbacks, the machine-wide
    before/after-state-change hooks, the states' exit/enter callbacks and about ten log
    calls on every fire; a compiled machine declares none of those callbacks (its only
    one is the recorder in ``after``), yet paying for them costs several times the
    decision itself (bench/README.md has the figures). This keeps what decides - the
    library's own condition check on this transition, reached from the library's event
    loop in declaration order - and the state change, and calls the ``after`` callbacks
    directly. ``tests/test_compiler_differential.py`` proves it decides as the stock
    ``transitions.Machine`` does.
    """

    condition_cls = _DirectCondition

    def execute(self, event_data: Any) -> bool:
        # Transition._eval_conditions, without its debug log line per failed guard: a
        # failed guard is the normal way a sibling transition is passed over.
        for condition in self.conditions:
            if not condition.check(event_data):
                return False
        setattr(event_data.model, event_data.machine.model_attribute, self.dest)
        for callback in self.after:
            cast("Callable[..., None]", callback)(*event_data.args, **event_data.kwargs)
        return True


# What a compiled machine puts in the library's extension points. A differential test
# (tests/test_compiler_differential.py) holds these to the choices of a stock
# ``transitions.Machine`` built from the same spec.
_LEAN_CLASSES: dict[str, Any] = {
    "state_cls": _NamedState,
    "transition_cls": _DecidingTransition,
    "event_cls": _DirectEvent,
    "get_model_state": _model_state,
}


class _Compiled:
    """One ``transitions.Machine`` plus what deciding needs, resolved once at compile time.

    Per-fire cost matters (every delivery fires five flow triggers and one or two
    lifecycle ones), so everything that does not depend on the context is computed here:
    each (transition, source) pair gets its :class:`Step` and its resolved action calls
    up front, its single ``after`` callback only records which pair the machine picked,
    and the decision table is read from the built machine (:meth:`_decision_table`).
    """

    def __init__(self, spec: MachineSpec, registry: Registry) -> None:
        self.spec = spec
        self.registry = registry
        self.terminal = spec.terminal_states
        self.slot_states = spec.slot_states
        self._actions: dict[str, tuple[Callable[[Any], Any], bool]] = {
            name: (info.fn, inspect.iscoroutinefunction(info.fn))
            for name, info in registry.actions.items()
        }
        # What the machine picked during the current fire, and the condition answers
        # already computed in it (see _memoized).
        self._picked: tuple[Step, tuple[ActionCall, ...]] | None = None
        self._answers: dict[str, bool] = {}
        self._recorded: dict[Callable[..., None], _Picked] = {}
        self._cursor = _Cursor()
        # Both looked up at compile time (not bound at import) so a test can swap
        # ``Machine`` and the bench can compile with the library's stock classes.
        machine_cls = type("CompiledMachine", (Machine,), dict(_LEAN_CLASSES))
        self.machine = machine_cls(
            model=None,
            states=list(spec.state_names),
            transitions=[
                self._transition(t, source) for t in spec.transitions for source in t.source_names
            ],
            initial=spec.initial.name,
            auto_transitions=False,
            send_event=False,
            ignore_invalid_triggers=False,
        )
        self.machine.add_model(self._cursor, initial=spec.initial.name)
        hooks = (self.machine.prepare_event, self.machine.finalize_event, self.machine.on_exception)
        assert not any(hooks), "_DirectEvent skips machine-wide event hooks; declare none"
        self._events = self.machine.events
        self._states = self.machine.states
        self._table = self._decision_table()

    def _decision_table(self) -> dict[str, dict[str, tuple[_Row, ...]]]:
        """Per trigger and source state, the machine's candidate transitions as rows.

        Read from the built ``transitions`` machine itself - each event's transitions per
        source in the library's order, each transition's condition objects with their
        targets (``unless`` ones negated), and the step its recorder notes - so the table
        says nothing the machine does not. :meth:`_decide` walks it the way
        ``Event._trigger`` walks the machine; tests/test_compiler_differential.py holds
        both to a stock ``transitions.Machine``.
        """
        table: dict[str, dict[str, tuple[_Row, ...]]] = {}
        for trigger, event in self._events.items():
            table[trigger] = {
                source: tuple(self._row(transition) for transition in candidates)
                for source, candidates in event.transitions.items()
            }
        return table

    def _row(self, transition: Transition) -> _Row:
        guards = tuple(
            (cast(_Guard, c.func).name, cast(_Guard, c.func).fn, bool(c.target))
            for c in transition.conditions
        )
        (record,) = transition.after  # the compiler's one callback: its recorder
        return guards, self._recorded[cast("Callable[..., None]", record)]

    def _transition(self, t: TransitionSpec, source: str) -> dict[str, Any]:
        """One ``transitions`` transition per source, so the recorder knows the source."""
        conditions = self.registry.conditions
        dest = t.dest.name
        names = tuple(a.name for a in t.actions)
        step = Step(
            trigger=t.trigger,
            source=source,
            dest=dest,
            actions=names,
            takes_slot=dest in self.slot_states and source not in self.slot_states,
            releases_slot=dest in self.terminal,
            transition=t,
        )
        calls = tuple((name, *self._actions[name]) for name in names)
        return {
            "trigger": t.trigger,
            "source": source,
            "dest": dest,
            "conditions": [
                _Guard(c.name, conditions[c.name].fn, self._answers) for c in t.conditions
            ],
            "unless": [_Guard(u.name, conditions[u.name].fn, self._answers) for u in t.unless],
            "after": [self._recorder(step, calls)],
        }

    def _recorder(self, step: Step, calls: tuple[ActionCall, ...]) -> Callable[..., None]:
        picked = (step, calls)

        def record(*_: Any) -> None:
            self._picked = picked

        self._recorded[record] = picked
        return record

    def fire(self, state: str, trigger: str, ctx: Any) -> Step:
        """Fire ``trigger`` from ``state``; atomic (no await inside).

        A trigger or state the machine does not declare (code out of step with the YAML,
        or a row written under an older machine) is refused up front: ``transitions``
        would raise ``AttributeError``/``ValueError``, which no caller classifies.
        """
        return self._fire(state, trigger, ctx)[0]

    def _fire(self, state: str, trigger: str, ctx: Any) -> tuple[Step, tuple[ActionCall, ...]]:
        event = self._events.get(trigger)
        if event is None:
            raise IllegalTransition(
                f"{self.spec.name}: trigger {trigger!r} is not declared; declared triggers: "
                f"{', '.join(self.spec.triggers)}"
            )
        if state not in self._states:
            raise IllegalTransition(
                f"{self.spec.name}: {state!r} is not a state of this machine; declared "
                f"states: {', '.join(self.spec.state_names)}"
            )
        return self._decide(event, state, trigger, ctx)

    def _take_picked(self) -> tuple[Step, tuple[ActionCall, ...]] | None:
        """What the recorder callback noted during the fire that just ran, if anything."""
        return self._picked

    def _decide(self, event: Event, state: str, trigger: str, ctx: Any) -> _Picked:
        """Pick among ``event``'s transitions from ``state`` (both valid) by the table.

        The same walk as the machine's (:meth:`_decide_by_machine`): candidates in
        declaration order, each one's conditions in order until one fails, every
        condition answered at most once per decision, the first candidate whose
        conditions all hold wins. It skips only the machine's bookkeeping (the cursor
        model, the event record, the recorder callback).
        """
        candidates = self._table[trigger].get(state)
        if candidates is None:
            raise IllegalTransition(
                f"{self.spec.name}: trigger {trigger!r} is not allowed from state {state!r}"
            )
        picked = _walk(candidates, ctx)
        if picked is None:
            raise self._unmet(trigger, state)
        return picked

    def _unmet(self, trigger: str, state: str) -> IllegalTransition:
        return IllegalTransition(
            f"{self.spec.name}: no transition for trigger {trigger!r} from state "
            f"{state!r} had its conditions met"
        )

    def _decide_by_machine(self, event: Event, state: str, trigger: str, ctx: Any) -> _Picked:
        """Let the ``transitions`` machine pick among ``event``'s transitions from ``state``
        (both valid): the path the table is derived from, kept to compare with it."""
        self._cursor.state = state
        self._answers.clear()
        self._picked = None
        try:
            fired = event.trigger(self._cursor, ctx)
        except MachineError:
            raise IllegalTransition(
                f"{self.spec.name}: trigger {trigger!r} is not allowed from state {state!r}"
            ) from None
        picked = self._take_picked()
        if not fired or picked is None:
            raise IllegalTransition(
                f"{self.spec.name}: no transition for trigger {trigger!r} from state "
                f"{state!r} had its conditions met"
            )
        return picked


class CompiledLifecycle(_Compiled):
    """An entity lifecycle (``machines/request.yaml``)."""

    def __init__(self, spec: MachineSpec, registry: Registry) -> None:
        if spec.kind != LIFECYCLE:
            raise ValueError(f"{spec.name} is a {spec.kind} machine, not a lifecycle")
        super().__init__(spec, registry)

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
    itself is stateless between fires (its cursor model is reset on every decision), so
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
        return tuple(call[0] for call in self.pending)


class FlowDidNotSettle(Retryable):
    """A flow exceeded its step budget (e.g. a queue row contended on every claim)."""


class CompiledFlow(_Compiled):
    """A per-delivery decision procedure (``machines/queue_gate.yaml``)."""

    def __init__(self, spec: MachineSpec, registry: Registry, *, max_steps: int = 64) -> None:
        if spec.kind != FLOW:
            raise ValueError(f"{spec.name} is a {spec.kind} machine, not a flow")
        super().__init__(spec, registry)
        self._max_steps = max_steps
        self.trigger_for: dict[str, str] = {}
        for state in spec.state_names:
            triggers = {t.trigger for t in spec.outgoing(state)}
            if len(triggers) == 1:
                self.trigger_for[state] = triggers.pop()
        # The way out of each open state, resolved once: run() skips fire()'s checks,
        # and deciding by the table goes straight to that state's candidates.
        self._way_out: dict[str, tuple[str, Event, tuple[_Row, ...]]] = {
            state: (trigger, self._events[trigger], self._table[trigger][state])
            for state, trigger in self.trigger_for.items()
            if state not in self.terminal
        }
        self._initial = spec.initial.name
        # The table written out as one coroutine function (:mod:`.flow_codegen`): what
        # run and settle take when deciding by the table. ``advance``, which can stop
        # after any action and start again from a cursor, keeps the loop.
        self._generated: Settle[Step] | None = generate(
            spec.state_names,
            self._initial,
            self.terminal,
            {state: (trigger, rows) for state, (trigger, _event, rows) in self._way_out.items()},
            max_steps=max_steps,
            unmet=self._unmet,
            over_budget=self._over_budget,
            no_way_out=self._no_way_out,
        )

    @property
    def max_steps(self) -> int:
        """Decisions a delivery may take (fixed: the generated driver is built with it)."""
        return self._max_steps

    async def run(
        self,
        ctx: Any,
        *,
        probe: Probe | None = None,
    ) -> str:
        """Drive ``ctx`` from the initial state to a terminal one; return that state."""
        generated = self._generated
        if generated is not None and self._by_table():
            return (await generated(ctx, probe))[0]
        return (await self._drive(ctx, self._initial, (), 0, None, "", probe))[0]

    async def settle(self, ctx: Any, *, probe: Probe | None = None) -> Step | None:
        """:meth:`run`, answering the step into the terminal state (``None``: none taken)."""
        generated = self._generated
        if generated is not None and self._by_table():
            return (await generated(ctx, probe))[1]
        return (await self._drive(ctx, self._initial, (), 0, None, "", probe))[3]

    def _by_table(self) -> bool:
        """Deciding by the table, as shipped (a comparison may make it fire the machine)."""
        return getattr(self._decide, "__func__", None) is _Compiled._decide

    def _over_budget(self, state: str) -> FlowDidNotSettle:
        return FlowDidNotSettle(
            f"{self.spec.name}: no terminal state after {self.max_steps} steps (last {state!r})"
        )

    def _no_way_out(self, state: str) -> IllegalTransition:
        return IllegalTransition(
            f"{self.spec.name}: flow state {state!r} has no single trigger to leave by"
        )

    def start(self) -> FlowCursor:
        """The cursor of a delivery that has not run anything yet."""
        return FlowCursor(self._initial)

    async def advance(
        self,
        ctx: Any,
        cursor: FlowCursor,
        *,
        pause_after: str = "",
        probe: Probe | None = None,
    ) -> FlowCursor:
        """Run ``cursor``'s pending actions, then the loop of :meth:`run`, from ``cursor``.

        Stops right after the first action named ``pause_after`` (``""``: never) and
        returns where it stopped; otherwise returns a ``finished`` cursor in the terminal
        state. The step budget carries over, so pausing never buys a flow extra steps.
        """
        state, pending, steps, via = await self._drive(
            ctx, cursor.state, cursor.pending, cursor.steps, cursor.via, pause_after, probe
        )
        if pending is None:
            return FlowCursor(state, (), steps, finished=True, via=via)
        return FlowCursor(state, pending, steps, via=via)

    async def _drive(
        self,
        ctx: Any,
        state: str,
        calls: tuple[ActionCall, ...],
        steps: int,
        via: Step | None,
        pause_after: str,
        probe: Probe | None,
    ) -> tuple[str, tuple[ActionCall, ...] | None, int, Step | None]:
        """The driver loop of :meth:`run` and :meth:`advance`.

        ``calls`` are the actions of the transition into ``state`` that have not run yet,
        ``steps`` the decisions already spent and ``via`` the step that led into
        ``state``. Runs those actions, then fires the way out of each open state and runs
        its actions, until a terminal state: returns ``(state, None, steps, via)`` there,
        or ``(state, rest, steps, via)`` right after the first action named
        ``pause_after``, ``rest`` being what that transition has left to run.
        Every delivery takes this loop, so it returns plain tuples and resolves nothing
        per step that the compiler could resolve once; the pause check costs one string
        comparison per action.
        """
        terminal, way_out, decide = self.terminal, self._way_out, self._decide
        # Deciding by the table (as shipped) walks the state's candidates right here;
        # any other decider (firing the machine, to compare) is called per step.
        by_table = self._by_table()
        max_steps = self.max_steps
        # A context with a ``via`` attribute is told the transition whose actions run.
        tell = hasattr(ctx, "via")
        if tell:
            ctx.via = via
        while True:
            # The transition's actions, with callables resolved at compile time.
            for name, fn, is_async in calls:
                if is_async:
                    await fn(ctx)
                else:
                    fn(ctx)
                if probe is not None:
                    probe(name)
                if name == pause_after:
                    # The first action of that name is the one that just ran.
                    ran = next(i for i, call in enumerate(calls) if call[0] == name)
                    return state, calls[ran + 1 :], steps, via
            if state in terminal:
                return state, None, steps, via
            if steps >= max_steps:
                raise self._over_budget(state)
            leave = way_out.get(state)
            if leave is None:  # only reachable with lint off (dead end, several triggers)
                raise self._no_way_out(state)
            if by_table:
                picked = _walk(leave[2], ctx)
                if picked is None:
                    raise self._unmet(leave[0], state)
                via, calls = picked
            else:
                via, calls = decide(leave[1], state, leave[0], ctx)
            if tell:
                ctx.via = via
            steps += 1
            state = via.dest

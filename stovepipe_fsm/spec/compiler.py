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

Two shapes:

- :class:`CompiledLifecycle` (``kind: lifecycle``): ``fire(state, trigger, ctx)`` answers
  the destination and the slot effects derived from the ``holds_slot``/``terminal``
  declarations.
- :class:`CompiledFlow` (``kind: flow``): ``run(ctx)`` drives one delivery from
  ``initial`` to a terminal state, firing the single trigger that leaves each state.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from transitions import Machine, MachineError

from ..domain.errors import Retryable, StovepipeError
from .model import FLOW, LIFECYCLE, MachineSpec, TransitionSpec
from .registry import Registry

Probe = Callable[[str], None]


class IllegalTransition(StovepipeError):
    """A trigger that the machine does not allow from the entity's current state."""


class _Cursor:
    """The one model attached to a compiled machine; it only carries ``state``."""

    state: str


@dataclass(frozen=True)
class Step:
    """The outcome of firing one trigger."""

    trigger: str
    source: str
    dest: str
    actions: tuple[str, ...]
    takes_slot: bool
    releases_slot: bool


class _Compiled:
    def __init__(self, spec: MachineSpec, registry: Registry) -> None:
        self.spec = spec
        self.registry = registry
        self._pending: list[str] = []
        self._cursor = _Cursor()
        self.machine = Machine(
            model=None,
            states=list(spec.state_names),
            transitions=[self._transition(t) for t in spec.transitions],
            initial=spec.initial.name,
            auto_transitions=False,
            send_event=False,
            ignore_invalid_triggers=False,
        )
        self.machine.add_model(self._cursor, initial=spec.initial.name)
        self.terminal = spec.terminal_states
        self.slot_states = spec.slot_states
        self._actions: dict[str, tuple[Callable[[Any], Any], bool]] = {
            name: (info.fn, inspect.iscoroutinefunction(info.fn))
            for name, info in registry.actions.items()
        }

    def _transition(self, t: TransitionSpec) -> dict[str, Any]:
        conditions = self.registry.conditions
        return {
            "trigger": t.trigger,
            "source": list(t.source_names),
            "dest": t.dest.name,
            "conditions": [conditions[c.name].fn for c in t.conditions],
            "unless": [conditions[u.name].fn for u in t.unless],
            "after": [self._recorder(a.name) for a in t.actions],
        }

    def _recorder(self, name: str) -> Callable[..., None]:
        pending = self._pending

        def record(*_: Any) -> None:
            pending.append(name)

        return record

    def fire(self, state: str, trigger: str, ctx: Any) -> Step:
        """Fire ``trigger`` from ``state``; atomic (no await inside).

        A trigger or state the machine does not declare (code out of step with the YAML,
        or a row written under an older machine) is refused up front: ``transitions``
        would raise ``AttributeError``/``ValueError``, which no caller classifies.
        """
        if trigger not in self.machine.events:
            raise IllegalTransition(
                f"{self.spec.name}: trigger {trigger!r} is not declared; declared triggers: "
                f"{', '.join(self.spec.triggers)}"
            )
        if state not in self.machine.states:
            raise IllegalTransition(
                f"{self.spec.name}: {state!r} is not a state of this machine; declared "
                f"states: {', '.join(self.spec.state_names)}"
            )
        cursor = self._cursor
        cursor.state = state
        pending = self._pending
        pending.clear()
        try:
            fired = cursor.trigger(trigger, ctx)  # type: ignore[attr-defined]
        except MachineError:
            raise IllegalTransition(
                f"{self.spec.name}: trigger {trigger!r} is not allowed from state {state!r}"
            ) from None
        if not fired:
            raise IllegalTransition(
                f"{self.spec.name}: no transition for trigger {trigger!r} from state "
                f"{state!r} had its conditions met"
            )
        dest = cursor.state
        return Step(
            trigger=trigger,
            source=state,
            dest=dest,
            actions=tuple(pending),
            takes_slot=dest in self.slot_states and state not in self.slot_states,
            releases_slot=dest in self.terminal,
        )

    async def run_actions(self, names: tuple[str, ...], ctx: Any, probe: Probe | None) -> None:
        for name in names:
            fn, is_async = self._actions[name]
            if is_async:
                await fn(ctx)
            else:
                fn(ctx)
            if probe is not None:
                probe(name)


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
        return frozenset(t.dest.name for t in self.spec.transitions if t.trigger == trigger)


class FlowDidNotSettle(Retryable):
    """A flow exceeded its step budget (e.g. a queue row contended on every claim)."""


class CompiledFlow(_Compiled):
    """A per-delivery decision procedure (``machines/queue_gate.yaml``)."""

    def __init__(self, spec: MachineSpec, registry: Registry, *, max_steps: int = 64) -> None:
        if spec.kind != FLOW:
            raise ValueError(f"{spec.name} is a {spec.kind} machine, not a flow")
        super().__init__(spec, registry)
        self.max_steps = max_steps
        self.trigger_for: dict[str, str] = {}
        for state in spec.state_names:
            triggers = {t.trigger for t in spec.outgoing(state)}
            if len(triggers) == 1:
                self.trigger_for[state] = triggers.pop()

    async def run(
        self,
        ctx: Any,
        *,
        probe: Probe | None = None,
        on_step: Callable[[Step], Awaitable[None] | None] | None = None,
    ) -> str:
        """Drive ``ctx`` from the initial state to a terminal one; return that state."""
        state = self.spec.initial.name
        for _ in range(self.max_steps):
            if state in self.terminal:
                return state
            trigger = self.trigger_for.get(state)
            if trigger is None:  # only reachable with lint off (dead end, several triggers)
                raise IllegalTransition(
                    f"{self.spec.name}: flow state {state!r} has no single trigger to leave by"
                )
            step = self.fire(state, trigger, ctx)
            if on_step is not None:
                observed = on_step(step)
                if inspect.isawaitable(observed):  # the signature allows async observers
                    await observed
            await self.run_actions(step.actions, ctx, probe)
            state = step.dest
        if state in self.terminal:
            return state
        raise FlowDidNotSettle(
            f"{self.spec.name}: no terminal state after {self.max_steps} steps (last {state!r})"
        )


def compile_lifecycle(spec: MachineSpec, registry: Registry) -> CompiledLifecycle:
    return CompiledLifecycle(spec, registry)


def compile_flow(spec: MachineSpec, registry: Registry) -> CompiledFlow:
    return CompiledFlow(spec, registry)

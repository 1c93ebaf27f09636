"""Which transitions of the delivery flow an exploration took, and which it never did.

A branch the search never takes is a branch nothing was proved about: a path rule no
explored head triggers, a hold no bound reaches. ``check`` reports each such transition
by its trigger, source, destination, conditions and place in the YAML, so a passing
run says what it did not cover.

The compiled flow is a ``transitions`` machine with one library transition per
(declared transition, source), in declaration order. :func:`tracker` adds to each an
``after`` callback (``Transition.add_callback``, the library's own extension point)
that marks its index in :attr:`CompiledFlow.steps` as taken. It is added once per
compiled flow and costs one set insertion per fire.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from weakref import WeakKeyDictionary

from ...machine.compiler import CompiledFlow, Step


@dataclass
class StepTracker:
    """The indices (into ``flow.steps``) of the transitions fired since :meth:`reset`."""

    flow: CompiledFlow
    taken: set[int] = field(default_factory=set)

    def reset(self) -> None:
        self.taken = set()

    def never_taken(self, taken: Iterable[int]) -> tuple[Step, ...]:
        """The flow's transitions whose index is not in ``taken``, in declaration order."""
        seen = set(taken)
        return tuple(step for i, (step, _) in enumerate(self.flow.steps) if i not in seen)


_TRACKERS: WeakKeyDictionary[CompiledFlow, StepTracker] = WeakKeyDictionary()


def tracker(flow: CompiledFlow) -> StepTracker:
    """The tracker of ``flow``, installed on its first use."""
    found = _TRACKERS.get(flow)
    if found is not None:
        return found
    found = _TRACKERS[flow] = StepTracker(flow)
    remaining: dict[tuple[str, str], list[Any]] = {}
    for index, (step, _) in enumerate(flow.steps):
        key = (step.trigger, step.source)
        if key not in remaining:
            remaining[key] = list(flow.machine.events[step.trigger].transitions[step.source])
        transition = remaining[key].pop(0)
        transition.add_callback("after", _marker(found, index))
    return found


def _marker(found: StepTracker, index: int) -> Callable[..., None]:
    def mark(*_: Any) -> None:
        found.taken.add(index)

    return mark


def describe_step(machine: str, step: Step) -> str:
    """``queue_gate claim: derived -> held (conditions rewrite_waits_for_drain)
    machines/queue_gate.yaml:170``: a transition as the YAML declares it."""
    t = step.transition
    guards = []
    if t is not None and t.conditions:
        guards.append("conditions " + ", ".join(c.name for c in t.conditions))
    if t is not None and t.unless:
        guards.append("unless " + ", ".join(c.name for c in t.unless))
    where = f" {t.location.file}:{t.location.line}" if t is not None else ""
    shown = f" ({'; '.join(guards)})" if guards else ""
    return f"{machine} {step.trigger}: {step.source} -> {step.dest}{shown}{where}"

"""A flow's decision table written out as one coroutine function.

The loop driver (``CompiledFlow._drive``) takes each open state's candidate rows from
the decision table and walks them at every step, and runs each transition's actions
from a list. That loop and walk are a fifth to a quarter of a decision's own cost
(``python -m bench --straight``). :func:`generate` writes the same rows out once per
compiled flow as the source of one coroutine function, compiled with ``compile``:
per open state, its candidates as ``if`` tests in the table's order, each condition
asked at most once per decision, and the winner's actions as plain calls.

It is derived from the table, which is read off the built ``transitions`` machine, and
it adds no decision of its own: the candidates, their order, the conditions' order and
targets, the actions and their order all come from the rows. The differential tests
(``tests/test_compiler_differential.py``) run whole flows through it, through the loop
driver and through a stock ``transitions.Machine``, and require the same ends, states
and actions of all three.

Only names the generator makes appear in the source as code (``c0``, ``f2``, ``v5``,
``a1``); the spec's identifiers appear only as string literals (``repr``), and the
callables and steps are passed in as values, so no name in a policy can change what the
source does.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol, TypeVar


class Decided(Protocol):
    """What the generator reads of a compiled step (``compiler.Step``): where it leads."""

    @property
    def dest(self) -> str: ...


S = TypeVar("S", bound=Decided)
#: ``(condition name, predicate, the answer it needs)`` in the machine's order.
Guard = tuple[str, Callable[[Any], Any], bool]
#: ``(action name, callable, is a coroutine function)``.
Call = tuple[str, Callable[[Any], Any], bool]
#: One candidate: its guards, and the step and actions it decides.
Row = tuple[tuple[Guard, ...], tuple[S, tuple[Call, ...]]]
Probe = Callable[[str], None]
#: ``settle(ctx, probe)``: the terminal state reached and the step into it.
Settle = Callable[[Any, Probe | None], Coroutine[Any, Any, tuple[str, S | None]]]


class _Source:
    """Lines of Python at an indent, and the values the names in them stand for."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.values: dict[str, Any] = {}
        self._names: dict[tuple[str, int], str] = {}

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def name(self, prefix: str, value: Any) -> str:
        """The generated name of ``value`` (one per object, by identity)."""
        key = (prefix, id(value))
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = f"{prefix}{len(self._names)}"
            self.values[name] = value
        return name


def generate(
    states: Iterable[str],
    initial: str,
    terminal: frozenset[str],
    way_out: dict[str, tuple[str, tuple[Row[S], ...]]],
    *,
    max_steps: int,
    unmet: Callable[[str, str], Exception],
    over_budget: Callable[[str], Exception],
    no_way_out: Callable[[str], Exception],
) -> Settle[S]:
    """The flow's driver as one coroutine function; the same contract as the loop's
    ``run``: from ``initial`` to a terminal state within ``max_steps`` decisions, the
    context told each deciding step (``ctx.via``) where it has that attribute, ``probe``
    called with each action's name after it ran, and the same errors."""
    order = list(states)
    number = {state: i for i, state in enumerate(order)}
    src = _Source()
    src.values.update(_unmet=unmet, _over_budget=over_budget, _no_way_out=no_way_out)
    src.emit(0, "async def settle(ctx, probe):")
    src.emit(1, 'tell = hasattr(ctx, "via")')
    src.emit(1, "if tell:")
    src.emit(2, "ctx.via = None")
    if initial in terminal:
        src.emit(1, f"return {initial!r}, None")
    else:
        src.emit(1, f"state = {number[initial]}")
        src.emit(1, "steps = 0")
        src.emit(1, "while True:")
        keyword = "if"
        for state in order:
            if state in terminal:
                continue
            src.emit(2, f"{keyword} state == {number[state]}:  # {state!r}")
            keyword = "elif"
            _open_state(src, state, way_out.get(state), max_steps, number, terminal)
        src.emit(2, "else:")
        src.emit(3, "raise AssertionError(f'no such state: {state}')")
    namespace = dict(src.values)
    exec(compile("\n".join(src.lines) + "\n", "<flow driver>", "exec"), namespace)
    settle: Settle[S] = namespace["settle"]
    settle.source = "\n".join(src.lines)  # type: ignore[attr-defined]
    return settle


def _open_state(
    src: _Source,
    state: str,
    leave: tuple[str, tuple[Row[S], ...]] | None,
    max_steps: int,
    number: dict[str, int],
    terminal: frozenset[str],
) -> None:
    """One open state: the step budget, then its candidates in order, then unmet."""
    src.emit(3, f"if steps >= {max_steps}:")
    src.emit(4, f"raise _over_budget({state!r})")
    if leave is None:  # only with lint off: a dead end, or several triggers
        src.emit(3, f"raise _no_way_out({state!r})")
        return
    trigger, rows = leave
    memo = {name: f"a{i}" for i, name in enumerate(_condition_names(rows))}
    if memo:
        src.emit(3, " = ".join(memo.values()) + " = None")
    for guards, (step, calls) in rows:
        tests = [_test(src, memo, guard) for guard in guards]
        if not tests:  # a candidate without conditions: it wins, later ones never do
            _take(src, 3, step, calls, number, terminal)
            return
        src.emit(3, f"if {' and '.join(tests)}:")
        _take(src, 4, step, calls, number, terminal)
    src.emit(3, f"raise _unmet({trigger!r}, {state!r})")


def _condition_names(rows: tuple[Row[S], ...]) -> list[str]:
    names: list[str] = []
    for guards, _picked in rows:
        for name, _fn, _target in guards:
            if name not in names:
                names.append(name)
    return names


def _test(src: _Source, memo: dict[str, str], guard: Guard) -> str:
    """A guard as an expression: the condition asked once per decision, then compared."""
    name, fn, target = guard
    answer = memo[name]
    predicate = src.name("c", fn)
    asked = f"({answer} if {answer} is not None else ({answer} := bool({predicate}(ctx))))"
    return asked if target else f"not {asked}"


def _take(
    src: _Source,
    depth: int,
    step: Decided,
    calls: tuple[Call, ...],
    number: dict[str, int],
    terminal: frozenset[str],
) -> None:
    """What the loop does with a picked row: tell, count, run the actions, move on."""
    via = src.name("v", step)
    src.emit(depth, "if tell:")
    src.emit(depth + 1, f"ctx.via = {via}")
    src.emit(depth, "steps += 1")
    for name, fn, is_async in calls:
        action = src.name("f", fn)
        src.emit(depth, f"await {action}(ctx)" if is_async else f"{action}(ctx)")
        src.emit(depth, "if probe is not None:")
        src.emit(depth + 1, f"probe({name!r})")
    if step.dest in terminal:
        src.emit(depth, f"return {step.dest!r}, {via}")
    else:
        src.emit(depth, f"state = {number[step.dest]}")
        src.emit(depth, "continue")

"""A plugin step cannot stop the service: off the event loop, within a budget, timed.

A flow whose way out of one state asks a plugin condition, and whose transitions run a
plugin's sync and async actions, is driven as a service drives it (``offload``, on a real
event loop) and as the simulated world does (inline, coroutines driven by hand). A step
that blocks fails its delivery retryably while it still blocks, with the event loop
free; a step that calls exit fails its delivery instead of stopping the process; slow
and over-budget steps are counted per YAML step.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from stovepipe_fsm.domain.errors import Retryable
from stovepipe_fsm.located.yaml_source import parse_yaml
from stovepipe_fsm.machine.compiler import CompiledFlow
from stovepipe_fsm.machine.lint import lint_machine
from stovepipe_fsm.machine.loader import parse_machine
from stovepipe_fsm.machine.plugin_calls import PluginExited, StepOverBudget, StepWatch
from stovepipe_fsm.machine.registry import Registry

FLOW_YAML = """\
name: guarded
kind: flow
initial: start
states:
  - start
  - asked
  - name: done
    terminal: true
  - name: refused
    terminal: true
transitions:
  - {trigger: go, source: start, dest: asked, after: builtin_step}
  - {trigger: decide, source: asked, dest: done, conditions: plugin_says_yes,
     after: [plugin_sync_step, plugin_async_step, finish]}
  - {trigger: decide, source: asked, dest: refused, unless: plugin_says_yes, after: finish}
"""


@dataclass
class Ctx:
    """What the steps do: block, exit, or answer; and what ran."""

    answer: bool = True
    block: threading.Event | None = None
    entered: threading.Event = field(default_factory=threading.Event)
    exit_in: str = ""
    sleep_s: float = 0.0
    log: list[str] = field(default_factory=list)


BUILTIN = Registry("guarded")
PLUGIN = Registry("guarded", origin="tests.plugin_under_test")


@BUILTIN.action()
def builtin_step(ctx: Ctx) -> None:
    """A step of the built-in vocabulary: runs inline."""
    ctx.log.append(f"builtin on {threading.current_thread().name}")


@BUILTIN.action(finishes=True)
def finish(ctx: Ctx) -> None:
    """Ends the flow."""
    ctx.log.append("finish")


@PLUGIN.condition()
def plugin_says_yes(ctx: Ctx) -> bool:
    """A plugin condition that may block, exit or be slow."""
    ctx.log.append(f"condition on {threading.current_thread().name}")
    ctx.entered.set()
    if ctx.block is not None:
        ctx.block.wait(30)
    if ctx.exit_in == "condition":
        sys.exit(3)
    if ctx.sleep_s:
        threading.Event().wait(ctx.sleep_s)
    return ctx.answer


@PLUGIN.action()
def plugin_sync_step(ctx: Ctx) -> None:
    """A plugin's synchronous action."""
    ctx.log.append(f"sync action on {threading.current_thread().name}")
    if ctx.exit_in == "sync":
        sys.exit(4)


@PLUGIN.action()
async def plugin_async_step(ctx: Ctx) -> None:
    """A plugin's coroutine action."""
    if ctx.exit_in == "async":
        sys.exit(5)
    ctx.log.append("async action")


def registry() -> Registry:
    merged = BUILTIN.copy()
    merged.conditions.update(PLUGIN.conditions)
    merged.actions.update(PLUGIN.actions)
    return merged


def flow(watch: StepWatch) -> CompiledFlow:
    spec = parse_machine(parse_yaml(FLOW_YAML, "guarded.yaml"))
    assert lint_machine(spec, {"guarded": registry()}) == []
    return CompiledFlow(spec, registry(), watch=watch)


async def test_offloaded_plugin_steps_run_off_the_event_loop_and_decide_the_same() -> None:
    compiled = flow(StepWatch())
    ctx = Ctx()
    assert await compiled.run(ctx, offload=True) == "done"
    loop_thread = threading.current_thread().name
    assert ctx.log[0] == f"builtin on {loop_thread}"
    assert ctx.log[1].startswith("condition on plugin steps: guarded")
    assert ctx.log[2].startswith("sync action on plugin steps: guarded")
    assert ctx.log[3:] == ["async action", "finish"]
    assert await compiled.run(Ctx(answer=False), offload=True) == "refused"


async def test_without_offload_plugin_steps_run_inline_even_on_an_event_loop() -> None:
    compiled = flow(StepWatch())
    ctx = Ctx()
    coro = compiled.run(ctx)  # the simulated world's way: never suspends
    with pytest.raises(StopIteration) as stopped:
        coro.send(None)
    assert stopped.value.value == "done"
    here = threading.current_thread().name
    assert ctx.log[:3] == [f"builtin on {here}", f"condition on {here}", f"sync action on {here}"]


def test_without_an_event_loop_plugin_steps_run_inline() -> None:
    compiled = flow(StepWatch())
    ctx = Ctx()
    coro = compiled.run(ctx)
    with pytest.raises(StopIteration) as stopped:
        coro.send(None)
    assert stopped.value.value == "done"
    here = threading.current_thread().name
    assert ctx.log[:3] == [f"builtin on {here}", f"condition on {here}", f"sync action on {here}"]


async def test_a_blocking_plugin_condition_fails_its_delivery_while_the_loop_runs_on() -> None:
    watch = StepWatch(budget_s=0.2)
    compiled = flow(watch)
    release = threading.Event()
    ctx = Ctx(block=release)
    delivery = asyncio.ensure_future(compiled.run(ctx, offload=True))
    # The condition is in its thread, blocked; the loop still runs this coroutine.
    assert await asyncio.get_running_loop().run_in_executor(None, ctx.entered.wait, 10)
    ticks = 0
    while not delivery.done():
        ticks += 1
        await asyncio.sleep(0.01)
    with pytest.raises(StepOverBudget) as failed:
        await delivery
    assert not release.is_set(), "the delivery failed while the condition still blocked"
    assert ticks > 0
    assert isinstance(failed.value, Retryable)
    assert "guarded.yaml:" in str(failed.value) and "state 'asked'" in str(failed.value)
    [(where, count)] = watch.over_budget.items()
    assert count == 1 and where.startswith("guarded.yaml:")
    # A delivery that needs no plugin step is decided meanwhile; one that does waits
    # behind the stuck step and fails the same way, until it returns.
    queued = asyncio.ensure_future(compiled.run(Ctx(), offload=True))
    with pytest.raises(StepOverBudget):
        await queued
    release.set()
    assert await compiled.run(Ctx(), offload=True) == "done"


@pytest.mark.parametrize("where", ["condition", "sync", "async"])
async def test_a_plugin_step_that_exits_fails_its_delivery_not_the_process(where: str) -> None:
    compiled = flow(StepWatch())
    with pytest.raises(PluginExited, match="the plugin called exit") as failed:
        await compiled.run(Ctx(exit_in=where), offload=True)
    assert isinstance(failed.value, Retryable)
    assert await compiled.run(Ctx(), offload=True) == "done"


def test_a_plugin_step_that_exits_without_a_loop_fails_its_delivery() -> None:
    compiled = flow(StepWatch())
    coro = compiled.run(Ctx(exit_in="condition"))
    with pytest.raises(PluginExited):
        coro.send(None)


async def test_slow_plugin_steps_are_counted_at_their_yaml_step() -> None:
    watch = StepWatch(slow_s=0.01)
    compiled = flow(watch)
    assert await compiled.run(Ctx(sleep_s=0.05), offload=True) == "done"
    slow_steps: dict[str, Any] = dict(watch.slow)
    assert len(slow_steps) == 1
    [(where, count)] = slow_steps.items()
    assert count == 1
    assert where.startswith("guarded.yaml:") and "trigger 'decide'" in where
    assert watch.over_budget == {}

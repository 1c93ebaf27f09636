"""Counterexamples as timeline files, and replaying a timeline with the invariants on.

A counterexample is written as an ordinary ``simulate`` timeline: the queue, the config
the run used (``max_concurrent``, ``gate_wait_delay_ms``, ``max_attempts``), the commit
history (with the paths the ingested commits changed, when the policy has path classes)
and the steps of the shortest path. Each step carries, as a comment, what it did
when the checker replayed it, so the file reads as the story of the failure.

:func:`replay` is ``simulate`` with the checker's eyes: the same world builder and the
same step function, plus the declared state and edge invariants after every step and,
at the end, the progress check when declared (can fair actions alone still finish the
work?). It is how a written counterexample is confirmed, and how ``check --replay``
re-evaluates any timeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ...domain.errors import StovepipeError
from ...machine.invariants import InvariantCatalog
from ...ports.config import ConfigStore
from ...process.catalog import ProcessMachines
from ...simulation.replay import LogRow, Simulation, apply_step, build_world
from ...simulation.timeline import Timeline
from ...simulation.world import World
from .explorer import STEP_FAILED, Counterexample, Setup, can_finish
from .invariants import Rules, Scopes, Violation, check_edge, check_state, finishing, waiting
from .model import step_data
from .observe import observe
from .variants import Variant

DEFAULT_OUT = "check-counterexample.yaml"


@dataclass
class Replay:
    """The replayed world, its log, and the first violation (``step`` 0: the start)."""

    world: World
    rows: list[LogRow] = field(default_factory=list)
    violation: Violation | None = None
    step: int = 0

    def simulation(self) -> Simulation:
        return Simulation(self.world, self.rows)


def replay(
    timeline: Timeline,
    machines: ProcessMachines,
    config: ConfigStore,
    *,
    variant: Variant | None = None,
    catalog: InvariantCatalog | None = None,
    scopes: Scopes = (),
) -> Replay:
    """Run ``timeline`` step by step, stopping at the first broken declared property."""
    variant = variant or Variant()
    world = build_world(timeline, machines, config, lifecycle_factory=variant.lifecycle_factory)
    resolved = world.config.get(timeline.queue)
    rules = Rules.for_machines(
        machines,
        max_concurrent=int(resolved.param("max_concurrent")),
        history=timeline.history,
        bare_counter=variant.bare_counter,
        catalog=catalog,
        queue=timeline.queue,
        scopes=scopes,
        parameters=dict(resolved.parameters),
    )
    result = Replay(world)
    obs = observe(world)
    result.violation = check_state(obs, rules)
    if result.violation:
        return result
    for number, item in enumerate(timeline.steps, start=1):
        try:
            lines = apply_step(world, item)
        except (StovepipeError, ValueError) as exc:
            detail = f"{item.describe()}: {type(exc).__name__}: {exc}"
            result.violation = Violation(STEP_FAILED.invariant, STEP_FAILED.summary, detail)
            result.step = number
            return result
        for line in lines or ["-"]:
            result.rows.append(LogRow(number, world.clock.now_ms(), item.describe(), line))
        post = observe(world)
        violation = check_edge(obs, post, rules) or check_state(post, rules)
        if violation:
            result.violation, result.step = violation, number
            return result
        obs = post
    for invariant, completions in finishing(rules):
        if not can_finish(world, rules, timeline.queue, completions=completions):
            result.violation = Violation(invariant.name, invariant.summary, waiting(obs, rules))
            result.step = len(timeline.steps)
            break
    return result


def as_timeline(setup: Setup, counterexample: Counterexample) -> Timeline:
    """The counterexample as a parsed timeline, to replay it before writing it out."""
    steps = tuple(s for action in counterexample.trace for s in action.steps)
    history = {k: tuple(v) for k, v in setup.bounds.history().items()}
    return Timeline(
        "check",
        setup.bounds.queue,
        steps,
        setup.knobs(),
        history,
        changes=dict(changes_of(counterexample)),
    )


def changes_of(counterexample: Counterexample) -> dict[str, tuple[str, ...]]:
    """The paths each commit the trace ingested changed (none without path classes)."""
    changes: dict[str, tuple[str, ...]] = {}
    for action in counterexample.trace:
        changes.update(action.changed())
    return changes


def timeline_document(setup: Setup, counterexample: Counterexample) -> dict[str, Any]:
    """The counterexample as timeline data (what ``load_timeline`` reads back)."""
    queue = setup.bounds.queue
    violation = counterexample.violation
    document: dict[str, Any] = {
        "description": f"check counterexample - {violation.invariant}: {violation.detail}",
        "queue": queue,
        "config": setup.knobs(),
        "history": setup.bounds.history(),
    }
    changes = changes_of(counterexample)
    if changes:
        document["changes"] = {commit: list(paths) for commit, paths in changes.items()}
    document["steps"] = [step_data(s, queue) for a in counterexample.trace for s in a.steps]
    return document


def render_timeline(
    document: dict[str, Any],
    violation: Violation,
    replay_command: str,
    notes: list[str] | None = None,
) -> str:
    """The YAML text: a header saying what broke and how to replay, one step a line."""
    header = [
        "# Counterexample found by `stovepipe-fsm check`.",
        f"# Broken: {violation.invariant} - {violation.summary}",
        *(f"#   {line}" for line in violation.detail.splitlines()),
        f"# Replay: {replay_command}",
    ]
    keys = ("description", "queue", "config", "history", "changes")
    body = [f"{key}: {_flow(document[key])}" for key in keys if key in document]
    body.append("steps:" if document["steps"] else "steps: []")
    notes = notes or []
    for index, item in enumerate(document["steps"]):
        line = "  - " + _flow(item)
        if index < len(notes) and notes[index]:
            line = f"{line:<48} # {notes[index]}"
        body.append(line)
    return "\n".join(header + body) + "\n"


def _flow(value: Any) -> str:
    text: str = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000)
    text = text.strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def step_notes(result: Replay, steps: int) -> list[str]:
    """One comment per step: what the replay logged for it."""
    by_step: dict[int, list[str]] = {}
    for row in result.rows:
        by_step.setdefault(row.step, []).append(row.result)
    return ["; ".join(by_step.get(n, [])) for n in range(1, steps + 1)]


def write_counterexample(
    path: str | Path,
    setup: Setup,
    counterexample: Counterexample,
    replay_command: str,
    notes: list[str] | None = None,
) -> Path:
    target = Path(path)
    document = timeline_document(setup, counterexample)
    text = render_timeline(document, counterexample.violation, replay_command, notes)
    target.write_text(text, encoding="utf-8")
    return target

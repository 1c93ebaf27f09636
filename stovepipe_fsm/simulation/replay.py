"""Replay a :class:`Timeline` on a :class:`World`, recording a readable log.

Steps that act change the world; ``expect`` steps only read it (:mod:`.expectations`):
their results are kept on the :class:`Simulation`, shown as log rows, and counted in
``simulate --json``. Whether a failed expectation fails a command is the command's call:
``simulate`` shows it, ``test`` exits 1 on it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..adapters.memory import MemoryRequestStore
from ..domain.entities import Request
from ..domain.errors import IllegalOperation, NotFound, StovepipeError
from ..domain.ids import parse_request_id
from ..located.errors import SpecError, SpecIssue
from ..machine.parameters import as_json
from ..ports.config import ConfigStore
from ..process.catalog import ProcessMachines
from ..process.lifecycle import RequestLifecycle
from ..process.services import LifecycleFactory
from ..process.together import stepwise
from ..views.entities import queue_json, render_requests_and_queues, request_json
from .broker import run_sync
from .builds import BuildModel
from .expectations import Expectation, Result, evaluate, state_issues
from .timeline import Timeline, TimelineStep, config_issues, has_expectations
from .world import DeliveryReport, World

MAX_DELIVERIES_PER_RUN = 10_000


@dataclass
class LogRow:
    step: int
    time_ms: int
    action: str
    result: str


@dataclass
class Simulation:
    world: World
    rows: list[LogRow] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)  # every expect check, in order
    expects: bool = False  # whether the timeline has expect steps at all

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if not r.passed]


def build_world(
    timeline: Timeline,
    machines: ProcessMachines,
    config: ConfigStore,
    *,
    lifecycle_factory: LifecycleFactory = RequestLifecycle,
    keep_trail: bool = True,
    requests: MemoryRequestStore | None = None,
    seed: int = 0,
) -> World:
    """The world ``timeline`` runs in: its commit graph, ``config`` with the timeline's
    own values over it, ``requests`` when given (see :class:`World`), and the builds
    the timeline recorded, which end every build it starts (``seed`` draws the
    durations of commits never built live, :mod:`.builds`)."""
    world = World(
        machines,
        config,
        timeline.history,
        lifecycle_factory=lifecycle_factory,
        changes=timeline.changes,
        overrides=timeline.config,
        keep_trail=keep_trail,
        requests=requests,
    )
    if timeline.builds:
        roles = machines.roles
        # The outcome a broken or flaky build ends with: the red one, else any but green.
        outcomes = sorted(roles.outcomes.values(), key=lambda o: (not o.red, o.green, o.name))
        red = outcomes[0].name if outcomes and not outcomes[0].green else ""
        world.builds = BuildModel(
            timeline.builds,
            world.graph,
            roles.green_outcome.name,
            seed,
            timeline.culprits,
            timeline.flake_rate,
            red,
        )
    return world


def simulate(
    timeline: Timeline, machines: ProcessMachines, config: ConfigStore, *, seed: int = 0
) -> Simulation:
    """Run every step; a step that cannot apply raises SpecError at its location.

    Expected states are checked against the request machine, and the parameters the
    timeline sets against the machines' declarations, before anything runs: a state the
    machine does not declare, or an unknown parameter, is bad input, not a failed
    expectation.

    ``config`` is a loaded policy, fixed for the run: the world resolves each queue's
    config once (``config`` steps still apply above it).
    """
    check_input(timeline, machines)
    world = build_world(timeline, machines, config, seed=seed)
    sim = Simulation(world, expects=has_expectations(timeline))
    with stepwise():  # once for the whole run, not once per step
        _run(sim, timeline)
    return sim


def _run(sim: Simulation, timeline: Timeline) -> None:
    clock = sim.world.clock
    for number, step in enumerate(timeline.steps, start=1):
        if step.expect is not None:
            rows = _check(sim, step.expect)
            said = step.describe()
            sim.rows += [LogRow(number, clock.now_ms(), said, r) for r in rows]
            continue
        try:
            results = apply_step(sim.world, step)
        except (StovepipeError, ValueError) as exc:
            message = f"step {number} ({step.describe()}): {exc}"
            # The causes, not only the consequence: what deliveries raised before it.
            causes = [
                SpecIssue(step.location, f"before step {number}, {request_id} raised {error}")
                for request_id, error in dict.fromkeys(sim.world.raised)
            ]
            raise SpecError([SpecIssue(step.location, message), *causes]) from None
        said, now = step.describe(), clock.now_ms()
        sim.rows += [LogRow(number, now, said, result) for result in results or ["-"]]


def check_input(timeline: Timeline, machines: ProcessMachines) -> None:
    """``SpecError`` for what the timeline asks of the machines that they do not declare:
    expected states, and the parameters it sets (unknown, or values their declarations
    refuse)."""
    issues = [
        issue
        for step in timeline.steps
        if step.expect is not None
        for issue in state_issues(step.expect, machines.request.spec.state_names)
    ]
    outcomes = machines.roles.outcomes
    for build in timeline.builds:
        if build.outcome not in outcomes:
            declared = ", ".join(sorted(outcomes))
            message = f"builds: outcome {build.outcome!r} is not one of {declared}"
            issues.append(SpecIssue(build.location, message))
    issues += config_issues(timeline, machines.parameters)
    if issues:
        raise SpecError(issues)


def _check(sim: Simulation, expectation: Expectation) -> list[str]:
    """Evaluate an expect step; its log rows: one per failed check, one for the rest."""
    results = evaluate(sim.world, expectation)
    sim.results += results
    rows = [f"FAILED {r.message}" for r in results if not r.passed]
    passed = [r.check.key for r in results if r.passed]
    if passed:
        rows.append(f"ok ({', '.join(passed)})")
    return rows


def apply_step(world: World, step: TimelineStep, *, rows: bool = True) -> list[str]:
    """Run one acting step on ``world``; its log rows, or ``[]`` when ``rows`` is off.

    A replay that keeps no log (``whatif``, ``check``) turns ``rows`` off: describing a
    delivery reads the request again and formats a sentence, a few percent of a long
    replay.
    """
    kind = step.kind
    say = explain if rows else _unsaid
    if kind in ("ingest", "return"):
        result = world.ingest(step.queue, step.uri, at_head=kind == "return")
        if not rows:
            return []
        verb = "created" if result.created else "existing"
        sent = "published" if result.published else "not published"
        return [f"{result.request_id} ({verb}, {sent})"]
    if kind in ("deliver", "stall"):
        report = world.stall(step.value) if kind == "stall" else world.deliver_next()
        return [say(world, report)] if report else ["nothing due"]
    if kind == "run":
        out = []
        for _ in range(MAX_DELIVERIES_PER_RUN):
            event = world.next_event()
            if event is None:
                break
            out.append(_said(world, event, say))
        else:
            raise ValueError(f"run did not settle after {MAX_DELIVERIES_PER_RUN} deliveries")
        return out or ["nothing due"]
    if kind == "run_ms":
        events = world.run_for(step.amount, MAX_DELIVERIES_PER_RUN)
        if not rows:
            return []
        said = [_said(world, event, say) for event in events]
        return [*said, f"clock at {world.clock.now_ms()} ms"]
    if kind == "advance_ms":
        world.advance(step.amount)
        return [f"clock at {world.clock.now_ms()} ms"]
    if kind == "crash":
        world.armed_crash = step.value
        return [f"next delivery reaching {step.value} dies there"]
    if kind == "source_control":
        world.graph.set_available(step.value == "up")
        return [f"source control {step.value}"]
    if kind == "config":
        world.config.set(step.queue, dict(step.values))
        shown = ", ".join(f"{k}={json.dumps(as_json(v))}" for k, v in step.values)
        return [f"queue {step.queue}: {shown}"]
    request_id = request_id_of(world, step)
    if kind == "complete":
        request = world.complete(request_id, step.outcome)
        if not rows:
            return []
        return [f"{request.id} {request.state}; {_queue_summary(world, request.queue)}"]
    if kind == "resume":
        return [say(world, world.resume(request_id))]
    if kind == "redeliver":
        world.redeliver(request_id)
        return [f"duplicate process message for {request_id}"]
    if kind == "cancel":
        return [_cancelled(world, request_id)]
    if kind == "retry":
        return [_retried(world, request_id)]
    if kind == "failing":
        world.fail_deliveries(request_id)
        return [f"every delivery of {request_id} fails from now on"]
    if kind == "dead_letter":
        ended = world.dead_letter(request_id)
        state = ended.state if ended else "missing"
        return [f"{request_id} {state}; {_queue_summary(world, step.queue)}"]
    raise ValueError(f"unknown step {kind!r}")


def _unsaid(world: World, report: DeliveryReport) -> str:
    return ""


def _said(
    world: World, event: DeliveryReport | Request, say: Callable[[World, DeliveryReport], str]
) -> str:
    """A log row for a delivery, or for a build that ended (:mod:`.builds`)."""
    if isinstance(event, Request):
        return f"{event.id} build ended: {event.state}; {_queue_summary(world, event.queue)}"
    return say(world, event)


def _retried(world: World, request_id: str) -> str:
    """The log row of a retry: the new request, or why the verb refused."""
    try:
        result = world.retry(request_id)
    except IllegalOperation as exc:
        return f"{request_id} retry refused: {exc}"
    return f"{request_id} retried as {result.request_id}"


def _cancelled(world: World, request_id: str) -> str:
    """The log row of a cancel: the head it ended, or why the verb refused (an operator
    sees the refusal and the pipeline goes on, so the timeline does too)."""
    try:
        result = world.cancel(request_id)
    except IllegalOperation as exc:
        return f"{request_id} cancel refused: {exc}"
    if not result.cancelled:
        return f"{request_id} already {result.request.state} (cancel repeated)"
    return f"{request_id} {result.request.state}; {_queue_summary(world, result.request.queue)}"


def request_id_of(world: World, step: TimelineStep) -> str:
    """The request the timeline's step names by its uri; ``ValueError`` when none."""
    request_id = world.request_for(step.queue, step.uri)
    if request_id is None:
        raise ValueError(f"no request for uri {step.uri!r} in queue {step.queue!r}")
    return request_id


def _queue_summary(world: World, queue: str) -> str:
    try:
        row = run_sync(world.queues.get(queue))
    except NotFound:
        return f"queue {queue} missing"
    return f"in_flight={row.in_flight_count}"


def explain(world: World, report: DeliveryReport) -> str:
    request = world.find_request(report.request_id)
    label = f"{report.request_id} ({request.uri})" if request else report.request_id
    if report.outcome == "dead_letter" and request is not None:
        queue = _queue_summary(world, request.queue)
        return f"{label}: dead_letter ({report.detail}); request {request.state}; {queue}"
    if report.outcome in ("crashed", "retry", "dead_letter"):
        return f"{label}: {report.outcome} ({report.detail})"
    if report.outcome == "stalled":
        return f"{label}: in hand, stalled {report.detail} (message due again)"
    if report.detail:  # a resumed delivery whose message another delivery settled
        return f"{label}: {report.outcome} late, {report.detail}; request {_state(request)}"
    if request is None:
        return f"{label}: {report.outcome}"
    if report.outcome == "held":
        return f"{label}: held ({report.hold_reason or 'no reason recorded'})"
    roles = world.machines.roles
    if request.state in roles.admitted_states:
        if report.state_before in roles.admitted_states:
            return f"{label}: already {request.state} -> start re-announced, build re-published"
        base = f" base {request.base_uri}" if request.base_uri else ""
        return f"{label}: admitted {request.build_strategy}{base} -> build"
    if request.state in roles.superseded_states:
        return f"{label}: {request.state} by {request.superseded_by}"
    return f"{label}: {request.state}, acked"


def _state(request: Request | None) -> str:
    return request.state if request else "missing"


def result_json(world: World, sim: Simulation | None = None) -> dict[str, Any]:
    """The ``simulate --json`` document; ``status --json`` shares its ``requests`` and
    ``queues`` entries, not its other keys. With a simulation of a timeline that has
    expect steps, ``expectations`` counts the checks that passed and lists those that
    failed (line, column and message)."""
    requests = sorted(world.requests.snapshot(), key=lambda r: _order(r.id))
    doc: dict[str, Any] = {
        "requests": [request_json(r) for r in requests],
        "queues": [queue_json(q) for q in sorted(world.queues.snapshot(), key=lambda q: q.name)],
        "builds": [p.request_id for p in world.published.builds()],
        "hooks": [
            {"id": p.dedup_id, "type": p.event_type, "request_id": p.request_id, "queue": p.queue}
            for p in world.published.hooks()
        ],
        "holds": world.holds,
        "pending": len(world.broker.messages),
    }
    if world.in_hand:
        doc["in_hand"] = len(world.in_hand)
    if world.dead_letters:  # what the runtime dead-lettered, in order: the request and why
        doc["dead_letters"] = [
            {"request_id": rid, "reason": reason} for rid, reason in world.dead_letters
        ]
    if world.builds:  # how the builds a replay started ended (:mod:`.builds`)
        builds = world.builds
        doc["recorded_builds"] = {
            "recorded": builds.from_record,
            "inferred": builds.inferred,
            "seed": builds.seed,
        }
    if sim is not None and sim.expects:
        doc["expectations"] = {
            "passed": sum(1 for r in sim.results if r.passed),
            "failed": [
                {
                    "line": r.check.location.line,
                    "column": r.check.location.column,
                    "message": r.message,
                }
                for r in sim.failures
            ],
        }
    return doc


def _order(request_id: str) -> tuple[str, int]:
    rid = parse_request_id(request_id)
    return (rid.queue, rid.counter)


def render_table(sim: Simulation) -> str:
    rows = [("#", "t(ms)", "step", "result")]
    rows += [(str(r.step), str(r.time_ms), r.action, r.result) for r in sim.rows]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(row[c].ljust(widths[c]) for c in range(3)) + "  " + row[3])
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    lines.append("")
    lines.append(final_table(sim.world))
    if sim.expects:
        failed = len(sim.failures)
        lines.append(f"expectations: {len(sim.results) - failed} passed, {failed} failed")
    return "\n".join(lines)


def final_table(world: World) -> str:
    doc = result_json(world)
    lines = render_requests_and_queues(doc, heading="final requests:")
    lines.append(
        f"builds: {', '.join(doc['builds']) or '-'}; hooks: {len(doc['hooks'])}; "
        f"holds: {doc['holds']}; pending: {doc['pending']}"
    )
    if "recorded_builds" in doc:
        ended = doc["recorded_builds"]
        lines.append(
            f"build outcomes: {ended['recorded']} recorded, {ended['inferred']} inferred "
            f"(durations drawn with seed {ended['seed']})"
        )
    return "\n".join(lines)

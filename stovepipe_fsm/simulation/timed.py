"""Replay a timeline and time every request on the world's clock: ingest, admit, end.

A timeline's clock is the world's clock (``advance_ms`` steps move it), so each request
write is stamped with the clock at the end of the step that made it: every write of one
step happens at one simulated instant. The writes are seen through the world's request
store (:class:`WriteLog`), so whatever a policy's machines write is timed, not only what
the shipped machines are known to write.

The same timeline replayed under another policy meets ``complete`` steps written for a
different schedule. A ``complete`` step is the build system's answer for that head:

- the head is building (admitted): the outcome is recorded then, as ``simulate`` does;
- the head is still waiting for admission: the outcome is kept and recorded at the end of
  the first later step after which the head is building (the build answers as soon as it
  runs, the policy is not charged the build's duration twice);
- the head ended without being built (superseded, or failed closed) or already ended:
  the outcome has nothing to apply to and is dropped.

``expect`` steps are skipped: they assert on the run of one policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..adapters.memory import MemoryRequestStore
from ..domain.entities import Request
from ..domain.errors import StovepipeError
from ..located.errors import SpecError, SpecIssue
from ..ports.config import ConfigStore
from ..process.catalog import ProcessMachines
from ..process.together import stepwise
from .broker import run_sync
from .replay import apply_step, build_world, check_input, request_id_of
from .timeline import Timeline, TimelineStep
from .world import World


class WriteLog(MemoryRequestStore):
    """The in-memory request store, remembering every request it wrote since the last
    :meth:`drain`, in write order."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[Request] = []

    async def create(self, entity: Request) -> None:
        await super().create(entity)
        self.written.append(entity)

    async def update(self, entity: Request, old_version: int, new_version: int) -> None:
        await super().update(entity, old_version, new_version)
        self.written.append(entity)

    def drain(self) -> list[Request]:
        written, self.written = self.written, []
        return written


@dataclass
class RequestTimes:
    """When one request was ingested, admitted and ended, in the timeline's clock (ms);
    ``None`` for what did not happen within the timeline."""

    ingest_ms: int
    admitted_ms: int | None = None
    ended_ms: int | None = None


@dataclass
class TimedRun:
    """The world after the timeline, with every request's times and the fate of the
    timeline's ``complete`` steps."""

    world: World
    times: dict[str, RequestTimes] = field(default_factory=dict)
    completes_applied: int = 0
    completes_dropped: int = 0
    completes_waiting: int = 0  # kept for a head that was never admitted before the end


def replay_timed(
    timeline: Timeline, machines: ProcessMachines, config: ConfigStore, *, seed: int = 0
) -> TimedRun:
    """Run every acting step of ``timeline``, timing each request.

    Input problems are reported as :func:`~.replay.simulate` reports them: located
    ``SpecError``\\ s, before anything runs, or at the step that cannot apply.
    """
    check_input(timeline, machines)
    # No decision trail: a what-if compares outcomes, and a long timeline's trail costs.
    log = WriteLog()
    world = build_world(timeline, machines, config, keep_trail=False, requests=log, seed=seed)
    run = TimedRun(world)
    # A step that moves the clock (run_ms) times each event at its own instant.
    run.world.after_event = lambda: _stamp(run, log.drain())
    waiting: dict[str, tuple[TimelineStep, int]] = {}  # request id -> its complete step
    with stepwise():  # once for the whole run, not once per step
        _run(run, timeline, waiting, log)
    run.completes_waiting = len(waiting)
    return run


def _run(
    run: TimedRun, timeline: Timeline, waiting: dict[str, tuple[TimelineStep, int]], log: WriteLog
) -> None:
    world = run.world
    for number, step in enumerate(timeline.steps, start=1):
        if step.expect is not None:
            continue
        try:
            if step.kind == "complete":
                _complete(run, step, number, waiting)
            else:
                apply_step(world, step, rows=False)
            written = log.drain()
            _stamp(run, written)
            if waiting and written:
                _complete_waiting(run, waiting, written, log)
        except (StovepipeError, ValueError) as exc:
            message = f"step {number} ({step.describe()}): {exc}"
            raise SpecError([SpecIssue(step.location, message)]) from None


def _stamp(run: TimedRun, written: list[Request]) -> None:
    """Time the writes of the step that just ran at the clock's present reading."""
    if not written:
        return
    now = run.world.clock.now_ms()
    roles = run.world.machines.roles
    terminal = run.world.stages.lifecycle.is_terminal
    times = run.times
    for request in written:
        entry = times.get(request.id)
        if entry is None:
            entry = times[request.id] = RequestTimes(now)
        if entry.admitted_ms is None and request.state in roles.admitted_states:
            entry.admitted_ms = now
        if entry.ended_ms is None and terminal(request):
            entry.ended_ms = now


def _complete(
    run: TimedRun, step: TimelineStep, number: int, waiting: dict[str, tuple[TimelineStep, int]]
) -> None:
    world = run.world
    request_id = request_id_of(world, step)
    request = run_sync(world.requests.get(request_id))
    if request.state in world.machines.roles.admitted_states:
        world.complete(request_id, step.outcome)
        run.completes_applied += 1
    elif request.state == world.machines.roles.initial:
        waiting[request_id] = (step, number)
    else:
        run.completes_dropped += 1


def _complete_waiting(
    run: TimedRun,
    waiting: dict[str, tuple[TimelineStep, int]],
    moved: list[Request],
    log: WriteLog,
) -> None:
    """Record the kept outcomes of heads that are now building; drop those that ended.

    Only a request written in the step that just ran (``moved``) can have changed, so
    only those are looked at; outcomes are recorded in the order of their steps.
    """
    roles = run.world.machines.roles
    ready = []
    for request_id in {r.id for r in moved if r.id in waiting}:
        request = run_sync(run.world.requests.get(request_id))
        if request.state in roles.admitted_states:
            step, number = waiting.pop(request_id)
            ready.append((number, request_id, step.outcome))
        elif request.state != roles.initial:
            del waiting[request_id]
            run.completes_dropped += 1
    for _, request_id, outcome in sorted(ready):
        run.world.complete(request_id, outcome)
        run.completes_applied += 1
    _stamp(run, log.drain())

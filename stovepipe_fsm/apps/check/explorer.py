"""Breadth-first search over world states, then a progress pass over the explored graph.

Theory of operation
-------------------
A state is an :class:`Observation` of a world plus the :class:`Budget` its path spent.
The search keeps one live :class:`World` per frontier state; expanding a state forks
that world once per enabled action and performs the action on the fork with the real
controller. A successor whose (observation, budget) was seen before is not expanded
again, but its edge still counts: transition invariants are checked on every edge, and
every *fair* edge is remembered backwards for the progress pass.

Breadth-first order makes the first violation found a shortest one: state invariants
are checked when a state is first reached (its BFS depth is minimal), edge invariants
while expanding depth ``d``, before any state of depth ``d + 1`` is expanded.

Faults are only tried where they can matter: the plain delivery of a head is performed
first, and its crash and outage variants only when it wrote something or asked source
control (:class:`~.actions.DeliveryEffect`); otherwise they re-reach known states.

Progress (liveness) on the finite graph, when the policy declares it: the quiescent
states are marked, then a reverse breadth-first search over fair edges only (deliveries,
clock advances, completions, source control recovering) marks every state that can
still get there. A state left unmarked is a wedge or a lost head: no amount of fair
behaviour finishes its work. The reported one is the unmarked state of least depth,
with its shortest path.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ...ports.config import ConfigStore
from ...process.catalog import ProcessMachines
from ...process.gate import MAX_BASELINE_LAG, MAX_VALIDATION_MS, PAUSED
from ...process.services import DeclaredDefaults
from ...simulation.runtime import OverrideConfigStore, ResolvedOnceConfigStore
from ...simulation.world import World
from ...spec.invariants import INVARIANTS, InvariantCatalog
from .actions import DeliveryEffect, StepFailed, enabled, perform
from .invariants import (
    LEASE_BOUNDS_STALL,
    PROGRESS,
    Invariant,
    Rules,
    Violation,
    check_edge,
    check_state,
    quiescent,
    waiting,
)
from .model import COMPLETE, DELIVER, Action, Bounds, Budget
from .observe import Observation, observe
from .variants import Variant

DEFAULT_MAX_STATES = 500_000
PROGRESS_EVERY_S = 2.0
CLOSURE_LIMIT = 100_000
STEP_FAILED = Violation(
    "steps_apply",
    "every environment step applies (ingest, record and reconcile do not raise)",
    "",
)


@dataclass(frozen=True)
class Setup:
    """Everything that fixes one exploration (one ``max_concurrent``)."""

    machines: ProcessMachines
    config: ConfigStore
    bounds: Bounds
    max_concurrent: int
    variant: Variant = field(default_factory=Variant)
    catalog: InvariantCatalog = INVARIANTS  # where declared names not built in are found

    @property
    def gate_wait_delay_ms(self) -> int:
        """The hold delay of the checked queue: its config, else the declared default."""
        config = DeclaredDefaults(self.config, self.machines.parameter_defaults)
        return int(config.get(self.bounds.queue).param("gate_wait_delay_ms"))

    def knobs(self) -> dict[str, Any]:
        """The config a replay needs: written into the counterexample timeline (with
        ``paused`` only when the checked queue's config pauses it)."""
        knobs: dict[str, Any] = {
            "max_concurrent": self.max_concurrent,
            "gate_wait_delay_ms": self.gate_wait_delay_ms,
            "max_attempts": self.bounds.max_attempts,
        }
        if dict(self.config.get(self.bounds.queue).parameters).get(PAUSED):
            knobs[PAUSED] = True
        if self.max_baseline_lag:
            knobs[MAX_BASELINE_LAG] = self.max_baseline_lag
        if self.max_validation_ms:
            knobs[MAX_VALIDATION_MS] = self.max_validation_ms
        return knobs

    @property
    def max_baseline_lag(self) -> int:
        """The checked queue's lag bound (0, no bound, when the policy declares none)."""
        return self._declared(MAX_BASELINE_LAG)

    @property
    def max_validation_ms(self) -> int:
        """The checked queue's slot lease (0, none, when the policy declares none)."""
        return self._declared(MAX_VALIDATION_MS)

    def _declared(self, name: str) -> int:
        config = DeclaredDefaults(self.config, self.machines.parameter_defaults)
        return int(dict(config.get(self.bounds.queue).parameters).get(name, 0))

    def rules(self) -> Rules:
        return Rules.for_machines(
            self.machines,
            max_concurrent=self.max_concurrent,
            history=self.bounds.history(),
            bare_counter=self.variant.bare_counter,
            catalog=self.catalog,
            max_baseline_lag=self.max_baseline_lag,
            max_validation_ms=self.max_validation_ms,
        )

    def new_world(self) -> World:
        # The policy cannot change during a check: each queue is resolved once.
        config = ResolvedOnceConfigStore(OverrideConfigStore(self.config, self.knobs()))
        return World(
            self.machines,
            config,
            self.bounds.history(),
            lifecycle_factory=self.variant.lifecycle_factory,
            keep_trail=False,
        )


@dataclass(frozen=True)
class Counterexample:
    violation: Violation
    trace: tuple[Action, ...]


@dataclass(frozen=True)
class Result:
    max_concurrent: int
    states: int
    transitions: int
    depth: int
    seconds: float
    complete: bool
    counterexample: Counterexample | None = None
    cpu_seconds: float = 0.0  # processor time of the exploring process

    @property
    def ok(self) -> bool:
        return self.complete and self.counterexample is None

    @property
    def states_per_second(self) -> float:
        """Explored states per second of wall time: the checker's throughput."""
        return rate(self.states, self.seconds)


def rate(count: int, seconds: float) -> float:
    """``count`` per second (0 when no time was measured)."""
    return count / seconds if seconds > 0 else 0.0


Progress = Callable[[str], None]


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextmanager
def quiet_logs() -> Iterator[None]:
    """The controller's warnings are expected under crashes; thousands would drown output."""
    logger = logging.getLogger("stovepipe_fsm")
    previous = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(previous)


class Explorer:
    def __init__(
        self,
        setup: Setup,
        *,
        max_states: int = DEFAULT_MAX_STATES,
        progress: Progress | None = None,
        prune_faults: bool = True,
        reuse_worlds: bool = True,
    ) -> None:
        self.setup = setup
        self.prune_faults = prune_faults
        self.reuse_worlds = reuse_worlds  # the last action of a state runs on its world
        self.rules = setup.rules()
        self.max_states = max_states
        self.progress = progress
        self.parent: list[int] = []
        self.via: list[Action | None] = []
        self.depth: list[int] = []
        self.observations: list[Observation] = []
        self.fair_into: list[list[int]] = []
        # Fair edges other than build completions, kept only when the lease pass runs.
        self.stall_into: list[list[int]] | None = (
            [] if self.rules.proof.lease_bounds_stall and self.rules.max_validation_ms else None
        )
        self.transitions = 0
        self.attempts = 0  # actions performed, including those that were no real edge

    # --- search ---------------------------------------------------------------------

    def run(self) -> Result:
        started, cpu = time.perf_counter(), time.process_time()
        with quiet_logs():
            counterexample, complete = self._search(started)
            if counterexample is None and complete and self.rules.proof.progress:
                counterexample = self._progress_pass()
            if counterexample is None and complete and self.stall_into is not None:
                counterexample = self._lease_pass()
        return Result(
            max_concurrent=self.setup.max_concurrent,
            states=len(self.parent),
            transitions=self.transitions,
            depth=max(self.depth, default=0),
            seconds=time.perf_counter() - started,
            complete=complete,
            counterexample=counterexample,
            cpu_seconds=time.process_time() - cpu,
        )

    def _search(self, started: float) -> tuple[Counterexample | None, bool]:
        setup, rules, bounds = self.setup, self.rules, self.setup.bounds
        root = setup.new_world()
        root_obs = observe(root)
        index: dict[tuple[Observation, Budget], int] = {}
        self._add(index, root_obs, Budget(), -1, None)
        violation = check_state(root_obs, rules)
        if violation:
            return Counterexample(violation, ()), True
        frontier = deque([(0, root, root_obs, Budget())])
        next_report = started + PROGRESS_EVERY_S
        while frontier:
            sid, world, obs, budget = frontier.popleft()
            effect: DeliveryEffect | None = None
            actions = enabled(obs, budget, bounds, rules)
            calls_before = world.graph.calls
            for i, action in enumerate(actions):
                if not self._taken(effect, action):
                    continue
                self.attempts += 1
                # The frontier's world is needed by no one after its last action: that
                # one runs on the world itself, every other one on a fork.
                last = self.reuse_worlds and not any(
                    self._taken(effect, later) for later in actions[i + 1 :]
                )
                try:
                    twin = perform(world, action, in_place=last)
                except StepFailed as exc:
                    failed = Violation(STEP_FAILED.invariant, STEP_FAILED.summary, str(exc))
                    return Counterexample(failed, self.trace(sid, action)), True
                if twin is None:
                    continue
                self.transitions += 1
                post = observe(twin)
                if action.kind == DELIVER:
                    effect = DeliveryEffect.of(obs, post, calls_before, twin)
                violation = check_edge(obs, post, rules)
                if violation:
                    return Counterexample(violation, self.trace(sid, action)), True
                spent = budget.spend(action.kind)
                dst = index.get((post, spent))
                if dst is None:
                    dst = self._add(index, post, spent, sid, action)
                    violation = check_state(post, rules)
                    if violation:
                        return Counterexample(violation, self.trace(dst)), True
                    if len(self.parent) >= self.max_states:
                        return None, False
                    frontier.append((dst, twin, post, spent))
                if action.fair:
                    self.fair_into[dst].append(sid)
                    if self.stall_into is not None and action.kind != COMPLETE:
                        self.stall_into[dst].append(sid)
            if self.progress and time.perf_counter() >= next_report:
                next_report = time.perf_counter() + PROGRESS_EVERY_S
                self.progress(self._status(started, len(frontier), self.depth[sid]))
        return None, True

    def _taken(self, effect: DeliveryEffect | None, action: Action) -> bool:
        """Whether the search performs ``action`` after a delivery that did ``effect``."""
        return not self.prune_faults or effect is None or effect.worth(action)

    def _add(
        self,
        index: dict[tuple[Observation, Budget], int],
        obs: Observation,
        budget: Budget,
        parent: int,
        action: Action | None,
    ) -> int:
        sid = len(self.parent)
        index[(obs, budget)] = sid
        self.parent.append(parent)
        self.via.append(action)
        self.depth.append(self.depth[parent] + 1 if parent >= 0 else 0)
        self.observations.append(obs)
        self.fair_into.append([])
        if self.stall_into is not None:
            self.stall_into.append([])
        return sid

    def _status(self, started: float, frontier: int, depth: int) -> str:
        elapsed = time.perf_counter() - started
        return (
            f"check max_concurrent={self.setup.max_concurrent}: {len(self.parent)} states, "
            f"{self.transitions} transitions, depth {depth}, frontier {frontier}, "
            f"{elapsed:.1f} s, {rate(len(self.parent), elapsed):.0f} states/s"
        )

    def trace(self, sid: int, last: Action | None = None) -> tuple[Action, ...]:
        """The actions on the BFS-tree path from the initial state to ``sid`` (+ ``last``)."""
        path: list[Action] = [] if last is None else [last]
        while sid > 0:
            action = self.via[sid]
            assert action is not None
            path.append(action)
            sid = self.parent[sid]
        return tuple(reversed(path))

    # --- progress -------------------------------------------------------------------

    def _progress_pass(self) -> Counterexample | None:
        return self._finish_pass(self.fair_into, PROGRESS)

    def _lease_pass(self) -> Counterexample | None:
        """No build ever reports: leases alone must let every waiting head through."""
        assert self.stall_into is not None
        return self._finish_pass(self.stall_into, LEASE_BOUNDS_STALL)

    def _finish_pass(self, into: list[list[int]], invariant: Invariant) -> Counterexample | None:
        """The first state (BFS order) from which the edges in ``into`` reach no
        quiescent state, as a counterexample of ``invariant``."""
        count = len(self.parent)
        can_finish = bytearray(count)
        todo = deque(i for i in range(count) if quiescent(self.observations[i], self.rules))
        for sid in todo:
            can_finish[sid] = 1
        while todo:
            dst = todo.popleft()
            for src in into[dst]:
                if not can_finish[src]:
                    can_finish[src] = 1
                    todo.append(src)
        for sid in range(count):  # ids are in BFS order: the first is a shallowest one
            if not can_finish[sid]:
                detail = "no fair continuation finishes: " + waiting(
                    self.observations[sid], self.rules
                )
                violation = Violation(invariant.name, invariant.summary, detail)
                return Counterexample(violation, self.trace(sid))
        return None


def can_finish(
    world: World,
    rules: Rules,
    queue: str,
    *,
    limit: int = CLOSURE_LIMIT,
    completions: bool = True,
) -> bool:
    """Whether fair actions alone take ``world`` to a quiescent state (replay check);
    without ``completions``, with no build ever reporting (the lease check)."""
    bounds = Bounds(queue=queue)
    start = observe(world)
    seen = {start}
    todo = deque([(world, start)])
    with quiet_logs():
        while todo:
            current, obs = todo.popleft()
            if quiescent(obs, rules):
                return True
            for action in enabled(obs, Budget(), bounds, rules, fair_only=True):
                if not completions and action.kind == COMPLETE:
                    continue
                twin = perform(current, action)
                if twin is None:
                    continue
                post = observe(twin)
                if post not in seen:
                    if len(seen) >= limit:
                        raise RuntimeError(f"fair closure exceeded {limit} states")
                    seen.add(post)
                    todo.append((twin, post))
    return False

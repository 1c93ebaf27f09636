"""Breadth-first search over world states, then a progress pass over the explored graph.

Theory of operation
-------------------
A state is an :class:`Observation` of a world plus the :class:`Budget` its path spent.
The search keeps a live :class:`World` for the frontier states; expanding a state forks
that world once per enabled action and performs the action on the fork with the real
controller. A successor whose (observation, budget) was seen before is not expanded
again, but its edge still counts: transition invariants are checked on every edge, and
every *fair* edge is remembered backwards for the progress pass.

What an action does depends on the world, not on the budget beside it: states that
differ only in their budget share one world, and each action is performed once per
observation; its outcome (the observation it leads to, what a delivery did) is kept
and reused by every other state with that observation (:attr:`Tuning.share_outcomes`).

A state whose budget is *covered* by that of a state already reached with the same
observation (:meth:`~.model.Budget.covers`: the same heads ingested, no more of anything
else spent) is kept as a state but not expanded (:attr:`Tuning.prune_covered`): every
path from it is a path from the covering state, which reaches the same observations
through the same edges, with no more spent. Breadth-first order found the covering state
no deeper, so shortest counterexamples stay shortest. Fair actions neither spend budget
nor depend on it, so whether fair behaviour finishes is a property of the observation:
a covered state finishes when its cover does (the progress pass links them).

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
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from ...domain.entities import QueueConfig
from ...machine.invariants import InvariantCatalog
from ...ports.config import ConfigStore
from ...process.catalog import ProcessMachines
from ...process.effective_config import declared_pairs, effective_config
from ...process.gate import MAX_BASELINE_LAG, MAX_VALIDATION_MS, PAUSED
from ...process.together import stepwise
from ...simulation.collector import rare_collections
from ...simulation.world import World
from .actions import DeliveryEffect, StepFailed, enabled, held_while_paused, perform
from .coverage import tracker
from .invariants import (
    Invariant,
    Rules,
    Scopes,
    Violation,
    check_edge,
    check_state,
    finishing,
    quiescent,
    waiting,
)
from .model import COMPLETE, DELIVER, Action, Bounds, Budget
from .observe import Observation, observe
from .paths import PathClass, path_classes
from .split import PIECES, Cores, Fork, PartReport, cut, tails
from .variants import Variant

E = TypeVar("E")  # an edge of a search: an action, or a culprit exploration's move
DEFAULT_MAX_STATES = 500_000
#: The frontier at which ``check`` splits an exploration over two processes (see
#: :mod:`.split`; bench.check_split measures where a fork pays).
SPLIT_FRONTIER = 4_000
PROGRESS_EVERY_S = 2.0
CLOSURE_LIMIT = 100_000
STEP_FAILED = Violation(
    "steps_apply", "every environment step applies (ingest, record and reconcile do not raise)", ""
)


@dataclass(frozen=True)
class Setup:
    """Everything that fixes one exploration (one ``max_concurrent``)."""

    machines: ProcessMachines
    config: ConfigStore
    bounds: Bounds
    max_concurrent: int
    variant: Variant = field(default_factory=Variant)
    catalog: InvariantCatalog | None = None  # where declared names are found (the policy's)
    #: The config's ``invariants:`` (which queues each invariant is proved for).
    scopes: Scopes = ()

    @property
    def queue_config(self) -> QueueConfig:
        """The checked queue's effective config, as the policy gives it."""
        declared = declared_pairs(self.machines.parameter_defaults)
        return effective_config(self.config.get(self.bounds.queue), declared)

    def knobs(self) -> dict[str, Any]:
        """The config a replay needs: written into the counterexample timeline (with
        ``paused`` only when the checked queue's config pauses it, and the lag bound and
        slot lease only when the policy declares them)."""
        resolved = self.queue_config
        knobs: dict[str, Any] = {
            "max_concurrent": self.max_concurrent,
            "gate_wait_delay_ms": int(resolved.param("gate_wait_delay_ms")),
            "max_attempts": self.bounds.max_attempts,
        }
        if dict(self.config.get(self.bounds.queue).parameters).get(PAUSED):
            knobs[PAUSED] = True
        values = dict(resolved.parameters)
        for name in (MAX_BASELINE_LAG, MAX_VALIDATION_MS):
            if values.get(name):
                knobs[name] = int(values[name])
        return knobs

    def rules(self) -> Rules:
        return Rules.for_machines(
            self.machines,
            max_concurrent=self.max_concurrent,
            history=self.bounds.history(),
            bare_counter=self.variant.bare_counter,
            catalog=self.catalog,
            queue=self.bounds.queue,
            path_classes=self.path_classes(),
            scopes=self.scopes,
            parameters=dict(self.queue_config.parameters),
        )

    def path_classes(self) -> tuple[PathClass, ...]:
        """What a head of the checked queue may change (:mod:`.paths`)."""
        return path_classes(self.machines.parameters, dict(self.queue_config.parameters))

    def new_world(self, errors_seen: set[str] | None = None) -> World:
        return World(
            self.machines,
            self.config,
            self.bounds.history(),
            lifecycle_factory=self.variant.lifecycle_factory,
            overrides=self.knobs(),
            keep_trail=False,
            errors_seen=errors_seen,
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
    cpu_seconds: float = 0.0  # processor time of the exploring process(es)
    covered: int = 0  # states not expanded: a state of their observation covers them
    processes: int = 1  # 2 when the search was split (``Tuning.split_at``)
    searched_again: bool = False  # a split search found a violation: this is the unsplit one
    #: The flow's transitions the search fired, as indices into ``queue_gate.steps``.
    taken: frozenset[int] = frozenset()
    #: Every distinct error a delivery raised anywhere in the search (each was retried,
    #: then dead-lettered, as the settle policy says): a plugin that fails shows here.
    raised: frozenset[str] = frozenset()

    @property
    def ok(self) -> bool:
        return self.complete and self.counterexample is None


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


@dataclass(frozen=True)
class _Outcome:
    """What one action does from one observation: the observation it leads to (``None``
    when it is no real edge), and for a delivery what it did (which faults are worth
    trying after it)."""

    post: Observation | None
    effect: DeliveryEffect | None = None

    @classmethod
    def of(
        cls, obs: Observation, twin: World | None, calls_before: int, action: Action
    ) -> _Outcome:
        if twin is None:
            return cls(None)
        post = observe(twin)
        if action.kind != DELIVER:
            return cls(post)
        return cls(post, DeliveryEffect.of(obs, post, calls_before, twin))


_Entry = tuple[int, Observation, Budget, "World | None"]  # a state to expand, and its world
_Frontier = deque[_Entry]


class _Worlds:
    """One live world per observation of the unexpanded states, with how many of them
    stand on it: states that differ only in their budget share one world (when the
    explorer shares outcomes, ``Tuning.share_outcomes``)."""

    def __init__(self) -> None:
        self._held: dict[Observation, tuple[World, int]] = {}

    def __contains__(self, obs: Observation) -> bool:
        return obs in self._held

    def hold(self, obs: Observation, world: World | None) -> None:
        """One more state stands on ``obs``: on its held world, else on ``world``."""
        held = self._held.get(obs)
        if held is not None:
            self._held[obs] = (held[0], held[1] + 1)
        else:
            assert world is not None, "a new observation comes with its world"
            self._held[obs] = (world, 1)

    def take(self, obs: Observation) -> tuple[World, bool]:
        """The world of ``obs`` for one state's expansion, and whether that state was the
        last to stand on it (then no one else will read it: it may be changed)."""
        world, users = self._held[obs]
        if users == 1:
            del self._held[obs]
            return world, True
        self._held[obs] = (world, users - 1)
        return world, False


class _Covers:
    """The budgets each observation is expanded with, for :meth:`Budget.covers`."""

    def __init__(self) -> None:
        self._expanded: dict[Observation, list[tuple[Budget, int]]] = {}

    def cover(self, obs: Observation, budget: Budget) -> int | None:
        """A state of ``obs`` expanded (or to be) whose budget covers ``budget``."""
        for held, sid in self._expanded.get(obs, ()):
            if held.covers(budget):
                return sid
        return None

    def add(self, obs: Observation, budget: Budget, sid: int) -> None:
        self._expanded.setdefault(obs, []).append((budget, sid))


@dataclass
class Finish:
    """A finishing pass (progress; with slot leases, the lease pass) and the fair edges
    it follows, backwards: the sources of the edges into each state."""

    invariant: Invariant
    completions: bool  # whether build completions count (the lease pass: never reported)
    into: list[list[int]] = field(default_factory=list)
    at_fork: list[int] = field(default_factory=list)  # the lengths of ``into`` at the fork


@dataclass(frozen=True)
class Tuning:
    """How a search runs, with the defaults ``check`` runs with.

    The reductions (``prune_faults``, ``reuse_worlds``, ``share_outcomes``,
    ``prune_covered``, and the pause reductions left off by ``resume_anywhere``,
    ``explore_paused_holds`` and ``steps_while_paused``) each leave what is checked as it
    is: the same observations and edges, or the same stores reached; tests turn one off
    to compare the graphs.
    """

    #: Stop, incomplete, once this many states were found.
    max_states: int = DEFAULT_MAX_STATES
    #: Fork into two processes once the frontier holds at least this many states (and a
    #: core is idle, when the explorer is given ``cores``); ``None``: never (:mod:`.split`).
    split_at: int | None = None
    #: Try a delivery's crash and outage variants only where it wrote something or asked
    #: source control (:class:`~.actions.DeliveryEffect`).
    prune_faults: bool = True
    #: Run a state's last action on its own world rather than on a fork.
    reuse_worlds: bool = True
    #: Perform each action once per observation, whatever the budget beside it (off:
    #: every state keeps its own world and performs its own actions). Sound because two
    #: worlds with one observation differ at most by a shift of the clock, stalled
    #: deliveries included (their views are observed as the stores are: without times,
    #: leases as time left).
    share_outcomes: bool = True
    #: Keep, but do not expand, a state whose budget a state of its observation covers
    #: (off: every state is expanded; the same observations and edges either way).
    prune_covered: bool = True
    #: Resume a paused queue in every state rather than only where it is read next
    #: (:func:`.actions.enabled`): more states, the same stores.
    resume_anywhere: bool = False
    #: Explore where a paused queue's hold leads, when nothing else observed depends on
    #: the clock (:func:`.actions.held_while_paused`): more states, the same stores.
    #: Always on when the checked queue has slot leases.
    explore_paused_holds: bool = False
    #: Take the steps other than deliveries from a paused queue whose head is due too
    #: (:func:`.actions.enabled`): more transitions, the same states.
    steps_while_paused: bool = False


class SearchTree(Generic[E]):
    """The tree a breadth-first search grows: each state's parent, the edge that first
    reached it, and its depth (state ids are in the order states were found)."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.via: list[E | None] = []
        self.depth: list[int] = []

    def grow(self, parent: int, via: E | None) -> int:
        """A new state, reached from ``parent`` (-1: the root) by ``via``: its id."""
        self.parent.append(parent)
        self.via.append(via)
        self.depth.append(self.depth[parent] + 1 if parent >= 0 else 0)
        return len(self.parent) - 1

    def trace(self, sid: int, last: E | None = None) -> tuple[E, ...]:
        """The edges on the tree path from the root to ``sid`` (then ``last``)."""
        path: list[E] = [] if last is None else [last]
        while sid > 0:
            edge = self.via[sid]
            assert edge is not None
            path.append(edge)
            sid = self.parent[sid]
        return tuple(reversed(path))


class Explorer(SearchTree[Action]):
    def __init__(
        self,
        setup: Setup,
        tuning: Tuning = Tuning(),
        *,
        progress: Progress | None = None,
        on_edge: Callable[[int, int], None] | None = None,
        cores: Cores | None = None,
        abandoned: Callable[[], bool] | None = None,
    ) -> None:
        if tuning.split_at is not None and on_edge is not None:
            raise ValueError("a split search tells no edge hook: its edges are in two processes")
        super().__init__()
        self.setup = setup
        self.tuning = tuning
        self._cores = cores  # when given, the fork waits for an idle one (else: no wait)
        #: Asked at each state: true once no one waits for the result (the process that
        #: started this one is gone); the search then ends, incomplete.
        self._abandoned = abandoned
        self._fork: Fork | None = None
        self._pieces: list[list[_Entry]] = []  # the frontier at the fork, cut
        self._known = 0  # states at the fork: ids below it mean the same in both processes
        self._at_fork = (0, 0, 0)  # transitions, attempts, covered at the fork
        self._part: PartReport | None = None  # the forked process's report, once joined
        self._covers: _Covers | None = _Covers() if tuning.prune_covered else None
        self.covered = 0  # states kept but not expanded, their budget covered
        self.errors_seen: set[str] = set()  # what deliveries raised, in any world
        #: Told every explored edge (source and destination state ids), for tools that
        #: study the graph itself (``bench.check_split``); the search keeps only fair
        #: edges, backwards.
        self.on_edge = on_edge
        self._outcomes: dict[tuple[Observation, Action], _Outcome] = {}
        self._index: dict[tuple[Observation, Budget], int] = {}  # the id of each state
        self._worlds = _Worlds()
        self.rules = setup.rules()
        #: Whether the search goes on from a paused queue's holds (:class:`Tuning`).
        self.explore_paused_holds = tuning.explore_paused_holds or bool(
            self.rules.max_validation_ms
        )
        self.paused_holds = 0  # holds of a paused queue whose destination was not explored
        self.progress = progress
        self.observations: list[Observation] = []
        #: The finishing passes the policy declares, with the fair edges they follow.
        self.finishes = [Finish(invariant, both) for invariant, both in finishing(self.rules)]
        self.transitions = 0
        self.attempts = 0  # actions performed, including those that were no real edge

    # --- search ---------------------------------------------------------------------

    def run(self) -> Result:
        started, cpu = time.perf_counter(), time.process_time()
        steps = tracker(self.setup.machines.queue_gate)
        steps.reset()
        with quiet_logs(), rare_collections(), stepwise():
            try:
                counterexample, complete = self._search(started)
                # A violation, out of states, or no one waiting: the other process, if
                # any, need not go on.
                if (counterexample is not None or not complete) and self._fork is not None:
                    self._fork.halt()
            except BaseException:
                if self._fork is not None:
                    if self._fork.in_child:
                        self._fork.fail()
                    self._fork.abandon()
                raise
            if self._fork is not None:
                complete = self._join(counterexample, complete)
            part = self._part
            violated = counterexample is not None or (part is not None and part.violated)
            for finish in self.finishes:
                if counterexample is None and not violated and complete:
                    counterexample = self._finish_pass(finish)
        # The search's worlds and index are not read again: a search run again after a
        # split must not hold them beside its own.
        self._index, self._worlds = {}, _Worlds()
        if part is not None and (violated or counterexample is not None):
            return self._search_again(started, cpu)
        return Result(
            max_concurrent=self.setup.max_concurrent,
            states=len(self.parent) + (part.states if part else 0),
            transitions=self.transitions + (part.transitions if part else 0),
            depth=max(max(self.depth, default=0), part.depth if part else 0),
            seconds=time.perf_counter() - started,
            complete=complete,
            counterexample=counterexample,
            cpu_seconds=time.process_time() - cpu + (part.cpu_seconds if part else 0.0),
            covered=self.covered + (part.covered if part else 0),
            processes=2 if part else 1,
            taken=frozenset(steps.taken) | (part.taken if part else frozenset()),
            raised=frozenset(self.errors_seen) | (part.raised if part else frozenset()),
        )

    def _search_again(self, started: float, cpu: float) -> Result:
        """A split search found a violation: each process searched breadth-first, but
        not the two together, so the shortest counterexample is the unsplit search's."""
        assert self._part is not None
        spent = time.process_time() - cpu + self._part.cpu_seconds
        again = Explorer(
            self.setup, replace(self.tuning, split_at=None), progress=self.progress
        ).run()
        return replace(
            again,
            seconds=time.perf_counter() - started,
            cpu_seconds=again.cpu_seconds + spent,
            searched_again=True,
        )

    def _search(self, started: float) -> tuple[Counterexample | None, bool]:
        setup, rules, bounds = self.setup, self.rules, self.setup.bounds
        root = setup.new_world(self.errors_seen)
        root_obs = observe(root)
        index, worlds = self._index, self._worlds
        self._add(root_obs, Budget(), -1, None)
        violation = check_state(root_obs, rules)
        if violation:
            return Counterexample(violation, ()), True
        checked = {root_obs}  # observations whose state invariants held
        covers = self._covers
        if covers is not None:
            covers.add(root_obs, Budget(), 0)
        frontier: _Frontier = deque([(0, root_obs, Budget(), self._own(root_obs, root))])
        next_report = started + PROGRESS_EVERY_S
        on_edge = self.on_edge
        while frontier or self._claim(frontier):
            if self._abandoned is not None and self._abandoned():
                return None, False
            fork = self._fork
            if fork is None:
                if self._splits(frontier):
                    self._start_fork(frontier)
                    continue
            elif fork.halted:
                return None, True  # the other process ended the search: its result stands
            sid, obs, budget, own = frontier.popleft()
            world, alone = (own, True) if own is not None else worlds.take(obs)
            effect: DeliveryEffect | None = None
            actions = enabled(
                obs,
                budget,
                bounds,
                rules,
                resume_anywhere=self.tuning.resume_anywhere,
                steps_while_paused=self.tuning.steps_while_paused,
            )
            calls_before = world.graph.calls
            for i, action in enumerate(actions):
                if not self._taken(effect, action):
                    continue
                spent = budget.spend(action.kind)
                outcome = self._outcomes.get((obs, action)) if self.tuning.share_outcomes else None
                twin: World | None = None
                if outcome is None or self._needs_world(outcome, spent):
                    self.attempts += 1
                    # The world is needed by no one after the last action that still has
                    # to be performed on it: that one runs on the world itself.
                    last = (
                        self.tuning.reuse_worlds
                        and alone
                        and not any(
                            self._performs(obs, budget, later, effect) for later in actions[i + 1 :]
                        )
                    )
                    try:
                        twin = perform(world, action, in_place=last)
                    except StepFailed as exc:
                        failed = Violation(STEP_FAILED.invariant, STEP_FAILED.summary, str(exc))
                        return Counterexample(failed, self.trace(sid, action)), True
                    if outcome is None:
                        outcome = _Outcome.of(obs, twin, calls_before, action)
                        if self.tuning.share_outcomes:
                            self._outcomes[(obs, action)] = outcome
                        if outcome.post is not None:
                            violation = check_edge(obs, outcome.post, rules)
                            if violation:
                                return Counterexample(violation, self.trace(sid, action)), True
                post = outcome.post
                if post is None:
                    continue
                if action.kind == DELIVER:
                    effect = outcome.effect
                    if not self.explore_paused_holds and held_while_paused(obs, post, bounds.queue):
                        self.paused_holds += 1
                        continue
                self.transitions += 1
                dst = index.get((post, spent))
                if dst is None:
                    dst = self._add(post, spent, sid, action)
                    if post not in checked:
                        violation = check_state(post, rules)
                        if violation:
                            return Counterexample(violation, self.trace(dst)), True
                        checked.add(post)
                    if len(self.parent) >= self.tuning.max_states:
                        return None, False
                    cover = covers.cover(post, spent) if covers is not None else None
                    if cover is None:
                        if covers is not None:
                            covers.add(post, spent, dst)
                        frontier.append((dst, post, spent, self._own(post, twin)))
                    else:
                        self._link_covered(dst, cover)
                if on_edge is not None:
                    on_edge(sid, dst)
                if action.fair:
                    for finish in self.finishes:
                        if finish.completions or action.kind != COMPLETE:
                            finish.into[dst].append(sid)
            if self.progress and time.perf_counter() >= next_report:
                next_report = time.perf_counter() + PROGRESS_EVERY_S
                self.progress(self._status(started, len(frontier), self.depth[sid]))
        return None, True

    # --- split over two processes (see .split) ------------------------------------

    def _splits(self, frontier: _Frontier) -> bool:
        """Whether to fork now: the frontier is wide enough and a core is idle. Any
        state will do (not only the first of a depth): a split run's counterexample is
        the unsplit search's anyway (``searched_again``)."""
        return (
            self.tuning.split_at is not None
            and len(frontier) >= self.tuning.split_at
            and (self._cores is None or self._cores.take())  # last: it takes the core
        )

    def _start_fork(self, frontier: _Frontier) -> None:
        """Cut the frontier into pieces and fork; each process then claims pieces."""
        self._pieces = cut(list(frontier), PIECES)
        frontier.clear()
        self._known = len(self.parent)
        for finish in self.finishes:
            finish.at_fork = [len(sources) for sources in finish.into]
        self._at_fork = (self.transitions, self.attempts, self.covered)
        self._fork = Fork(PIECES)
        self._fork.start()
        if self._fork.in_child:
            self._abandoned = None  # its own parent is watched by the fork (``halted``)

    def _claim(self, frontier: _Frontier) -> bool:
        """After the fork, an empty frontier takes the next unclaimed piece, if any."""
        if self._fork is None:
            return False
        piece = self._fork.claim()
        if piece is None:
            return False
        frontier.extend(self._pieces[piece])
        self._pieces[piece] = []  # claimed here: its states now live in the frontier
        return True

    def _join(self, counterexample: Counterexample | None, complete: bool) -> bool:
        """The forked process sends its part and ends; the process that forked takes
        the part's fair edges and flags in (ids past its own), for the passes. Returns
        whether the whole search is complete."""
        fork = self._fork
        assert fork is not None
        if fork.in_child:
            fork.finish(self._report(counterexample, complete))
        self._pieces = []  # every piece was claimed: the other process's are not needed
        try:
            part = fork.receive()
        finally:
            if self._cores is not None:
                self._cores.give()
        self._part = part
        self.attempts += part.attempts
        shift = len(self.parent) - part.known  # its ids past the fork come after ours

        def ours(sids: list[int]) -> list[int]:
            return [sid if sid < part.known else sid + shift for sid in sids]

        for finish, into, found in zip(self.finishes, part.into, part.tails, strict=True):
            for sid, tail in found.items():
                finish.into[sid].extend(ours(tail))
            finish.into.extend(ours(sources) for sources in into)
        return complete and part.complete

    def _report(self, counterexample: Counterexample | None, complete: bool) -> PartReport:
        known = self._known
        transitions, attempts, covered = self._at_fork
        return PartReport(
            known=known,
            states=len(self.parent) - known,
            transitions=self.transitions - transitions,
            attempts=self.attempts - attempts,
            covered=self.covered - covered,
            depth=max(self.depth[known:], default=0),
            complete=complete,
            violated=counterexample is not None,
            cpu_seconds=time.process_time(),  # the forked process's own, from zero
            taken=frozenset(tracker(self.setup.machines.queue_gate).taken),
            raised=frozenset(self.errors_seen),
            quiescent=bytes(quiescent(obs, self.rules) for obs in self.observations[known:]),
            into=[finish.into[known:] for finish in self.finishes],
            tails=[tails(finish.into, finish.at_fork) for finish in self.finishes],
        )

    def _performs(
        self, obs: Observation, budget: Budget, action: Action, effect: DeliveryEffect | None
    ) -> bool:
        """Whether expanding ``obs`` will still perform ``action`` on its world: it is
        taken, and its outcome is not known or leads to a new state no world stands for.
        (Both only become known during an expansion, never unknown again.)"""
        if not self._taken(effect, action):
            return False
        outcome = self._outcomes.get((obs, action)) if self.tuning.share_outcomes else None
        spent = budget.spend(action.kind)
        return outcome is None or self._needs_world(outcome, spent)

    def _own(self, obs: Observation, world: World | None) -> World | None:
        """The world a new state of ``obs`` keeps for itself; ``None`` when it stands on
        the shared world of its observation (``world`` is held for it if it is the first)."""
        if self.tuning.share_outcomes:
            self._worlds.hold(obs, world)
            return None
        assert world is not None, "a state of its own comes with its world"
        return world

    def _needs_world(self, outcome: _Outcome, spent: Budget) -> bool:
        """A known outcome must still be performed when it leads to a new state that no
        live world stands for: the new state needs one to be expanded."""
        post = outcome.post
        if post is None or (post, spent) in self._index:
            return False
        if self._covers is not None and self._covers.cover(post, spent) is not None:
            return False  # a covered state is not expanded: it needs no world
        return not self.tuning.share_outcomes or post not in self._worlds

    def _link_covered(self, sid: int, cover: int) -> None:
        """``sid`` is not expanded: it finishes when ``cover``, of its observation, does
        (fair behaviour neither spends nor depends on the budget)."""
        self.covered += 1
        for finish in self.finishes:
            finish.into[cover].append(sid)

    def _taken(self, effect: DeliveryEffect | None, action: Action) -> bool:
        """Whether the search performs ``action`` after a delivery that did ``effect``."""
        return not self.tuning.prune_faults or effect is None or effect.worth(action)

    def _add(self, obs: Observation, budget: Budget, parent: int, action: Action | None) -> int:
        sid = self.grow(parent, action)
        self._index[(obs, budget)] = sid
        self.observations.append(obs)
        for finish in self.finishes:
            finish.into.append([])
        return sid

    def _status(self, started: float, frontier: int, depth: int) -> str:
        elapsed = time.perf_counter() - started
        fork = self._fork
        process = "" if fork is None else f" (process {2 if fork.in_child else 1} of 2)"
        return (
            f"check max_concurrent={self.setup.max_concurrent}{process}: "
            f"{len(self.parent)} states, {self.transitions} transitions, depth {depth}, "
            f"frontier {frontier}, {elapsed:.1f} s, {rate(len(self.parent), elapsed):.0f} states/s"
        )

    # --- progress -------------------------------------------------------------------

    def _finish_pass(self, finish: Finish) -> Counterexample | None:
        """The first state (BFS order) from which the edges of ``finish`` reach no
        quiescent state, as a counterexample of its invariant. After a split, the other
        process's states come last: any of them left is reported bare (the run then
        searches again unsplit, for the shortest)."""
        into, invariant = finish.into, finish.invariant
        count = len(into)
        can_finish = bytearray(count)
        own = len(self.observations)
        todo = deque(i for i in range(own) if quiescent(self.observations[i], self.rules))
        if self._part is not None:
            todo.extend(own + i for i, flag in enumerate(self._part.quiescent) if flag)
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
                if sid >= own:
                    violation = Violation(invariant.name, invariant.summary, "")
                    return Counterexample(violation, ())
                detail = waiting(self.observations[sid], self.rules)
                violation = Violation(invariant.name, invariant.summary, detail)
                return Counterexample(violation, self.trace(sid))
        return None


def can_finish(world: World, rules: Rules, queue: str, *, completions: bool = True) -> bool:
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
                    if len(seen) >= CLOSURE_LIMIT:
                        raise RuntimeError(f"fair closure exceeded {CLOSURE_LIMIT} states")
                    seen.add(post)
                    todo.append((twin, post))
    return False

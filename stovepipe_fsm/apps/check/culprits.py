"""Culprit finding, explored: every bounded way a red head's search can go.

The exploration runs the real culprit machine (``machines/culprit.yaml``) through the
real record stage and :class:`~...process.culprit.CulpritFinder`, built by the one
factory the service uses, on a simulated :class:`~...simulation.world.World`. It is not
a second model of the search: the model is only of the builds' results.

The world: a green base ``c0``, a linear trunk ``c1 .. cN`` whose heads coalescing
skipped, the newest ``cN`` admitted on ``c0``; optionally a newer head ``cN+1``. The
first step of every path chooses the culprit: one of the commits, or none. A culprit
makes itself and every later commit red; any other build is green or, at most
``max_flakes`` times per path, red as a flake (the red head's own red is a flake when
the culprit is not at or before it). From there every order is explored:

- fair: a build in flight (a head's or a probe's) ends with each result the model
  allows, the queue's process message is delivered (or the clock moved to it), and an
  outcome whose record crashed is delivered again;
- bounded: the record of an outcome crashes right after ``save_search`` (the search
  row written, its probes not yet published: the redelivery must heal it); an outcome
  already recorded is reported again; the newer head is ingested while a search is open.

A state is the stores as the gate's exploration sees them (:func:`.observe.observe`),
with the search row (without its version and times), the probes whose start is noted
(``ensure_probes`` reads it), and what the model decided on the path.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace

from ...adapters.memory import MemoryQueueStore, MemoryRequestStore
from ...domain.culprit_search import CulpritSearch
from ...domain.entities import Queue, evolve
from ...domain.errors import StovepipeError
from ...domain.trail_record import ADMITTED, ENDED
from ...machine.invariants import policy_invariants
from ...machine.model import MachineSpec
from ...ports.config import ConfigStore
from ...process.catalog import ProcessMachines
from ...process.culprit import CONFIRM_REDS, MAX_PROBES, PROBE_SLOTS, SEARCHING
from ...simulation.broker import Crash
from ...simulation.timeline import DEFAULT_QUEUE
from ...simulation.world import World
from .culprit_invariants import (
    CULPRIT_CHECKS,
    PROBES_NEVER_DELAY_HEADS,
    SEARCH_ENDS,
    STEPS_APPLY,
    SUMMARIES,
    CulpritRules,
    Model,
    View,
)
from .explorer import SearchTree, quiet_logs
from .invariants import Scopes, Violation, in_scope
from .model import ADVANCE, COMPLETE, CRASH, DELIVER, INGEST, REDELIVER
from .observe import Observation, observe
from .variants import Variant

DEFAULT_COMMITS = 2
DEFAULT_MAX_STATES = 200_000
#: The action of the search machine after which a record may crash.
CRASH_AFTER = "save_search"
BASE = "c0"


# Kinds of move, beside those named like the gate's actions (.model). The fair ones are
# what the environment keeps doing.
CULPRIT = "culprit"
REPEAT = "repeat"
FAIR = frozenset({DELIVER, ADVANCE, COMPLETE, REDELIVER})


@dataclass(frozen=True)
class CulpritBounds:
    """How much of the environment one culprit exploration explores."""

    commits: int = DEFAULT_COMMITS  # the red head cN's blamelist: c1 .. cN
    newer_head: bool = True  # cN+1 arrives while a search is open
    max_flakes: int = 1
    max_crashes: int = 1
    max_repeats: int = 1
    queue: str = DEFAULT_QUEUE

    def __post_init__(self) -> None:
        if self.commits < 1:
            raise ValueError(f"commits must be >= 1, got {self.commits}")
        for name in ("max_flakes", "max_crashes", "max_repeats"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def trunk(self) -> tuple[str, ...]:
        """``c0`` (the green base), ``c1 .. cN``, and ``cN+1`` with a newer head."""
        return tuple(f"c{i}" for i in range(self.commits + 1 + int(self.newer_head)))

    @property
    def red_head(self) -> str:
        return f"c{self.commits}"

    def history(self) -> dict[str, list[str]]:
        trunk = self.trunk
        return {c: ([trunk[i - 1]] if i else []) for i, c in enumerate(trunk)}

    def describe(self) -> str:
        newer = f", newer head c{self.commits + 1}" if self.newer_head else ""
        return (
            f"queue {self.queue}, green base {BASE}, red head {self.red_head} "
            f"(blamelist c1..{self.red_head}){newer}; the culprit each commit or none; per "
            f"path at most {self.max_flakes} flake(s), {self.max_crashes} crash(es) after "
            f"{CRASH_AFTER}, {self.max_repeats} repeated outcome(s)"
        )


@dataclass(frozen=True)
class Move:
    """One edge of the culprit exploration."""

    kind: str
    request_id: str = ""
    uri: str = ""
    outcome: str = ""
    amount: int = 0
    flake: bool = False

    @property
    def fair(self) -> bool:
        return self.kind in FAIR

    def describe(self) -> str:
        if self.kind == CULPRIT:
            return f"culprit {self.uri or 'none'}"
        if self.kind == ADVANCE:
            return f"advance_ms {self.amount}"
        if self.kind == DELIVER:
            return "deliver"
        if self.kind == INGEST:
            return f"ingest {self.uri}"
        flake = " (flake)" if self.flake else ""
        told = {CRASH: f" crashing after {CRASH_AFTER}", REDELIVER: " again", REPEAT: " repeated"}
        return f"complete {self.uri} {self.outcome}{flake}{told.get(self.kind, '')}"


#: What a state's world is, as the search tells worlds apart; a state is that and its model.
WorldKey = tuple[Observation, "CulpritSearch | None", frozenset[tuple[str, str]]]
Key = tuple[WorldKey | None, Model]
_Entry = tuple[int, "_Outcome", Model]


@dataclass(frozen=True)
class CulpritCounterexample:
    """A broken culprit invariant, and the moves from the start that break it."""

    violation: Violation
    trace: tuple[Move, ...]


@dataclass(frozen=True)
class CulpritResult:
    """What one culprit exploration found, and what it took."""

    probe_slots: int
    states: int
    transitions: int
    depth: int
    seconds: float
    complete: bool
    cpu_seconds: float = 0.0
    counterexample: CulpritCounterexample | None = None
    named: int = 0  # states with a culprit named
    unresolved: int = 0  # states with a search ended unresolved

    @property
    def ok(self) -> bool:
        return self.complete and self.counterexample is None


def culprit_names(
    machines: ProcessMachines, queue: str = DEFAULT_QUEUE, scopes: Scopes = ()
) -> tuple[str, ...]:
    """The culprit invariants the policy declares for ``queue`` (in any of its machine
    files; ``scopes``, the config's ``invariants:``, replace the queues an entry names)."""
    return tuple(
        ref.name
        for ref in policy_invariants(policy_specs(machines))
        if ref.name in CULPRIT_CHECKS and in_scope(ref, queue, scopes)
    )


def policy_specs(machines: ProcessMachines) -> tuple[MachineSpec, ...]:
    """Every machine file of the policy, culprit.yaml's when it has one."""
    culprit = (machines.culprit.spec,) if machines.culprit is not None else ()
    return (machines.request.spec, machines.queue_gate.spec, *culprit)


@dataclass(frozen=True)
class CulpritSetup:
    """Everything that fixes one culprit exploration (one probe_slots value)."""

    machines: ProcessMachines
    config: ConfigStore
    bounds: CulpritBounds
    probe_slots: int
    variant: Variant = field(default_factory=Variant)
    #: The config's ``invariants:`` (which queues each invariant is proved for).
    scopes: Scopes = ()

    def new_world(self) -> World:
        """The world every path starts from: ``c0`` green, ``c1 .. cN`` ingested and
        delivered, ``cN`` admitted on ``c0`` (coalescing superseded the others)."""
        world = World(
            self.machines,
            self.config,
            self.bounds.history(),
            lifecycle_factory=self.variant.lifecycle_factory,
            overrides={PROBE_SLOTS: self.probe_slots, "max_concurrent": 1},
        )
        queue = self.bounds.queue
        world.ingest(queue, BASE)
        _settle_deliveries(world)
        base = world.request_for(queue, BASE)
        assert base is not None
        world.complete(base, self.rules().green)
        for commit in self.bounds.trunk[1 : self.bounds.commits + 1]:
            world.ingest(queue, commit)
        _settle_deliveries(world)
        return world

    def param(self, name: str, default: int = 0) -> int:
        """The checked queue's ``name`` as its config gives it, else the declared default
        (``probe_slots`` 0: finding off)."""
        values = dict(self.config.get(self.bounds.queue).parameters)
        return int(values.get(name, self.machines.parameter_defaults.get(name, default)))

    def start(self) -> str:
        """Where every path starts, in words."""
        behind = self.bounds.trunk[1 : self.bounds.commits]
        skipped = f"{' '.join(behind)} superseded, " if behind else ""
        return f"{BASE} green, {skipped}{self.bounds.red_head} admitted on {BASE}"

    def rules(self) -> CulpritRules:
        roles = self.machines.roles
        green = roles.green_outcome
        red = next(o for o in roles.outcomes.values() if o.red)
        return CulpritRules(
            probe_slots=self.probe_slots,
            confirm_reds=self.param(CONFIRM_REDS, 1),
            max_probes=self.param(MAX_PROBES),
            trunk=self.bounds.trunk,
            green_states=green.states,
            red_states=red.states,
            green=green.name,
            red=red.name,
            checks=culprit_names(self.machines, self.bounds.queue, self.scopes),
        )


def _settle_deliveries(world: World) -> None:
    """Deliver every process message (moving the clock to held ones)."""
    for _ in range(100):
        due = world.broker.next_due_ms()
        if due is None:
            return
        world.clock.set(max(due, world.clock.now_ms()))
        world.deliver_next()
    raise RuntimeError("the culprit exploration's setup did not settle")


class CulpritExplorer(SearchTree[Move]):
    """Breadth-first search of one culprit exploration."""

    def __init__(self, setup: CulpritSetup, *, max_states: int = DEFAULT_MAX_STATES) -> None:
        super().__init__()
        self.setup = setup
        self.bounds = setup.bounds
        self.rules = setup.rules()
        self.max_states = max_states
        self.terminal = _terminal(setup.machines)
        self.admitted = setup.machines.roles.admitted_states
        self.transitions = 0
        self._outcomes: dict[tuple[WorldKey | None, Move], _Outcome] = {}
        self._index: dict[Key, int] = {}  # the id of each state
        self._frontier: deque[_Entry] = deque()
        self.named = 0
        self.unresolved = 0

    def run(self) -> CulpritResult:
        started, cpu = time.perf_counter(), time.process_time()
        with quiet_logs():
            counterexample, complete = self._search()
        return CulpritResult(
            probe_slots=self.setup.probe_slots,
            states=len(self.parent),
            transitions=self.transitions,
            depth=max(self.depth, default=0),
            seconds=time.perf_counter() - started,
            complete=complete,
            cpu_seconds=time.process_time() - cpu,
            counterexample=counterexample,
            named=self.named,
            unresolved=self.unresolved,
        )

    def _search(self) -> tuple[CulpritCounterexample | None, bool]:
        root = self.setup.new_world()
        found = self._add(_Outcome.of(root, self.bounds.queue), Model(), -1, None)
        if found is not None:
            return found, True
        while self._frontier:
            sid, known, model = self._frontier.popleft()
            world = known.world
            assert world is not None
            moves = self._enabled(world, model)
            if SEARCH_ENDS in self.rules.checks and not any(m.fair for m in moves):
                row = known.search
                if model.culprit >= 0 and row is not None and row.state == SEARCHING:
                    detail = (
                        f"the search for {row.red_request_id} is open with nothing in flight "
                        f"and no probe left to start (listed, none building: "
                        f"{[p.commit for p in row.probes]}; started {row.probes_started})"
                    )
                    return self._counterexample(SEARCH_ENDS, detail, sid), True
            for move in moves:
                outcome = self._outcomes.get((known.key, move))
                if outcome is None:
                    try:
                        outcome = self._perform(world, move)
                    except (StovepipeError, ValueError, AssertionError) as exc:
                        detail = f"{move.describe()}: {type(exc).__name__}: {exc}"
                        return self._counterexample(STEPS_APPLY, detail, sid, move), True
                    self._outcomes[(known.key, move)] = outcome
                if outcome.world is None:
                    continue
                if outcome.delays:
                    return self._counterexample(
                        PROBES_NEVER_DELAY_HEADS, outcome.delays, sid, move
                    ), True
                self.transitions += 1
                found = self._add(outcome, _next(model, move), sid, move)
                if found is not None:
                    return found, True
                if len(self.parent) >= self.max_states:
                    return None, False
        return None, True

    def _add(
        self, known: _Outcome, model: Model, parent: int, move: Move | None
    ) -> CulpritCounterexample | None:
        assert known.key is not None, "a state's world is known"
        key: Key = (known.key, model)
        if key in self._index:
            return None
        sid = self.grow(parent, move)
        self._index[key] = sid
        search = known.search
        if search is not None and search.state == "named":
            self.named += 1
        elif search is not None and search.state == "unresolved":
            self.unresolved += 1
        view = View(known.key[0], search, model)
        for name in self.rules.checks:
            for detail in CULPRIT_CHECKS[name](view, self.rules, self.terminal):
                return self._counterexample(name, detail, sid)
        self._frontier.append((sid, known, model))
        return None

    def _counterexample(
        self, name: str, detail: str, sid: int, last: Move | None = None
    ) -> CulpritCounterexample:
        violation = Violation(name, SUMMARIES.get(name, ""), detail)
        return CulpritCounterexample(violation, self.trace(sid, last))

    # --- moves ---------------------------------------------------------------------

    def _enabled(self, world: World, model: Model) -> list[Move]:
        trunk, queue = self.bounds.trunk, self.bounds.queue
        if model.culprit < 0:
            return [Move(CULPRIT, uri=c, amount=i) for i, c in enumerate(trunk) if i] + [
                Move(CULPRIT)
            ]
        moves: list[Move] = []
        now = world.clock.now_ms()
        due = world.broker.next_due_ms()
        if due is not None:
            moves.append(Move(DELIVER) if due <= now else Move(ADVANCE, amount=due - now))
        for request_id, outcome in model.unsettled:
            moves.append(Move(REDELIVER, request_id, _uri(world, request_id), outcome))
        built = {p.request_id for p in world.published.builds()}
        requests = world.requests.snapshot()
        for request in requests:
            if request.state not in self.admitted or request.id not in built:
                continue
            for outcome, flake in self._results(request.uri, model):
                moves.append(Move(COMPLETE, request.id, request.uri, outcome, flake=flake))
                if model.crashes < self.bounds.max_crashes:
                    moves.append(Move(CRASH, request.id, request.uri, outcome, flake=flake))
        if model.repeats < self.bounds.max_repeats:
            waiting = {rid for rid, _ in model.unsettled}
            for request in requests:
                ended = self.setup.machines.roles.outcome_of_state(request.state)
                if ended is None or request.id not in built or request.id in waiting:
                    continue
                moves.append(Move(REPEAT, request.id, request.uri, ended.name))
        row = _search_row(world, queue)
        if self.bounds.newer_head and not model.newer and row and row.state == SEARCHING:
            moves.append(Move(INGEST, uri=trunk[-1]))
        return moves

    def _results(self, uri: str, model: Model) -> list[tuple[str, bool]]:
        """The results the model allows a build of ``uri``: red for certain at and
        after the culprit; else green, or red as a flake while flakes are left."""
        if model.red(self.bounds.trunk.index(uri)):
            return [(self.rules.red, False)]
        results = [(self.rules.green, False)]
        if model.flakes < self.bounds.max_flakes:
            results.append((self.rules.red, True))
        return results

    def _perform(self, world: World, move: Move) -> _Outcome:
        """What ``move`` does to ``world`` (left as it is: a fork takes the move)."""
        if move.kind == CULPRIT:
            return _Outcome.of(world, self.bounds.queue)  # the model's choice alone
        twin = world.clone()
        kind = move.kind
        if kind == DELIVER:
            raised = len(twin.raised)
            twin.deliver_next()
            if len(twin.raised) > raised:
                raise ValueError(f"the delivery raised: {twin.raised[-1][1]}")
            checked = PROBES_NEVER_DELAY_HEADS in self.rules.checks
            delays = _decides_alike(world, twin) if checked else ""
            return _Outcome.of(twin, self.bounds.queue, delays)
        if kind == ADVANCE:
            twin.advance(move.amount)
        elif kind == INGEST:
            twin.ingest(self.bounds.queue, move.uri)
        elif kind == CRASH:
            if not _crashed(twin, move):
                return _NO_EDGE
        else:  # a build's end: reported, reported again after a crash, or repeated
            twin.complete(move.request_id, move.outcome)
        return _Outcome.of(twin, self.bounds.queue)


def _next(model: Model, move: Move) -> Model:
    """What the model decided once ``move`` is taken."""
    kind = move.kind
    if kind == CULPRIT:
        return replace(model, culprit=move.amount)
    if kind == INGEST:
        return replace(model, newer=True)
    if move.flake:
        model = replace(model, flakes=model.flakes + 1, flaked=model.flaked | {move.uri})
    if kind == REDELIVER:
        left = tuple(u for u in model.unsettled if u != (move.request_id, move.outcome))
        return replace(model, unsettled=left)
    if kind == REPEAT:
        return replace(model, repeats=model.repeats + 1)
    if kind == CRASH:
        unsettled = (*model.unsettled, (move.request_id, move.outcome))
        return replace(model, crashes=model.crashes + 1, unsettled=unsettled)
    return model


@dataclass(frozen=True)
class _Outcome:
    """A world a move led to (``None``: no real edge), with its key and search row, and
    what a head's delivery would have decided differently without probes ("" : nothing).
    A move is performed once per world key, whatever the model beside it: the world
    does not read the model, which only says which moves are taken."""

    world: World | None
    key: WorldKey | None = None
    search: CulpritSearch | None = None
    delays: str = ""

    @classmethod
    def of(cls, world: World, queue: str, delays: str = "") -> _Outcome:
        search = _search_row(world, queue)
        return cls(world, (observe(world), _unversioned(search), _noted(world)), search, delays)


_NO_EDGE = _Outcome(None)


def _crashed(world: World, move: Move) -> bool:
    """Record ``move``'s outcome with a crash right after the search row's write:
    whether the record got there."""
    finder = world.stages.record.culprits
    if finder is None:
        return False

    def crash(action: str) -> None:
        if action == CRASH_AFTER:
            raise Crash(f"after_{CRASH_AFTER}")

    finder.probe = crash
    try:
        world.complete(move.request_id, move.outcome)
    except Crash:
        return True
    finally:
        finder.probe = None
    return False


def _decides_alike(before: World, after: World) -> str:
    """What the head delivered from ``before`` (into ``after``) would have become with
    no probe in flight, when that differs ("" when it does not or no probe is)."""
    terminal = _terminal(before.machines)
    rows = before.requests.snapshot()
    probes = {r.id for r in rows if r.probe_of and r.state not in terminal}
    if not probes:
        return ""
    bare = before.clone()
    bare.requests = MemoryRequestStore([r for r in rows if r.id not in probes])
    bare.queues = MemoryQueueStore([_without(row, probes) for row in before.queues.snapshot()])
    message = bare.broker.first_due(bare.clock.now_ms())
    if message is None:
        return ""
    bare.deliver_next()
    head = message.request_id
    got = next((r for r in after.requests.snapshot() if r.id == head), None)
    alone = next((r for r in bare.requests.snapshot() if r.id == head), None)
    if got is None or alone is None or got.state == alone.state:
        return ""
    return f"{head} ({got.uri}) is {got.state} with probes in flight, {alone.state} without them"


def _without(row: Queue, probes: set[str]) -> Queue:
    """``row`` as it would be had ``probes`` never run (whatever they hold of it)."""
    return evolve(
        row,
        slot_holders=tuple(h for h in row.slot_holders if h not in probes),
        leases=tuple(lease for lease in row.leases if lease[0] not in probes),
        serial_holder="" if row.serial_holder in probes else row.serial_holder,
    )


def _terminal(machines: ProcessMachines) -> frozenset[str]:
    return frozenset(s.name for s in machines.request.spec.states if s.terminal)


def _uri(world: World, request_id: str) -> str:
    return next((r.uri for r in world.requests.snapshot() if r.id == request_id), "")


def _search_row(world: World, queue: str) -> CulpritSearch | None:
    return next((row for row in world.searches.snapshot() if row.queue == queue), None)


def _unversioned(row: CulpritSearch | None) -> CulpritSearch | None:
    """The row without what grows with time and writes (no decision reads them)."""
    if row is None:
        return None
    return evolve(row, version=0, started_at_ms=0, ended_at_ms=0)


def _noted(world: World) -> frozenset[tuple[str, str]]:
    """The starts and ends noted (a repeat and ``ensure_probes`` read them)."""
    if world.trail is None:
        return frozenset()
    return frozenset((r.kind, r.request_id) for r in world.trail.records if r.kind in NOTED)


NOTED = frozenset({ADMITTED, ENDED})

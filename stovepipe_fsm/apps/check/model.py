"""The checker's vocabulary: bounds, the per-path budget, and labelled actions.

An :class:`Action` is one edge of the explored graph. It carries the timeline steps that
perform it (usually one; a crash is "arm the crash point, then deliver"), so a path of
actions *is* a timeline: the counterexample file is written from the labels alone and
replays without any knowledge of the checker.

Environment actions that could repeat forever (duplicates, crashes, dead-letters,
source-control outages) are bounded per path by :class:`Bounds`; what a path has spent
is its :class:`Budget`, which is part of the hashed state. An outage that goes on over
the consecutive deliveries of the message it failed spends nothing more: the settle
policy bounds it, dead-lettering the message at ``Bounds.max_attempts`` failures.
That, plus a finite history of heads and a clock abstracted to relative due times (and
failure counts no larger than ``max_attempts``), keeps the state space finite.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields, replace
from functools import cache
from typing import Any

from ...located.errors import Location
from ...machine.parameters import as_json
from ...simulation.timeline import DEFAULT_QUEUE, TimelineStep
from ...simulation.world import STALL_POINTS

CHECK_LOCATION = Location("check", 0, 0)
REWRITE_HEAD = "R"

# Kinds of action. The fair ones are what the environment is assumed to keep doing
# forever (the liveness premise); the others are what it *may* do, a bounded number of
# times: new heads, crashes, duplicates, dead-letters, outages (an outage going on over
# a failed head's next deliveries is bounded by max_attempts instead), operator cancels. An operator
# pausing the queue and resuming it is free (whether the queue is paused is part of the
# state, so pause and resume only ever lead to finitely many states) but never fair: a
# paused queue may stay paused for ever.
DELIVER = "deliver"
ADVANCE = "advance"
COMPLETE = "complete"
RESTORE = "restore"
INGEST = "ingest"
CRASH = "crash"
REDELIVER = "redeliver"
DEAD_LETTER = "dead_letter"
OUTAGE = "outage"
OUTAGE_PERSISTS = "outage_persists"
STALL = "stall"
RESUME = "resume"
PAUSE = "pause"
UNPAUSE = "unpause"
CANCEL = "cancel"
RETRY = "retry"
FAIR_KINDS = frozenset({DELIVER, ADVANCE, COMPLETE, RESTORE, RESUME})


@dataclass(frozen=True)
class Bounds:
    """How much of the environment one run explores (each maps to a CLI flag)."""

    heads: int = 3
    rewrite: bool = True
    max_crashes: int = 1
    max_duplicates: int = 1
    max_dead_letters: int = 1
    max_outages: int = 1
    max_attempts: int = 2
    queue: str = DEFAULT_QUEUE
    max_overlaps: int = 0
    stall_points: tuple[str, ...] = STALL_POINTS
    pauses: bool = True  # explored only when the policy declares the ``paused`` parameter
    max_cancels: int = 0  # explored only when the policy declares the ``withdraw`` role
    max_retries: int = 0  # explored only when the policy declares states a retry takes

    def __post_init__(self) -> None:
        if self.heads < 1:
            raise ValueError(f"heads must be >= 1, got {self.heads}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        unknown = set(self.stall_points) - set(STALL_POINTS)
        if unknown:
            raise ValueError(f"unknown stall points {sorted(unknown)}")
        for field in fields(self):
            if field.name.startswith("max_") and getattr(self, field.name) < 0:
                raise ValueError(f"{field.name} must be >= 0, got {getattr(self, field.name)}")

    def ingest_order(self) -> tuple[str, ...]:
        """The heads in the order the poller reports them: the trunk, then the rewrite."""
        return _ingest_order(self.heads, self.rewrite)

    def history(self) -> dict[str, list[str]]:
        """A linear trunk A1..AN, plus R branching off A1 (a force-push target).

        R is not a descendant of A2..AN: once last green is past A1, an admitted R
        builds on A1 when A1 is a recorded green (an older green, the only ancestor),
        else in full (no recorded green is an ancestor).
        """
        heads = self.ingest_order()[: self.heads]
        graph = {head: ([heads[i - 1]] if i else []) for i, head in enumerate(heads)}
        if self.rewrite:
            graph[REWRITE_HEAD] = [heads[0]]
        return graph


@cache
def _ingest_order(heads: int, rewrite: bool) -> tuple[str, ...]:
    """A1..AN, then R (asked for every explored state: built once)."""
    linear = tuple(f"A{i}" for i in range(1, heads + 1))
    return (*linear, REWRITE_HEAD) if rewrite else linear


@dataclass(frozen=True)
class Budget:
    """What one path has spent of its bounded actions (part of the state hash)."""

    heads: int = 0
    crashes: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    outages: int = 0
    overlaps: int = 0
    cancels: int = 0
    retries: int = 0

    def __post_init__(self) -> None:
        # Hashed once, here: a budget is half of every state's key (a handful per run).
        object.__setattr__(self, "_hash", hash(astuple(self)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[no-any-return,attr-defined]

    def covers(self, other: Budget) -> bool:
        """Whether a path with this budget can take every action one with ``other`` can,
        and reach each state with no more spent: the same heads ingested (the next head
        is the one after them) and no more of any other bounded action.

        One action is free only once something is spent: a head that failed during the
        path's outage may fail again (``outage_persists``). With the outage not spent the
        same steps are an outage of their own, which spends it and reaches the same state.
        """
        return (
            self.heads == other.heads
            and self.crashes <= other.crashes
            and self.duplicates <= other.duplicates
            and self.dead_letters <= other.dead_letters
            and self.outages <= other.outages
            and self.overlaps <= other.overlaps
            and self.cancels <= other.cancels
            and self.retries <= other.retries
        )

    def spend(self, kind: str) -> Budget:
        """The budget after one action of ``kind`` (fair actions are free)."""
        name = _SPENDS.get(kind)
        if name is None:
            return self
        return _spent(self, name)


@cache
def _spent(budget: Budget, name: str) -> Budget:
    """``budget`` with one more ``name`` spent (a handful of budgets per run: built once)."""
    return replace(budget, **{name: getattr(budget, name) + 1})


_SPENDS = {
    INGEST: "heads",
    CRASH: "crashes",
    REDELIVER: "duplicates",
    DEAD_LETTER: "dead_letters",
    OUTAGE: "outages",
    STALL: "overlaps",
    CANCEL: "cancels",
    RETRY: "retries",
}


@dataclass(frozen=True)
class Action:
    """One edge: a kind and the timeline steps that perform it.

    ``changes`` are the paths the commit an ingest brings changed (:mod:`.paths`): the
    world's history learns them before the step runs, and a counterexample's timeline
    lists them under ``changes:``.
    """

    kind: str
    steps: tuple[TimelineStep, ...]
    changes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Hashed once, here: an action is a key of the search's known outcomes.
        object.__setattr__(self, "_hash", hash((self.kind, self.steps, self.changes)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[no-any-return,attr-defined]

    @property
    def fair(self) -> bool:
        return self.kind in FAIR_KINDS

    def describe(self) -> str:
        told = "; ".join(step.describe() for step in self.steps)
        return f"{told} (changes {' '.join(self.changes)})" if self.changes else told

    def changed(self) -> dict[str, tuple[str, ...]]:
        """The commit this action brings and its changes, as a timeline's ``changes:``."""
        if not self.changes:
            return {}
        return {step.uri: self.changes for step in self.steps if step.kind == "ingest"}


def step(kind: str, queue: str, **fields: Any) -> TimelineStep:
    """A timeline step as :func:`..simulate.timeline.load_timeline` would parse it."""
    return TimelineStep(kind, CHECK_LOCATION, queue=queue, **fields)


def step_data(item: TimelineStep, default_queue: str) -> str | dict[str, Any]:
    """The YAML form of a step, the exact inverse of the timeline parser."""
    kind = item.kind
    if kind in ("deliver", "run"):
        return kind
    if kind == "advance_ms":
        return {kind: item.amount}
    if kind in ("crash", "source_control", "stall"):
        return {kind: item.value}
    if kind == "config":
        values: dict[str, Any] = {k: as_json(v) for k, v in item.values}
        if item.queue != default_queue:
            values = {"queue": item.queue, **values}
        return {kind: values}
    if kind == "complete":
        body: dict[str, Any] = {"uri": item.uri, "outcome": item.outcome}
        if item.queue != default_queue:
            body["queue"] = item.queue
        return {kind: body}
    if item.queue != default_queue:
        return {kind: {"uri": item.uri, "queue": item.queue}}
    return {kind: item.uri}

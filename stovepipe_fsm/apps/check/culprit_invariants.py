"""The culprit invariants, as checks over one state of the culprit exploration.

Each check reads a :class:`View` (the stores as observed, the queue's search row and
what the model decided on the path) with the run's :class:`CulpritRules`, and yields
one line per thing that is wrong. ``search_ends`` is also decided by the search in
every state with no fair move left, and ``probes_never_delay_heads`` on every head's
delivery (:mod:`.culprits`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ...domain.culprit_search import CulpritSearch
from ...machine.invariants import INVARIANTS
from .observe import Observation

SEARCH_ENDS = "search_ends"
PROBE_SLOTS_BOUND = "probe_slots_bound"
NAMED_SOUNDLY = "named_soundly"
PROBES_NEVER_DELAY_HEADS = "probes_never_delay_heads"
STEPS_APPLY = "steps_apply"


@dataclass(frozen=True)
class Model:
    """What the environment decided on one path (part of the state)."""

    culprit: int = -1  # -1: not chosen yet; 0: none; k: commit ck
    flakes: int = 0
    flaked: frozenset[str] = frozenset()  # commits a flaky red was reported for
    crashes: int = 0
    repeats: int = 0
    newer: bool = False
    #: Outcomes whose record crashed: the build system reports them again.
    unsettled: tuple[tuple[str, str], ...] = ()

    def red(self, position: int) -> bool:
        """Whether the commit at ``position`` is red for certain."""
        return self.culprit > 0 and position >= self.culprit


@dataclass(frozen=True)
class CulpritRules:
    """What the checks need beyond the state: the policy's figures and the model."""

    probe_slots: int
    confirm_reds: int
    max_probes: int
    trunk: tuple[str, ...]
    green_states: frozenset[str]
    red_states: frozenset[str]
    green: str
    red: str
    checks: tuple[str, ...]  # the declared names


@dataclass(frozen=True)
class View:
    """One state, as the checks read it."""

    obs: Observation
    search: CulpritSearch | None
    model: Model


def _search_bounded(view: View, rules: CulpritRules, terminal: frozenset[str]) -> Iterator[str]:
    """The budget part of ``search_ends`` (its at-rest part is decided by the search)."""
    row = view.search
    if row is not None and row.probes_started > rules.max_probes:
        yield f"the search started {row.probes_started} probes, max_probes {rules.max_probes}"


def _probe_slots_bound(view: View, rules: CulpritRules, terminal: frozenset[str]) -> Iterator[str]:
    listed = len(view.search.probes) if view.search is not None else 0
    running = [r.id for r in view.obs.requests if r.probe_of and r.state not in terminal]
    worst = max(listed, len(running))
    if worst > rules.probe_slots:
        yield (
            f"{worst} probes in flight ({running}, {listed} listed by the search), "
            f"probe_slots {rules.probe_slots}"
        )


def _named_soundly(view: View, rules: CulpritRules, terminal: frozenset[str]) -> Iterator[str]:
    row = view.search
    if row is None or not row.culprit:
        return
    at = row.position(row.culprit)
    if not at:
        yield f"the search named {row.culprit}, not on its blamelist {list(row.blamelist)}"
        return
    parent = row.blamelist[at - 2] if at > 1 else row.base_uri
    greens = [r.id for r in view.obs.requests if r.uri == parent and r.state in rules.green_states]
    reds = [r.id for r in view.obs.requests if r.uri == row.culprit and r.state in rules.red_states]
    if not greens:
        yield f"{row.culprit} named, but its parent {parent} has no green result"
    if len(reds) < rules.confirm_reds:
        yield f"{row.culprit} named with {len(reds)} red(s), confirm_reds {rules.confirm_reds}"
    model = view.model
    if row.culprit not in model.flaked and model.culprit >= 0:
        truth = rules.trunk[model.culprit] if model.culprit else "none"
        if row.culprit != truth:
            yield f"{row.culprit} named, no flake on it, but the culprit is {truth}"


def _probes_take_no_slot(
    view: View, rules: CulpritRules, terminal: frozenset[str]
) -> Iterator[str]:
    probes = {r.id for r in view.obs.requests if r.probe_of}
    for queue in view.obs.queues:
        held = sorted(probes & set(queue.slot_holders))
        if held:
            yield f"queue {queue.name}: probes {held} hold build slots"
        for name in ("latest_request_id", "serial_holder"):
            if getattr(queue, name) in probes:
                yield f"queue {queue.name}: probe {getattr(queue, name)} is its {name}"


CulpritCheck = Callable[[View, CulpritRules, frozenset[str]], Iterator[str]]

#: The state checks of each culprit invariant; ``search_ends`` is also decided at rest
#: and ``probes_never_delay_heads`` on every head's delivery, by the search itself.
CULPRIT_CHECKS: dict[str, CulpritCheck] = {
    SEARCH_ENDS: _search_bounded,
    PROBE_SLOTS_BOUND: _probe_slots_bound,
    NAMED_SOUNDLY: _named_soundly,
    PROBES_NEVER_DELAY_HEADS: _probes_take_no_slot,
}


SUMMARIES = {
    **{name: info.summary for name in CULPRIT_CHECKS if (info := INVARIANTS.get(name))},
    STEPS_APPLY: "every step applies (record and the search do not raise)",
}

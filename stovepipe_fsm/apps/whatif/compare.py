"""What ``whatif`` compares: the figures of each run (:mod:`.figures`), and the
requests whose final outcome differs between two runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...domain.ids import parse_request_id
from ...simulation.timed import TimedRun
from .culprits import CulpritFigures, culprit_figures
from .figures import TOTAL, Figures, figures_by_queue, percentile


@dataclass(frozen=True)
class Difference:
    """A request (a head of a queue) that ends differently under the two policies."""

    queue: str
    uri: str
    request_id: str
    outcome: str
    vs_outcome: str

    def as_json(self) -> dict[str, str]:
        return {
            "queue": self.queue,
            "uri": self.uri,
            "request_id": self.request_id,
            "outcome": self.outcome,
            "vs_outcome": self.vs_outcome,
        }


@dataclass(frozen=True)
class RunSummary:
    """What the comparison needs of one run: its figures, the fate of its outcomes, and
    every head's final state. Plain data, so a run replayed in another process can send
    it back (:mod:`.parallel`)."""

    figures: dict[str, Figures]
    completes: dict[str, int]
    final: dict[tuple[str, str], tuple[str, str]]  # (queue, uri) -> (state, request id)
    culprits: CulpritFigures = field(default_factory=CulpritFigures)


def summarize(run: TimedRun) -> RunSummary:
    builds = run.world.builds
    completes = {
        "applied": run.completes_applied,
        "dropped": run.completes_dropped,
        "waiting": run.completes_waiting,
        # Builds ended by the recorded builds (:mod:`...simulation.builds`): with the
        # commit's own recorded outcome, or with one inferred for a commit never built.
        "recorded": builds.from_record if builds is not None else 0,
        "inferred": builds.inferred if builds is not None else 0,
    }
    heads = (r for r in run.world.requests.snapshot() if not r.probe_of)
    final = {(r.queue, r.uri): (r.state, r.id) for r in heads}
    return RunSummary(figures_by_queue(run), completes, final, culprit_figures(run))


def differences(run: RunSummary, vs: RunSummary) -> list[Difference]:
    """Heads whose final state differs, by queue and ingest order. A head is the same
    head under both policies when it is the same commit of the same queue."""
    mine, theirs = run.final, vs.final
    found: list[tuple[tuple[str, int, str], Difference]] = []
    for key in mine.keys() | theirs.keys():
        a, b = mine.get(key), theirs.get(key)
        state_a = a[0] if a else "-"
        state_b = b[0] if b else "-"
        if state_a != state_b:
            rid = (a or b)[1]  # type: ignore[index]
            order = (key[0], parse_request_id(rid).counter, key[1])
            found.append((order, Difference(key[0], key[1], rid, state_a, state_b)))
    found.sort(key=_first)
    return [difference for _, difference in found]


__all__ = [
    "TOTAL",
    "CulpritFigures",
    "Difference",
    "Figures",
    "RunSummary",
    "differences",
    "percentile",
    "summarize",
]


def _first(pair: tuple[tuple[str, int, str], Difference]) -> tuple[str, int, str]:
    return pair[0]

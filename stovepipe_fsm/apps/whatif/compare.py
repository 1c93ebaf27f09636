"""What ``whatif`` compares: the figures of each run (:mod:`.figures`), and the
requests whose final outcome differs between two runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...domain.ids import parse_request_id
from ...simulation.timed import TimedRun
from .culprits import CulpritFigures, culprit_figures
from .figures import Figures, figures_by_queue, percentile


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


def differences(runs: Sequence[RunSummary]) -> list[dict[str, Any]]:
    """Heads whose final state is not the same under every policy, by queue and ingest
    order; ``-`` where a run never ingested the head. A head is the same head under every
    policy when it is the same commit of the same queue."""
    keys = {key for run in runs for key in run.final}
    found = []
    for queue, uri in keys:
        seen = [run.final.get((queue, uri)) for run in runs]
        states = [s[0] if s else "-" for s in seen]
        if len(set(states)) > 1:
            rid = next(s[1] for s in seen if s)
            counter = parse_request_id(rid).counter
            found.append(((queue, counter, uri), queue, uri, rid, states))
    found.sort(key=lambda f: f[0])
    return [{"queue": q, "uri": u, "request_id": r, "outcomes": s} for _, q, u, r, s in found]


__all__ = ["RunSummary", "differences", "percentile", "summarize"]

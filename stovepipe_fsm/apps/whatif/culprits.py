"""The figures of culprit finding in one policy's replay: one function of one run.

Read from what the run announced and stored, so any policy's search machine is measured
the same way:

- searches: red heads whose search started; each ended announced (``culprit_found`` or
  ``culprit_unresolved``) or is still open when the replay ends;
- named: searches that announced ``culprit_found``; named right: those whose culprit is
  one the timeline declares (``culprits:``) breaks the red head (``None`` when the
  timeline declares none);
- unresolved: searches announced ``culprit_unresolved``, counted by the reason given;
- open: searches still searching when the replay ends;
- probe builds: the probe requests started; probe slot-hours: the time each held its
  probe slot (start to end, or to the end of the replay); most probes at once: the most
  probe builds of one queue running at one instant;
- red->culprit: from the end of the red head's build to its ``culprit_found``.

Probes are no trunk heads: :mod:`.figures` leaves them out of every other figure.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ...domain.hooks import CULPRIT_FOUND, CULPRIT_UNRESOLVED
from ...process.culprit import SEARCHING
from ...simulation.timed import TimedRun
from .figures import MS_PER_HOUR, percentile
from .table import at


@dataclass(frozen=True)
class CulpritFigures:
    """One policy's culprit finding over a whole replay (module docstring)."""

    searches: int = 0
    named: int = 0
    named_right: int | None = None
    unresolved: tuple[tuple[str, int], ...] = ()  # (reason, searches), by reason
    open: int = 0
    probe_builds: int = 0
    probe_slot_ms: int = 0
    most_probes_at_once: int = 0
    to_culprit_ms: tuple[int, ...] = ()  # red head's end -> culprit_found, sorted

    @property
    def reported(self) -> bool:
        """Whether the run searched at all (a table shows culprit rows only then)."""
        return bool(self.searches or self.probe_builds)

    def as_json(self) -> dict[str, Any]:
        return {
            "searches": self.searches,
            "named": self.named,
            "named_right": self.named_right,
            "unresolved": sum(n for _, n in self.unresolved),
            "unresolved_reasons": dict(self.unresolved),
            "open": self.open,
            "probe_builds": self.probe_builds,
            "probe_slot_hours": round(self.probe_slot_ms / MS_PER_HOUR, 3),
            "most_probes_at_once": self.most_probes_at_once,
            "red_to_culprit_ms": {
                "p50": percentile(self.to_culprit_ms, 50),
                "max": self.to_culprit_ms[-1] if self.to_culprit_ms else None,
            },
        }


def culprit_figures(run: TimedRun) -> CulpritFigures:
    """The culprit finding of ``run`` (module docstring)."""
    world = run.world
    requests = {r.id: r for r in world.requests.snapshot()}
    ends = {p.dedup_id: p for p in world.published.hooks()}.values()  # a repeat is one
    found = [p.event() for p in ends if p.event_type == CULPRIT_FOUND]
    reasons = Counter(
        p.event().payload.get("reason", "") for p in ends if p.event_type == CULPRIT_UNRESOLVED
    )
    still_open = sum(1 for row in world.searches.snapshot() if row.state == SEARCHING)
    builds = world.builds
    right = None
    if builds is not None and builds.culprits is not None:
        right = sum(
            1
            for e in found
            if e.payload["culprit"] in builds.breaking(requests[e.payload["request_id"]].uri)
        )
    to_culprit = []
    for event in found:
        red = run.times.get(event.payload["request_id"])
        if red is not None and red.ended_ms is not None:
            to_culprit.append(event.timestamp_ms - red.ended_ms)
    end_ms = world.clock.now_ms()
    spans: dict[str, list[tuple[int, int]]] = {}
    for request in requests.values():
        times = run.times.get(request.id)
        if request.probe_of and times is not None and times.admitted_ms is not None:
            ended = times.ended_ms if times.ended_ms is not None else end_ms
            spans.setdefault(request.queue, []).append((times.admitted_ms, ended))
    every = list(itertools.chain.from_iterable(spans.values()))
    return CulpritFigures(
        searches=len(found) + sum(reasons.values()) + still_open,
        named=len(found),
        named_right=right,
        unresolved=tuple(sorted(reasons.items())),
        open=still_open,
        probe_builds=len(every),
        probe_slot_ms=sum(end - start for start, end in every),
        most_probes_at_once=max((_most_at_once(s) for s in spans.values()), default=0),
        to_culprit_ms=tuple(sorted(to_culprit)),
    )


def _most_at_once(spans: Iterable[tuple[int, int]]) -> int:
    """The most spans covering one instant; a span ending at an instant is over before
    one starting at it begins (its slot is free again)."""
    edges = sorted(e for start, end in spans for e in ((start, 1), (end, -1)))
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


#: The culprit rows of a table, in :meth:`CulpritFigures.as_json`'s order; the reasons
#: some run gave for unresolved searches follow ``unresolved``.
ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("culprit searches", ("searches",)),
    ("culprits named", ("named",)),
    ("named right", ("named_right",)),
    ("unresolved", ("unresolved",)),
    ("searches open", ("open",)),
    ("probe builds", ("probe_builds",)),
    ("probe slot-hours", ("probe_slot_hours",)),
    ("most probes at once", ("most_probes_at_once",)),
    ("red->culprit p50 ms", ("red_to_culprit_ms", "p50")),
    ("red->culprit max ms", ("red_to_culprit_ms", "max")),
)


def culprit_rows(blocks: Sequence[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """Each culprit row's label and cells, one cell per run's ``as_json`` block."""
    reasons = sorted({r for block in blocks for r in block["unresolved_reasons"]})
    rows: list[tuple[str, list[str]]] = []
    for label, path in ROWS:
        rows.append((label, [at(block, path) for block in blocks]))
        if path == ("unresolved",):
            for reason in reasons:
                cells = [str(block["unresolved_reasons"].get(reason, 0)) for block in blocks]
                rows.append((f"  {reason}", cells))
    return rows

"""Requests and queues as JSON documents and aligned text: one view for every command.

``simulate`` prints a simulated world's rows and ``status`` a live pipeline's through
these same functions, so a simulation and a deployment read alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..domain.culprit_search import CulpritSearch, frontier
from ..domain.entities import Queue, Request
from ..domain.parameter_text import short_commit


def age_text(at_ms: int, now_ms: int) -> str:
    """How long ago ``at_ms`` was, in the unit that reads best (status and the page)."""
    if not at_ms:
        return "age unknown"
    seconds = max(0, (now_ms - at_ms) // 1000)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def request_json(r: Request) -> dict[str, Any]:
    return {
        "id": r.id,
        "queue": r.queue,
        "uri": r.uri,
        "state": r.state,
        "build_strategy": r.build_strategy,
        "base_uri": r.base_uri,
        "superseded_by": r.superseded_by,
        "ingested_at_ms": r.ingested_at_ms,
        "admitted_at_ms": r.admitted_at_ms,
        "ended_at_ms": r.ended_at_ms,
        # Only on a request an operator's retry made (simulate never makes one).
        **({"retry_of": r.retry_of} if r.retry_of else {}),
        # Only on a probe: a culprit search's build of a commit, for this red head.
        **({"probe_of": r.probe_of} if r.probe_of else {}),
    }


def search_json(s: CulpritSearch, red_uri: str = "", probe_slots: object = None) -> dict[str, Any]:
    """A queue's culprit search as ``status --json`` shows it: where it stands, for which
    red head (``red_uri``: its commit, when known), the culprit or why none, the evidence
    (``green_through`` / ``red_from``: blamelist positions, 0 the green base) and the
    probes in flight out of ``probe_slots`` (None: not recorded)."""
    green_through, red_from = frontier(s.tallies)
    return {
        "state": s.state,
        "red_request_id": s.red_request_id,
        "red_uri": red_uri,
        "base_uri": s.base_uri,
        "culprit": s.culprit,
        "reason": s.reason,
        "blamelist": len(s.blamelist),
        "green_through": green_through,
        "red_from": red_from,
        "probes_started": s.probes_started,
        "in_flight": len(s.probes),
        "probe_slots": probe_slots,
        "probes": [{"request_id": p.request_id, "commit": p.commit} for p in s.probes],
        "started_at_ms": s.started_at_ms,
        "ended_at_ms": s.ended_at_ms,
    }


def queue_json(q: Queue) -> dict[str, Any]:
    return {
        "name": q.name,
        "in_flight_count": q.in_flight_count,
        "last_green_uri": q.last_green_uri,
        "latest_request_id": q.latest_request_id,
        # Only on a queue the service moved off the process stream (a broker's partition).
        **({"partition": q.partition} if q.partition else {}),
    }


def render_requests_and_queues(doc: dict[str, Any], *, heading: str = "requests:") -> list[str]:
    """The ``requests`` and ``queues`` of a result document as aligned text lines.

    Shared by ``simulate`` and ``status`` so a simulation and a live pipeline print alike.
    """
    return [
        heading,
        *render_request_rows(doc["requests"]),
        "queues:",
        *(render_queue_row(q) for q in doc["queues"]),
    ]


def aligned(
    header: tuple[str, ...], rows: Sequence[tuple[str, ...]], indent: str = "  "
) -> list[str]:
    """``header`` and ``rows`` as text columns, each as wide as its widest cell (the last
    one left unpadded): a header line, then a line per row."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]

    def line(row: tuple[str, ...]) -> str:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        return (indent + "  ".join([*cells, *row[len(widths) :]])).rstrip()

    return [line(header), *(line(row) for row in rows)]


REQUEST_COLUMNS = ("request", "commit", "state", "strategy", "base")


def render_request_rows(requests: list[dict[str, Any]]) -> list[str]:
    """One aligned line per request, commits cut short (``--json`` keeps them whole)."""
    if not requests:
        return []
    rows = []
    for r in requests:
        retry = f"  (retry of {r['retry_of']})" if r.get("retry_of") else ""
        base = (short_commit(r["base_uri"]) or "-") + retry
        rows.append((r["id"], short_commit(r["uri"]), r["state"], r["build_strategy"] or "-", base))
    return aligned(REQUEST_COLUMNS, rows)


def render_queue_row(q: dict[str, Any], holders: list[str] | None = None) -> str:
    held = "" if holders is None else f" holders={', '.join(holders) or '-'}"
    partition = f" partition={q['partition']}" if q.get("partition") else ""
    green = short_commit(q["last_green_uri"]) or "-"
    return (
        f"  {q['name']}: in_flight={q['in_flight_count']}{held} "
        f"last_green={green} latest={q['latest_request_id'] or '-'}{partition}"
    )

"""A request's decision trail as the sentences ``explain`` prints, and as JSON."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..domain.trail_record import (
    ADMITTED,
    DEAD_LETTERED,
    ENDED,
    HELD,
    INGESTED,
    OPERATOR,
    PLUGIN,
    RECLAIMED,
    SKIPPED,
    SUPERSEDED,
    TrailRecord,
)


def clock_text(at_ms: int) -> str:
    """``at_ms`` as UTC with milliseconds (the clock port's epoch milliseconds)."""
    seconds, millis = divmod(at_ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def sentence(record: TrailRecord) -> str:
    """What was decided about the request and why, in one line."""
    d = record.details
    if record.kind == INGESTED:
        returned = " (trunk returned to this commit)" if d.get("returned") else ""
        retry = f" (retry of {d['retry_of']})" if d.get("retry_of") else ""
        return f"ingested {d.get('uri', '')}{returned}{retry}"
    if record.kind == HELD:
        times = "once" if record.count == 1 else f"{record.count} times"
        until = "" if record.count == 1 else f" until {clock_text(record.at_ms)}"
        holders = d.get("holders") or "none"
        return (
            f"held {times}{until}: {d.get('reason') or 'no reason recorded'} "
            f"(slot holders: {holders}; {d.get('parameters') or 'no parameters'})"
        )
    if record.kind == SUPERSEDED:
        return f"superseded by {d.get('by') or 'a newer head'} (never built)"
    if record.kind == SKIPPED:
        green = d.get("green") or "last green"
        return (
            f"skipped: every change since {green} matches skip_paths: "
            f"{d.get('matched', '')} (never built, last green unchanged)"
        )
    if record.kind == ADMITTED:
        base = d.get("base") or "no base"
        why = f" ({d['why']})" if d.get("why") else ""
        return f"admitted: {d.get('strategy', '')} build on {base}{why}" + green_chosen(d)
    if record.kind == ENDED:
        return f"ended {d.get('outcome', '')} (reported by {d.get('by', '')})"
    if record.kind == RECLAIMED:
        why = d.get("why", "ended, slot not yet freed")
        return f"slot reclaimed by the gate: {why} (found while deciding {d.get('by', '')})"
    if record.kind == DEAD_LETTERED:
        attempts = d.get("attempts", "0")
        return f"dead-lettered after {attempts} failed attempt(s): {d.get('error', '')}"
    if record.kind == OPERATOR:
        who = d.get("by") or "unknown user"
        return f"operator {who} ran {d.get('verb', '?')}: {d.get('what', '')}"
    if record.kind == PLUGIN:
        own = ", ".join(f"{k}={v}" for k, v in sorted(d.items()) if k not in ("plugin", "note"))
        return f"plugin {d.get('plugin', '?')} noted: {d.get('note', '')}" + (
            f" ({own})" if own else ""
        )
    return record.kind


def green_chosen(d: Mapping[str, str]) -> str:
    """The recorded green an admission builds on, and how many newer greens it passed."""
    if not d.get("base_request"):
        return ""
    passed = d.get("newer_greens_not_ancestors", "0")
    return f"; green of {d['base_request']} ({passed} newer green(s) not ancestors)"


def render_history(request: dict[str, Any] | None, records: Sequence[TrailRecord]) -> str:
    """The request's row (when known) and its history, oldest decision first."""
    lines = []
    if request is not None:
        lines.append(
            f"{request['id']}  {request['uri']}  {request['state']}"
            + (f"  {request['build_strategy']}" if request.get("build_strategy") else "")
        )
    if not records:
        lines.append("  (no decisions recorded)")
    for record in records:
        policy = f"  [policy {record.policy}]" if record.policy else ""
        seq = f"  [delivery {record.stream_seq}]" if record.stream_seq else ""
        lines.append(f"  {clock_text(record.first_at_ms)}  {sentence(record)}{policy}{seq}")
    return "\n".join(lines)


def history_json(request: dict[str, Any] | None, records: Sequence[TrailRecord]) -> dict[str, Any]:
    return {
        "request": request,
        "history": [{**r.as_json(), "sentence": sentence(r)} for r in records],
    }

"""A request's decision trail as the story ``explain`` prints, and as JSON.

The story is told in commit terms: a request another line names (the newer head that
superseded it, a slot holder, the head at the front of its queue) is shown by its
commit and its counter (``4f2a9c1e0b (request 7)``) when the caller resolved its commit
(:class:`Story`). The parameters a decision ran under are printed once, at the first
decision that carries them, and again only where they changed. A head still waiting
ends with where it stands in its queue (:class:`Position`), which no decision of its
own records: behind the front of a serial or paused queue its deliveries have not run.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..domain import trail_record as kinds
from ..domain.ids import parse_request_id
from ..domain.parameter_text import short_commit
from ..domain.trail_record import TrailRecord

FULL = "full"


def clock_text(at_ms: int) -> str:
    """``at_ms`` as UTC with milliseconds (the clock port's epoch milliseconds)."""
    seconds, millis = divmod(at_ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``22nd``."""
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


def request_counter(request_id: str) -> str:
    """``request 7`` for ``request/<queue>/7``; the id itself when it is malformed."""
    try:
        return f"request {parse_request_id(request_id).counter}"
    except ValueError:
        return request_id


@dataclass(frozen=True)
class Position:
    """Where a waiting head stands in its queue: ``place`` 1 is the front (the head the
    queue's consumer delivers, and holds, first), of ``waiting`` heads in all."""

    place: int
    waiting: int
    front_id: str
    front_uri: str
    #: Why the front waits: the reason of its latest hold ("" when it has none yet).
    front_reason: str = ""


@dataclass(frozen=True)
class Story:
    """What a story needs beyond the records: the commit of each request it names, and
    where the request stands when it still waits."""

    commits: Mapping[str, str] = field(default_factory=dict)
    position: Position | None = None

    def name(self, request_id: str) -> str:
        """``<short commit> (request N)`` when the commit is known, else the id."""
        uri = self.commits.get(request_id)
        return f"{short_commit(uri)} ({request_counter(request_id)})" if uri else request_id

    def holder(self, request_id: str) -> str:
        """A slot holder: its id, then its commit when known."""
        uri = self.commits.get(request_id)
        return f"{request_id} ({short_commit(uri)})" if uri else request_id


NO_STORY = Story()

#: The detail that names the red head a probe builds for, by the record's kind.
_FOR_HEAD = {kinds.PROBE_STARTED: "for_head", kinds.ADMITTED: "probe_of"}


def named_requests(records: Sequence[TrailRecord]) -> set[str]:
    """The other requests the records name (superseded by, slot holders, reclaimed by,
    the red head a probe builds for)."""
    named: set[str] = set()
    for record in records:
        d = record.details
        if record.kind in (kinds.PROBE_STARTED, kinds.ADMITTED) and d.get(_FOR_HEAD[record.kind]):
            named.add(d[_FOR_HEAD[record.kind]])
        if record.kind in (kinds.SUPERSEDED, kinds.RECLAIMED) and d.get("by"):
            named.add(d["by"])
        if record.kind == kinds.HELD and d.get("holders"):
            named.update(h.strip() for h in d["holders"].split(",") if h.strip())
    return named


def sentence(record: TrailRecord, story: Story = NO_STORY) -> str:
    """What was decided about the request and why, in one line."""
    d = record.details
    if record.kind == kinds.INGESTED:
        returned = " (trunk returned to this commit)" if d.get("returned") else ""
        retry = f" (retry of {d['retry_of']})" if d.get("retry_of") else ""
        return f"ingested {short_commit(d.get('uri', ''))}{returned}{retry}"
    if record.kind == kinds.HELD:
        times = "once" if record.count == 1 else f"{record.count} times"
        until = "" if record.count == 1 else f" until {clock_text(record.at_ms)}"
        holders = [h.strip() for h in d.get("holders", "").split(",") if h.strip()]
        shown = ", ".join(story.holder(h) for h in holders) or "none"
        plugin = f", a rule of plugin {d['plugin']}" if d.get("plugin") else ""
        return (
            f"held {times}{until}: {d.get('reason') or 'no reason recorded'}{plugin} "
            f"(slot holders: {shown})"
        )
    if record.kind == kinds.SUPERSEDED:
        by = story.name(d["by"]) if d.get("by") else "a newer head"
        return f"superseded by {by} (never built)"
    if record.kind == kinds.PREEMPTED:
        by = story.name(d["by"]) if d.get("by") else "a newer head"
        return f"preempted by {by}: running build ended, slot freed"
    if record.kind == kinds.SKIPPED:
        green = short_commit(d.get("green", "")) or "last green"
        return (
            f"skipped: every change since {green} matches skip_paths: "
            f"{d.get('matched', '')} (never built, last green unchanged)"
        )
    if record.kind == kinds.ADMITTED and d.get("probe_of"):
        return f"admitted: a probe build, in a probe slot, for red head {story.name(d['probe_of'])}"
    if record.kind == kinds.ADMITTED:
        return _admitted(d) + green_chosen(d)
    if record.kind == kinds.PROBE_STARTED:
        return (
            f"probe of {short_commit(d.get('commit', ''))} (position {d.get('position', '?')} "
            f"of the {d.get('blamelist', '?')} commits in the blamelist) for red head "
            f"{story.name(d.get('for_head', ''))}"
        )
    if record.kind == kinds.CULPRIT:
        return search_sentence(d)
    if record.kind == kinds.ENDED and d.get("moot"):
        return (
            f"outcome {d.get('outcome', '')} reported by {d.get('by', '')} after the build "
            f"was {d['moot']}: moot, nothing applied"
        )
    if record.kind == kinds.ENDED:
        return f"ended {d.get('outcome', '')} (reported by {d.get('by', '')})"
    if record.kind == kinds.RECLAIMED:
        why = d.get("why", "ended, slot not yet freed")
        by = story.name(d.get("by", ""))
        return f"slot reclaimed by the gate: {why} (found while deciding {by})"
    if record.kind == kinds.ATTEMPT_FAILED:
        return _attempt_failed(d)
    if record.kind == kinds.DEAD_LETTERED:
        attempts = d.get("attempts", "0")
        return f"dead-lettered after {attempts} failed attempt(s): {d.get('error', '')}"
    if record.kind == kinds.OPERATOR:
        who = d.get("by") or "unknown user"
        return f"operator {who} ran {d.get('verb', '?')}: {d.get('what', '')}"
    if record.kind == kinds.PLUGIN:
        own = ", ".join(f"{k}={v}" for k, v in sorted(d.items()) if k not in ("plugin", "note"))
        shown = f" ({own})" if own else ""
        return f"plugin {d.get('plugin', '?')} noted: {d.get('note', '')}{shown}"
    return record.kind


def green_chosen(d: Mapping[str, str]) -> str:
    """The recorded green an admission builds on, and how many newer greens it passed."""
    if not d.get("base_request"):
        return ""
    passed = d.get("newer_greens_not_ancestors", "0")
    return f"; green of {d['base_request']} ({passed} newer green(s) not ancestors)"


def _admitted(d: Mapping[str, str]) -> str:
    """An incremental build names its base and why it may build on it; a full build
    says why it is full (no last green, a rewrite, ancestry unknown, a path rule)."""
    strategy, why = d.get("strategy", ""), d.get("why", "")
    if strategy == FULL:
        return f"admitted: full build (why full: {why or 'no reason recorded'})"
    base = short_commit(d.get("base", "")) or "no base"
    return f"admitted: {strategy} build on {base}" + (f" ({why})" if why else "")


def search_sentence(d: Mapping[str, object], probe_slots: object = None) -> str:
    """Where a culprit search stands: its state, the culprit or why none, and its
    evidence (positions count from the green base, 0, to the red head). ``d`` has the
    fields of a ``culprit`` trail record (or a search row as ``status --json`` shows it);
    ``probe_slots``, when known, is what the probes in flight are out of."""
    state = str(d.get("state", ""))
    if state == "named":
        verdict = f" {short_commit(str(d.get('culprit', '')))} as the culprit"
    elif d.get("reason"):
        verdict = f": {d['reason']}"
    else:
        verdict = ""
    green, red = str(d.get("green_through", 0)), str(d.get("red_from", 0))
    slots = f" of {probe_slots} probe slot(s)" if probe_slots is not None else ""
    return (
        f"culprit search {state}{verdict} (blamelist {d.get('blamelist', 0)} commit(s); "
        f"green through {'the base' if green == '0' else 'position ' + green}, "
        f"red from {'none' if red == '0' else 'position ' + red}; "
        f"{d.get('probes_started', 0)} probe(s) started, {d.get('in_flight', 0)} in flight"
        f"{slots})"
    )


def _attempt_failed(d: Mapping[str, str]) -> str:
    """``attempt 2 of 5 failed: <error>; next try at <time>, dead letter after attempt 5``."""
    of = f" of {d['max_attempts']}" if d.get("max_attempts") else ""
    next_at = d.get("next_try_at_ms", "")
    when = f"; next try at {clock_text(int(next_at))}" if next_at.isdigit() else ""
    budget = f", dead letter if attempt {d['max_attempts']} fails" if d.get("max_attempts") else ""
    return f"attempt {d.get('attempt', '?')}{of} failed: {d.get('error', '')}{when}{budget}"


def position_sentence(position: Position) -> str:
    """Where a waiting head stands: at the front (and why the front waits), or behind it."""
    held = f" (held: {position.front_reason})" if position.front_reason else ""
    if position.place <= 1:
        return f"waiting at the front of its queue{held}; {position.waiting} waiting"
    front = (
        f"{short_commit(position.front_uri)} ({request_counter(position.front_id)})"
        if position.front_uri
        else position.front_id
    )
    return (
        f"waiting {ordinal(position.place)} behind {front} at the front{held}; "
        f"{position.waiting} waiting"
    )


def _story_entries(records: Sequence[TrailRecord], story: Story) -> list[dict[str, Any]]:
    """Each record with its sentence, and ``parameters`` where they first appear or
    changed (a hold carries the parameters it was decided under)."""
    entries, shown = [], ""
    for record in records:
        entry: dict[str, Any] = {**record.as_json(), "sentence": sentence(record, story)}
        parameters = record.details.get("parameters", "")
        if parameters and parameters != shown:
            entry["parameters"] = parameters
            shown = parameters
        entries.append(entry)
    return entries


def render_history(
    request: dict[str, Any] | None, records: Sequence[TrailRecord], story: Story = NO_STORY
) -> str:
    """The request's row (when known) and its story, oldest decision first."""
    lines = []
    if request is not None:
        lines.append(
            f"{request['id']}  {short_commit(request['uri'])}  {request['state']}"
            + (f"  {request['build_strategy']}" if request.get("build_strategy") else "")
            + (f"  probe of {story.name(request['probe_of'])}" if request.get("probe_of") else "")
        )
    if not records:
        lines.append("  (no decisions recorded)")
    for entry in _story_entries(records, story):
        if "parameters" in entry:
            lines.append(f"  parameters: {entry['parameters']}")
        policy = f"  [policy {entry['policy']}]" if entry["policy"] else ""
        seq = f"  [delivery {entry['stream_seq']}]" if entry["stream_seq"] else ""
        lines.append(f"  {clock_text(entry['first_at_ms'])}  {entry['sentence']}{policy}{seq}")
    if story.position is not None:
        lines.append(f"  now: {position_sentence(story.position)}")
    return "\n".join(lines)


def history_json(
    request: dict[str, Any] | None, records: Sequence[TrailRecord], story: Story = NO_STORY
) -> dict[str, Any]:
    """``explain --json``: the row, the story's entries and, for a waiting head, where it
    stands (``position``, with its sentence) and the commits of the requests named."""
    out: dict[str, Any] = {"request": request, "history": _story_entries(records, story)}
    if story.position is not None:
        out["position"] = {
            **asdict(story.position),
            "sentence": position_sentence(story.position),
        }
    if story.commits:
        out["commits"] = dict(sorted(story.commits.items()))
    return out


def story_from_json(doc: Mapping[str, Any]) -> Story:
    """The :class:`Story` of an ``explain --json`` document (its commits and position)."""
    position = doc.get("position")
    return Story(
        dict(doc.get("commits", {})),
        Position(
            int(position["place"]),
            int(position["waiting"]),
            str(position["front_id"]),
            str(position["front_uri"]),
            str(position.get("front_reason", "")),
        )
        if position
        else None,
    )

"""The read-only HTML status page: queues, the latest decisions, a request, the policy.

Pure functions from the documents ``status`` and ``explain`` print (and trail records)
to HTML text, so what the page shows is what the commands show. No template engine: a
handful of fixed pages do not justify one, and building the markup here keeps one rule
easy to check: every text that reaches the page passes through :func:`text` (stdlib
``html.escape``, quotes included), and every link through :func:`href`. Queue names,
commit uris, pause reasons and trail details are user-supplied and may hold ``<script>``.

The page needs nothing beyond the service: the one stylesheet is inline and named by its
hash in the ``Content-Security-Policy`` (:func:`content_security_policy`), which allows
no script, no remote source and no form target but the service itself. It refreshes
itself with ``<meta http-equiv="refresh">``, so it needs no script either.

It stays fast with many queues: the overview sorts the queues that need a look first
(paused, holding a slot, or with heads waiting), filters by a substring of the name, and
renders one page of :data:`PAGE_SIZE` rows plus a summary of all of them.
"""

from __future__ import annotations

import base64
import hashlib
import html
import math
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..domain.parameter_text import short_commit, value_text
from ..domain.trail_record import TrailRecord
from .entities import age_text
from .explain import Story, clock_text, request_counter, search_sentence, sentence

PAGE_SIZE = 50
#: Seconds between two loads of a page in a browser (``<meta http-equiv="refresh">``).
REFRESH_S = 5
#: How many of the newest trail records the overview lists.
LATEST_DECISIONS = 30

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1d1d1f;background:#fff}
header{display:flex;gap:1.5rem;align-items:baseline;flex-wrap:wrap}
h1{font-size:1.3rem;margin:0}h2{font-size:1.1rem;margin-top:1.6rem}
nav a{margin-right:1rem}
table{border-collapse:collapse;width:100%;font-size:.9rem}
th,td{border-bottom:1px solid #ddd;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#f4f4f6}
code,.mono{font-family:ui-monospace,monospace;font-size:.85rem;word-break:break-all}
.when,.queue-name,.commit{white-space:nowrap;word-break:normal}
.params{word-break:normal;overflow-wrap:anywhere}
table.facts{width:auto}table.facts th{width:12rem}
.refused{border-left:.3rem solid #b3261e;padding:.2rem .8rem;background:#fdecea}
.paused{color:#fff;background:#b3261e;padding:0 .4rem;border-radius:.3rem}
.held{color:#1d1d1f;background:#ffe8a3;padding:0 .4rem;border-radius:.3rem}
.muted{color:#6e6e73}.summary span{margin-right:1.2rem}
pre{background:#f4f4f6;padding:.8rem;overflow:auto;font-size:.8rem}
.diagram svg{max-width:100%;height:auto}
"""


def content_security_policy() -> str:
    """Nothing from anywhere, but the page's own inline stylesheet (by hash), images
    inline in it, and the filter form posting back to the service: no script at all."""
    style_hash = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
    return (
        "default-src 'none'; "
        f"style-src 'sha256-{style_hash}'; "
        "img-src 'self' data:; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    )


def text(value: object) -> str:
    """``value`` as HTML text: every ``<``, ``>``, ``&`` and quote escaped."""
    return html.escape(str(value), quote=True)


def href(path: str, **query: object) -> str:
    """A link inside the service: the path's segments and the query percent-encoded, the
    whole escaped for an attribute."""
    quoted = urllib.parse.quote(path, safe="/")
    pairs = {k: str(v) for k, v in query.items() if v not in ("", None)}
    tail = f"?{urllib.parse.urlencode(pairs)}" if pairs else ""
    return text(quoted + tail)


def request_href(request_id: str) -> str:
    return href(f"/request/{request_id}")


def request_link(request_id: str) -> str:
    """A request's id, linking to its page."""
    return f'<a href="{request_href(request_id)}"><code>{text(request_id)}</code></a>'


def commit_link(request_id: str, uri: str) -> str:
    """A commit, cut short, linking to the request that built (or waits with) it."""
    shown = f'<code class="commit" title="{text(uri)}">{text(short_commit(uri))}</code>'
    return f'<a href="{request_href(request_id)}">{shown}</a>' if request_id else shown


def _table(table_id: str, headings: Iterable[str], rows: Iterable[str]) -> str:
    """A table with a heading row and ``rows`` (already HTML)."""
    head = "".join(f"<th>{heading}</th>" for heading in headings)
    return (
        f'<table id="{table_id}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _facts(facts: Iterable[tuple[str, object]]) -> str:
    """Rows of a facts table: each name as a heading beside its value (already HTML)."""
    return "".join(f"<tr><th>{text(k)}</th><td>{v}</td></tr>" for k, v in facts)


def _parameter_rows(parameters: Iterable[tuple[str, object]]) -> str:
    return "".join(
        f'<tr><th><code>{text(k)}</code></th><td class="params"><code>{text(value_text(v))}'
        "</code></td></tr>"
        for k, v in parameters
    )


# --- the overview ---------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    request_id: str
    admitted_at_ms: int
    #: When the holder's lease runs out (0: leases are off, or none recorded).
    lease_expires_at_ms: int = 0


@dataclass(frozen=True)
class QueueView:
    """One queue as the overview shows it."""

    name: str
    parameters: Mapping[str, object]
    #: The operator pause that matches the queue ("" when none does).
    paused_by: str
    paused: bool
    holders: tuple[Holder, ...]
    waiting: int
    oldest_id: str
    oldest_uri: str
    oldest_ingested_at_ms: int
    last_green_uri: str
    last_green_request_id: str = ""
    #: When the last green's build ended (0: not known).
    last_green_at_ms: int = 0
    #: The queue's culprit search as ``status --json`` shows it (None: it never had one).
    search: Mapping[str, Any] | None = None

    @property
    def needs_a_look(self) -> bool:
        return self.paused or bool(self.holders) or self.waiting > 0


def queue_views(
    doc: Mapping[str, Any],
    leases: Mapping[str, Mapping[str, int]],
    paused_by: Mapping[str, str],
) -> list[QueueView]:
    """The queues of a ``status`` document, with the lease expiry of each holder
    (``leases``: queue -> holder -> epoch ms) and the pause pattern that matches it."""
    details = doc.get("queue_details", {})
    views = []
    for q in doc.get("queues", []):
        name = str(q["name"])
        detail = details.get(name, {})
        parameters = dict(detail.get("parameters", {}))
        mine = leases.get(name, {})
        holders = tuple(
            Holder(str(h["id"]), int(h["admitted_at_ms"] or 0), int(mine.get(h["id"], 0)))
            for h in detail.get("holders", [])
        )
        oldest = detail.get("oldest_waiting") or {}
        green = detail.get("last_green") or {}
        pattern = paused_by.get(name, "")
        views.append(
            QueueView(
                name=name,
                parameters=parameters,
                paused_by=pattern,
                paused=bool(pattern) or parameters.get("paused") is True,
                holders=holders,
                waiting=int(detail.get("waiting", 0)),
                oldest_id=str(oldest.get("id", "")),
                oldest_uri=str(oldest.get("uri", "")),
                oldest_ingested_at_ms=int(oldest.get("ingested_at_ms") or 0),
                last_green_uri=str(q.get("last_green_uri", "")),
                last_green_request_id=str(green.get("request_id", "")),
                last_green_at_ms=int(green.get("at_ms") or 0),
                search=doc.get("searches", {}).get(name),
            )
        )
    return views


@dataclass(frozen=True)
class Selection:
    """Which queues one overview page lists: a name filter and a page number (from 1)."""

    filter: str = ""
    page: int = 1

    @classmethod
    def from_query(cls, query: Mapping[str, Sequence[str]]) -> Selection:
        """From a parsed query string; a page that is no positive number is page 1."""
        wanted = (query.get("q") or [""])[0].strip()[:200]
        try:
            page = max(1, int((query.get("page") or ["1"])[0]))
        except ValueError:
            page = 1
        return cls(wanted, page)

    def pick(self, queues: Iterable[QueueView]) -> tuple[list[QueueView], int, int]:
        """This page's queues, the number of queues the filter keeps, and the page count.
        Queues that need a look (paused, holding, waiting) come first, then by name."""
        needle = self.filter.casefold()
        kept = [q for q in queues if needle in q.name.casefold()] if needle else list(queues)
        kept.sort(key=lambda q: (not q.needs_a_look, q.name))
        pages = max(1, math.ceil(len(kept) / PAGE_SIZE))
        page = min(self.page, pages)
        start = (page - 1) * PAGE_SIZE
        return kept[start : start + PAGE_SIZE], len(kept), pages


def render_overview(
    doc: Mapping[str, Any],
    queues: Sequence[QueueView],
    decisions: Sequence[TrailRecord],
    selection: Selection,
    *,
    now_ms: int | None = None,
) -> str:
    """``/``: the summary of every queue, one page of queues, the latest decisions."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    shown, kept, pages = selection.pick(queues)
    page = min(selection.page, pages)
    body = [
        _summary(doc, queues),
        _pauses(doc, now),
        "<h2>Queues</h2>",
        _filter_form(selection, kept, len(queues)),
        _queue_table(shown, now),
        _pager(selection, page, pages),
        "<h2>Latest decisions</h2>",
        _decisions(decisions, Story({r["id"]: r["uri"] for r in doc.get("requests", [])})),
        _problems(doc),
    ]
    policy_hash = str((doc.get("policy") or {}).get("hash", ""))
    return layout("Queues", policy_hash, body, refresh=True)


def _summary(doc: Mapping[str, Any], queues: Sequence[QueueView]) -> str:
    paused = sum(1 for q in queues if q.paused)
    holding = sum(1 for q in queues if q.holders)
    waiting = sum(q.waiting for q in queues)
    parts = [
        f"<span>{len(queues)} queue(s)</span>",
        f"<span>{paused} paused</span>",
        f"<span>{holding} holding a slot</span>",
        f"<span>{waiting} head(s) waiting</span>",
        f"<span>{len(doc.get('requests', []))} request row(s)</span>",
    ]
    return f'<p class="summary" id="summary">{"".join(parts)}</p>'


def _pauses(doc: Mapping[str, Any], now_ms: int) -> str:
    pauses = doc.get("pauses", [])
    if not pauses:
        return ""
    rows = []
    for p in pauses:
        who = f" by {text(p['by'])}" if p.get("by") else ""
        why = f": {text(p['reason'])}" if p.get("reason") else ""
        age = text(age_text(int(p.get("at_ms") or 0), now_ms))
        rows.append(f"<li><code>{text(p['pattern'])}</code> for {age}{who}{why}</li>")
    return f'<h2>Operator pauses</h2><ul id="pauses">{"".join(rows)}</ul>'


def _filter_form(selection: Selection, kept: int, total: int) -> str:
    counted = f"{kept} of {total} match" if selection.filter else f"{total} in all"
    return (
        '<form method="get" action="/" id="filter">'
        '<label>Queue name contains <input type="search" name="q" '
        f'value="{text(selection.filter)}"></label> <button type="submit">Filter</button> '
        f'<span class="muted">{text(counted)}; paused, holding and waiting queues first'
        "</span></form>"
    )


def _queue_table(shown: Sequence[QueueView], now_ms: int) -> str:
    if not shown:
        return '<p class="muted">No queue.</p>'
    headings = ["Queue", "State", "Last green", "Slot holders (since; lease expiry)"]
    headings += ["Backlog", "Oldest waiting head", "Parameters"]
    return _table("queues", headings, (_queue_row(q, now_ms) for q in shown))


def _queue_state(q: QueueView) -> str:
    if q.paused:
        how = f" ({text(q.paused_by)})" if q.paused_by else ""
        return f'<span class="paused">paused</span>{how}'
    if q.holders:
        return "building"
    if q.waiting:
        return '<span class="held">waiting</span>'
    return '<span class="muted">idle</span>'


def _last_green(q: QueueView, now_ms: int) -> str:
    if not q.last_green_uri:
        return '<span class="muted">none yet</span>'
    age = f" for {text(age_text(q.last_green_at_ms, now_ms))}" if q.last_green_at_ms else ""
    return commit_link(q.last_green_request_id, q.last_green_uri) + age


def _parameters_inline(parameters: Mapping[str, object]) -> str:
    """The overview's short form: the values that are set (not 0, false or empty), a
    list by its length; every parameter is on the queue page."""
    shown = []
    for k, v in sorted(parameters.items()):
        if isinstance(v, list | tuple):
            if v:
                shown.append(f"{text(k)}: {len(v)}")
        elif v not in (0, False, "", None):
            shown.append(f"{text(k)}={text(value_text(v))}")
    return ", ".join(shown)


def _search(q: QueueView, *, short: bool = False) -> str:
    """The queue's culprit search: its red head (linked) and where it stands; ``short``
    (the overview): the state, the culprit or why none, and the probes in flight."""
    search = q.search
    if search is None:
        return '<span class="muted">none</span>'
    red = str(search.get("red_request_id", ""))
    head = commit_link(red, str(search.get("red_uri") or red)) if red else "-"
    state, slots = str(search.get("state", "")), search.get("probe_slots")
    if not short:
        said = f"red head {head}: {text(search_sentence(search, slots))}"
    else:
        if state == "named":
            where = f"named {text(short_commit(str(search.get('culprit', ''))))}"
        else:
            where = text(state) + (f": {text(search['reason'])}" if search.get("reason") else "")
        of = f" of {text(slots)}" if slots is not None else ""
        said = (
            f"culprit search for red head {head}: {where}; "
            f"probes {text(search.get('in_flight', 0))}{of} in flight"
        )
    return f'<span class="search" data-state="{text(state)}">{said}</span>'


def _queue_row(q: QueueView, now_ms: int) -> str:
    state = _queue_state(q)
    if q.search is not None:
        state += f"<br>{_search(q, short=True)}"
    holders = "<br>".join(_holder(h, now_ms) for h in q.holders) or '<span class="muted">-</span>'
    if q.oldest_id:
        oldest = (
            f'<a href="{request_href(q.oldest_id)}"><code>{text(q.oldest_uri)}</code></a> '
            f"for {text(age_text(q.oldest_ingested_at_ms, now_ms))}"
        )
    else:
        oldest = '<span class="muted">-</span>'
    parameters = _parameters_inline(q.parameters)
    return (
        f'<tr class="queue" data-queue="{text(q.name)}" data-paused="{str(q.paused).lower()}">'
        f'<td><a href="{href(f"/queue/{q.name}")}">'
        f'<code class="queue-name">{text(q.name)}</code></a>'
        f'</td><td class="state">{state}</td><td class="last-green">{_last_green(q, now_ms)}</td>'
        f"<td>{holders}</td><td>{q.waiting}</td><td>{oldest}</td>"
        f'<td class="params">{parameters or "-"}</td></tr>'
    )


def _holder(h: Holder, now_ms: int) -> str:
    lease = ""
    if h.lease_expires_at_ms:
        left = (h.lease_expires_at_ms - now_ms) // 1000
        when = f"in {left}s" if left >= 0 else f"{-left}s ago"
        lease = f"; lease expires {text(clock_text(h.lease_expires_at_ms))} ({when})"
    return f"{request_link(h.request_id)} for {text(age_text(h.admitted_at_ms, now_ms))}{lease}"


def _pager(selection: Selection, page: int, pages: int) -> str:
    if pages <= 1:
        return ""
    links = []
    if page > 1:
        links.append(f'<a href="{href("/", q=selection.filter, page=page - 1)}">previous</a>')
    links.append(f"page {page} of {pages}")
    if page < pages:
        links.append(f'<a href="{href("/", q=selection.filter, page=page + 1)}">next</a>')
    return f'<p id="pager">{" ".join(links)}</p>'


NO_DECISION = '<p class="muted">No decision recorded yet.</p>'


def _decisions(records: Sequence[TrailRecord], story: Story) -> str:
    if not records:
        return NO_DECISION
    rows = (
        f'<tr><td class="mono when">{text(clock_text(r.at_ms))}</td>'
        f'<td><code class="queue-name">{text(r.queue)}</code></td>'
        f"<td>{request_link(r.request_id)}</td><td>{text(sentence(r, story))}</td></tr>"
        for r in records
    )
    return _table("decisions", ("Last at", "Queue", "Request", "Decision"), rows)


def _queue_decisions(records: Sequence[TrailRecord], commits: Mapping[str, str]) -> str:
    """One queue's decisions: each request by its commit and counter, lines in commit
    terms (the queue is the page's)."""
    if not records:
        return NO_DECISION
    story = Story(commits)
    rows = (
        f'<tr><td class="mono when">{text(clock_text(r.at_ms))}</td>'
        f'<td class="when">{commit_link(r.request_id, commits.get(r.request_id, r.request_id))}'
        f' <span class="muted">{text(request_counter(r.request_id))}</span></td>'
        f"<td>{text(sentence(r, story))}</td></tr>"
        for r in records
    )
    return _table("queue-decisions", ("Last at", "Commit", "Decision"), rows)


def _problems(doc: Mapping[str, Any]) -> str:
    out = []
    for named in doc.get("name_problems", []):
        out.append(
            f"<li>queue name <code>{text(named['escaped'])}</code> breaks the name rule: "
            f"{text(named['problem'])}</li>"
        )
    for d in doc.get("damaged", []):
        out.append(
            f"<li>{text(d['bucket'])} <code>{text(d['key'])}</code>: {text(d['error'])}</li>"
        )
    return f'<h2>Problems</h2><ul id="problems">{"".join(out)}</ul>' if out else ""


# --- a queue ----------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadView:
    """One waiting head of a queue, in the order its consumer delivers them."""

    position: int
    request_id: str
    uri: str
    state: str
    ingested_at_ms: int
    #: Its latest hold's reason and how many times it was held for it ("": not held yet,
    #: as a head behind a held front is not: its deliveries have not run).
    hold_reason: str = ""
    holds: int = 0


def render_queue(
    q: QueueView,
    heads: Sequence[HeadView],
    decisions: Sequence[TrailRecord],
    policy_hash: str,
    *,
    commits: Mapping[str, str],
    now_ms: int | None = None,
) -> str:
    """``/queue/<name>``: last green, waiting heads front first, holders, the effective
    parameters as a table, and the queue's recent decisions."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    facts = [
        ("state", _queue_state(q)),
        ("last green", _last_green(q, now)),
        ("waiting", f"{q.waiting} head(s)"),
        ("culprit search", _search(q)),
    ]
    body = [
        f'<h2>Queue <code class="queue-name" id="queue-name">{text(q.name)}</code></h2>',
        f'<table class="facts" id="queue-facts">{_facts(facts)}</table>',
        f"<h2>Waiting heads, front first ({q.waiting})</h2>",
        _heads(heads, q.waiting, now),
        "<h2>Slot holders</h2>",
        _holders_table(q, commits, now),
        "<h2>Probes in flight</h2>",
        _probes_table(q),
        "<h2>Effective parameters</h2>",
        _parameters_table(q.parameters),
        "<h2>Recent decisions</h2>",
        _queue_decisions(decisions, commits),
    ]
    return layout(f"Queue {q.name}", policy_hash, body, refresh=True)


def _heads(heads: Sequence[HeadView], waiting: int, now_ms: int) -> str:
    if not heads:
        return '<p class="muted">No head waits.</p>'
    rows = []
    for h in heads:
        if h.hold_reason:
            times = "once" if h.holds == 1 else f"{h.holds} times"
            reason = f"{text(h.hold_reason)} <span class=\"muted\">({times})</span>"
        elif h.position > 1:
            reason = '<span class="muted">behind the front (not delivered yet)</span>'
        else:
            reason = '<span class="muted">not held yet</span>'
        rows.append(
            f'<tr class="head" data-position="{h.position}">'
            f"<td>{h.position}</td><td>{commit_link(h.request_id, h.uri)}</td>"
            f"<td>{request_link(h.request_id)}</td><td>{text(h.state)}</td><td>{reason}</td>"
            f'<td class="when">{text(age_text(h.ingested_at_ms, now_ms))}</td></tr>'
        )
    more = len(heads) < waiting
    tail = f'<p class="muted">{waiting - len(heads)} more not shown.</p>' if more else ""
    headings = ("Position", "Commit", "Request", "State", "Hold reason", "Waiting for")
    return _table("heads", headings, rows) + tail


def _holders_table(q: QueueView, commits: Mapping[str, str], now_ms: int) -> str:
    if not q.holders:
        return '<p class="muted">No slot is held.</p>'
    rows = (
        f'<tr class="holder"><td>{commit_link(h.request_id, commits.get(h.request_id, ""))}</td>'
        f"<td>{_holder(h, now_ms)}</td></tr>"
        for h in q.holders
    )
    return _table("holders", ("Commit", "Request (since; lease expiry)"), rows)


def _probes_table(q: QueueView) -> str:
    """The probe builds of the queue's culprit search in flight (no build slot held)."""
    probes = (q.search or {}).get("probes") or []
    if not probes:
        return '<p class="muted">No probe builds.</p>'
    red = str((q.search or {}).get("red_request_id", ""))
    rows = (
        f'<tr class="probe"><td>{commit_link(str(p["request_id"]), str(p["commit"]))}</td>'
        f"<td>{request_link(str(p['request_id']))}</td><td>{request_link(red)}</td></tr>"
        for p in probes
    )
    return _table("probes", ("Commit", "Probe request", "For red head"), rows)


def _parameters_table(parameters: Mapping[str, object]) -> str:
    if not parameters:
        return '<p class="muted">Not recorded yet (no replica has served this queue).</p>'
    rows = _parameter_rows(sorted(parameters.items()))
    return f'<table class="facts" id="parameters">{rows}</table>'


# --- a request --------------------------------------------------------------------------


def render_request(request_id: str, history: Mapping[str, Any], policy_hash: str) -> str:
    """``/request/<id>``: the row (when kept) and the ``explain`` history, oldest first."""
    row = history.get("request")
    body = [f"<h2>Request <code>{text(request_id)}</code></h2>"]
    if row is None:
        body.append('<p class="muted">The row is gone (pruned); its decisions remain.</p>')
    else:
        fields = [
            ("queue", row["queue"]),
            ("uri", row["uri"]),
            ("state", row["state"]),
            ("build strategy", row.get("build_strategy") or "-"),
            ("base", row.get("base_uri") or "-"),
            ("superseded by", row.get("superseded_by") or "-"),
            ("ingested", _when(row.get("ingested_at_ms"))),
            ("admitted", _when(row.get("admitted_at_ms"))),
            ("ended", _when(row.get("ended_at_ms"))),
        ]
        cells = _facts((k, text(v)) for k, v in fields)
        body.append(f'<table id="request">{cells}</table>')
    entries = history.get("history", [])
    body.append("<h2>Decisions (explain)</h2>")
    if not entries:
        body.append('<p class="muted">No decision recorded.</p>')
    else:
        items = []
        for entry in entries:
            policy = f' <span class="muted">policy {text(entry["policy"])}</span>'
            seq = f' <span class="muted">delivery {text(entry["stream_seq"])}</span>'
            items.append(
                f'<li class="decision" data-kind="{text(entry["kind"])}">'
                f'<span class="mono">{text(clock_text(int(entry["first_at_ms"])))}</span> '
                f"{text(entry['sentence'])}"
                f"{policy if entry.get('policy') else ''}{seq if entry.get('stream_seq') else ''}"
                "</li>"
            )
        body.append(f'<ol id="history">{"".join(items)}</ol>')
    return layout(f"Request {request_id}", policy_hash, body, refresh=True)


def _when(at_ms: object) -> str:
    return clock_text(at_ms) if isinstance(at_ms, int) and at_ms else "-"


# --- the policy ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Diagram:
    """One machine's diagram: Graphviz's SVG when it could be drawn, else the Mermaid
    source as text (and why there is no SVG)."""

    machine: str
    svg: str
    mermaid: str
    note: str = ""


@dataclass(frozen=True)
class PolicyInForce:
    """What this replica runs: where its parts come from, when each was loaded, the
    config's text, and the last refused edit (``refused_now``: the edit is still on disk
    and not in force)."""

    machines_dir: str
    config_path: str
    config_text: str
    machines_loaded_at_ms: int
    config_loaded_at_ms: int
    refused_part: str = ""
    refused_error: str = ""
    refused_at_ms: int = 0
    refused_now: bool = False


def render_policy(
    policy_hash: str,
    loaded: str,
    diagrams: Sequence[Diagram],
    in_force: PolicyInForce | None = None,
) -> str:
    """``/policy``: the policy hash in force, when each part was loaded, the last refused
    edit with its located error, the config in force, and each machine's diagram.

    The SVG comes from Graphviz laying out our own DOT text (its labels escaped by
    Graphviz as XML); it holds no script and, under the page's policy, could run none.
    """
    body = [
        f'<h2>Policy <code id="policy-hash">{text(policy_hash or "unknown")}</code></h2>',
        f'<p class="muted">{text(loaded)}</p>' if loaded else "",
        _in_force(in_force) if in_force is not None else "",
    ]
    for d in diagrams:
        body.append(f'<h2 id="machine-{text(d.machine)}">{text(d.machine)}</h2>')
        if d.svg:
            body.append(f'<div class="diagram">{d.svg}</div>')
        else:
            if d.note:
                body.append(f'<p class="muted">{text(d.note)}</p>')
            body.append(f'<pre class="mermaid-source">{text(d.mermaid)}</pre>')
    return layout("Policy", policy_hash, body, refresh=False)


def _in_force(p: PolicyInForce) -> str:
    facts = [
        ("machines", p.machines_dir, p.machines_loaded_at_ms),
        ("config", p.config_path, p.config_loaded_at_ms),
    ]
    cells = "".join(
        f"<tr><th>{text(part)}</th><td><code>{text(where)}</code> loaded "
        f'<span class="when">{text(_when(at))}</span></td></tr>'
        for part, where, at in facts
    )
    out = [f'<table class="facts" id="policy-loads">{cells}</table>']
    if p.refused_part:
        state = (
            "still on disk, not in force: the policy above keeps running"
            if p.refused_now
            else "replaced since by a good edit"
        )
        out.append(
            f'<div class="refused" id="refused" data-now="{str(p.refused_now).lower()}">'
            f"<p>Last refused edit ({text(p.refused_part)}) at {text(_when(p.refused_at_ms))}, "
            f"{text(state)}:</p><pre>{text(p.refused_error)}</pre></div>"
        )
    else:
        out.append('<p class="muted" id="refused">No edit refused since start.</p>')
    out.append(f'<h2>Config in force</h2><pre id="config">{text(p.config_text)}</pre>')
    return "".join(out)


# --- the policy card ------------------------------------------------------------------------


class CardSection(Protocol):
    """One section of the policy card (``apps.policy_card.Section``)."""

    @property
    def title(self) -> str: ...
    @property
    def where(self) -> str: ...
    @property
    def parameters(self) -> tuple[tuple[str, Any], ...]: ...
    @property
    def fires(self) -> tuple[tuple[str, str, str], ...]: ...
    @property
    def never(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def culprit(self) -> str: ...


def render_card(policy_hash: str, sections: Sequence[CardSection]) -> str:
    """``/card``: per queue pattern of the config in force, the effective parameters and
    the gate transitions that can fire under them (what ``stovepipe-fsm card`` prints)."""
    body = [
        "<h2>Policy card</h2>",
        '<p class="muted">Per queue pattern of the config in force: the effective '
        "parameters, and the gate's transitions that can fire under them.</p>",
    ]
    for s in sections:
        params = _parameter_rows(s.parameters)
        fires = "".join(
            f"<tr><td>{_ticks(label)}</td><td>{_ticks(when)}</td><td>{text(then)}</td></tr>"
            for label, when, then in s.fires
        )
        never = "".join(f"<li>{_ticks(label)}: {_ticks(why)}</li>" for label, why in s.never)
        body += [
            f'<h2 class="card-section"><code class="queue-name">{_ticks(s.title)}</code> '
            f'<span class="muted">({text(s.where)})</span></h2>',
            f'<table class="facts">{params}</table>',
            f"<p>{_ticks(s.culprit)}</p>" if s.culprit else "",
            "<table><thead><tr><th>Transition</th><th>When</th><th>Then</th></tr></thead>"
            f"<tbody>{fires}</tbody></table>",
            f"<p>Cannot fire under these parameters:</p><ul>{never}</ul>" if never else "",
        ]
    return layout("Policy card", policy_hash, body, refresh=False)


def _ticks(markdown: str) -> str:
    """Card text whose backticks mark names: escaped, without the backticks."""
    return text(markdown.replace("`", ""))


# --- the frame ------------------------------------------------------------------------------


def layout(title: str, policy_hash: str, body: Iterable[str], *, refresh: bool) -> str:
    """The page around ``body`` (already HTML): title, navigation, the policy hash."""
    meta = f'<meta http-equiv="refresh" content="{REFRESH_S}">' if refresh else ""
    shown = text(policy_hash) if policy_hash else "not recorded yet"
    refreshes = f" Refreshes every {REFRESH_S} s." if refresh else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{meta}<title>{text(title)} - stovepipe-fsm</title>"
        f"<style>{STYLE}</style></head><body>"
        f"<header><h1>stovepipe-fsm status</h1>"
        '<nav><a href="/">Queues</a><a href="/policy">Policy</a><a href="/card">Card</a></nav>'
        f'<span class="muted">policy <code class="policy-hash">{shown}</code></span>'
        "</header>"
        f"{''.join(body)}"
        f'<p class="muted">Read-only.{refreshes}</p></body></html>\n'
    )


def render_not_found(what: str, policy_hash: str) -> str:
    body = [f"<h2>Not found</h2><p>{text(what)}</p>"]
    return layout("Not found", policy_hash, body, refresh=False)

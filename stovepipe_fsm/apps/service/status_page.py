"""What the status page reads: the ``status`` and ``explain`` documents, the latest trail
records and the diagrams of the machines this replica runs (the HTML is
:mod:`stovepipe_fsm.views.page`).

Everything is read from the broker on the service's own connection, as the commands
read it, so the page and ``status`` never disagree. The overview's reads are shared by
loads less than :data:`OVERVIEW_TTL_S` apart (several browsers refreshing cost one read)
and the diagrams are drawn once per policy hash: Graphviz runs in a worker thread, and
where it is missing the page shows the Mermaid source instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from ...adapters.jetstream.bulk import kv_snapshot
from ...adapters.jetstream.decision_trail import JetStreamTrail
from ...adapters.jetstream.policy_record import (
    QUEUE_KEY_PREFIX,
    queue_parameters,
    read_policy_record,
)
from ...config.policy import QueuePolicy
from ...domain.errors import NotFound
from ...domain.trail_record import HELD, TrailRecord
from ...machine.diagrams import header_line, mermaid_diagram, render_dot
from ...views import page
from ..diagram_files import DiagramError, find_dot, render_svg
from ..policy_card import card_sections
from .bounded_http import Answer
from .operators import delivery_order, request_history, status_document, status_rows
from .pauses import Pause
from .supervisor import Service

log = logging.getLogger("stovepipe_fsm.service")

#: Overview loads closer together than this share one read of the broker.
OVERVIEW_TTL_S = 1.0
HTML = "text/html; charset=utf-8"
#: The queue page's recent decisions are those about this many of its newest requests.
RECENT_REQUESTS = 10


def _page(status: str, body: str) -> Answer:
    return Answer(status, body, HTML)


@dataclass(frozen=True)
class _Overview:
    doc: dict[str, Any]
    queues: list[page.QueueView]
    decisions: list[TrailRecord]
    read_at: float


@dataclass
class StatusPage:
    """The pages of one service: ``/``, ``/request/<id>`` and ``/policy``."""

    service: Service
    _overview: _Overview | None = None
    _reading: asyncio.Lock = field(default_factory=asyncio.Lock)
    _diagrams: tuple[str, list[page.Diagram]] | None = None

    @staticmethod
    def serves(path: str) -> bool:
        route = urllib.parse.urlsplit(path).path
        return route in ("/", "/policy", "/card") or route.startswith(("/request/", "/queue/"))

    async def reply(self, path: str) -> Answer:
        parts = urllib.parse.urlsplit(path)
        route = parts.path
        if route == "/":
            selection = page.Selection.from_query(urllib.parse.parse_qs(parts.query))
            overview = await self.overview()
            return _page(
                "200 OK",
                page.render_overview(overview.doc, overview.queues, overview.decisions, selection),
            )
        if route == "/policy":
            return _page("200 OK", await self.policy())
        if route == "/card":
            return _page("200 OK", self.card())
        if route.startswith("/queue/"):
            return await self.queue(urllib.parse.unquote(route.removeprefix("/queue/")))
        request_id = urllib.parse.unquote(route.removeprefix("/request/"))
        return await self.request(request_id)

    async def overview(self) -> _Overview:
        """The ``status`` document with leases and pauses resolved, and the latest
        decisions; read again once :data:`OVERVIEW_TTL_S` has passed."""
        async with self._reading:
            cached = self._overview
            if cached is not None and time.monotonic() - cached.read_at < OVERVIEW_TTL_S:
                return cached
            js, topology = self.service.js, self.service.topology
            # One pass per bucket (kv_snapshot), not a round trip per row.
            rows = await status_rows(js, topology)
            recorded = await kv_snapshot(js, topology.service_bucket, f"{QUEUE_KEY_PREFIX}>")
            doc = await status_document(js, topology, rows, queue_parameters(recorded))
            leases = {q.name: dict(q.leases) for q in rows.queues if q.leases}
            pauses = [Pause(**p) for p in doc.get("pauses", [])]
            paused_by: dict[str, str] = {}
            for q in rows.queues:
                match = next((p.pattern for p in pauses if p.matches(q.name)), "")
                if match:
                    paused_by[q.name] = match
            decisions = await JetStreamTrail(js, topology).latest(page.LATEST_DECISIONS)
            self._overview = _Overview(
                doc, page.queue_views(doc, leases, paused_by), decisions, time.monotonic()
            )
            return self._overview

    async def queue(self, name: str) -> Answer:
        """``/queue/<name>``: the overview's row of the queue, its waiting heads in
        delivery order with why each waits, and the decisions about its newest requests."""
        service = self.service
        overview = await self.overview()
        view = next((q for q in overview.queues if q.name == name), None)
        if view is None:
            body = page.render_not_found(f"no queue {name!r}", service.policy_hash)
            return _page("404 Not Found", body)
        doc = overview.doc
        initial = str((doc.get("policy") or {}).get("request_initial", ""))
        mine = [r for r in doc["requests"] if r["queue"] == name]
        mine.sort(key=lambda r: delivery_order(str(r["id"])))
        waiting = [r for r in mine if initial and r["state"] == initial]
        trail = JetStreamTrail(service.js, service.topology)
        histories: dict[str, list[TrailRecord]] = {}
        for row in [*waiting[: page.PAGE_SIZE], *mine[-RECENT_REQUESTS:]]:
            if row["id"] not in histories:
                histories[row["id"]] = await trail.history(row["id"])
        heads = []
        for place, row in enumerate(waiting[: page.PAGE_SIZE], start=1):
            holds = [r for r in histories[row["id"]] if r.kind == HELD]
            latest = max(holds, key=lambda r: r.at_ms) if holds else None
            heads.append(
                page.HeadView(
                    place,
                    row["id"],
                    row["uri"],
                    row["state"],
                    int(row.get("ingested_at_ms") or 0),
                    latest.details.get("reason", "") if latest else "",
                    latest.count if latest else 0,
                )
            )
        records = [r for rows in histories.values() for r in rows]
        decisions = sorted(records, key=lambda r: r.at_ms, reverse=True)[: page.LATEST_DECISIONS]
        commits = {row["id"]: row["uri"] for row in mine}
        body = page.render_queue(view, heads, decisions, service.policy_hash, commits=commits)
        return _page("200 OK", body)

    def card(self) -> str:
        """The policy card of the machines and config this replica runs."""
        service = self.service
        machines = service.machines
        policy = getattr(service.config, "policy", None)  # the queue config as loaded
        sections = (
            card_sections(
                machines.queue_gate.spec,
                machines.queue_gate.registry,
                policy,
                machines.parameter_defaults,
            )
            if isinstance(policy, QueuePolicy)
            else []
        )
        return page.render_card(service.policy_hash, sections)

    async def request(self, request_id: str) -> Answer:
        service = self.service
        try:
            history = await request_history(service.js, service.topology, request_id)
        except NotFound as exc:
            return _page("404 Not Found", page.render_not_found(str(exc), service.policy_hash))
        return _page("200 OK", page.render_request(request_id, history, service.policy_hash))

    async def policy(self) -> str:
        """The hash this replica runs (and the broker's record of the latest load, which
        names another replica after a reload there) with this replica's diagrams."""
        service = self.service
        record = await read_policy_record(service.js, service.topology)
        loaded = ""
        if record is not None:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.loaded_at_ms / 1000))
            loaded = f"latest load recorded: {record.hash} at {when} by {record.replica}"
        reloader = service.reloader
        in_force = None
        if reloader is not None:
            refusal = reloader.refusal
            in_force = page.PolicyInForce(
                machines_dir=str(reloader.machines_dir),
                config_path=str(reloader.config.path),
                config_text=reloader.config_text,
                machines_loaded_at_ms=reloader.machines_loaded_ms,
                config_loaded_at_ms=reloader.config_loaded_ms,
                refused_part=refusal.part if refusal else "",
                refused_error=refusal.error if refusal else "",
                refused_at_ms=refusal.at_ms if refusal else 0,
                refused_now=reloader.refused_now,
            )
        return page.render_policy(service.policy_hash, loaded, await self.diagrams(), in_force)

    async def diagrams(self) -> list[page.Diagram]:
        machines, key = self.service.machines, self.service.policy_hash
        if self._diagrams is not None and self._diagrams[0] == key and key:
            return self._diagrams[1]
        specs = [machines.request.spec, machines.queue_gate.spec]
        if machines.culprit is not None:
            specs.append(machines.culprit.spec)
        drawn = []
        for spec in specs:
            mermaid = mermaid_diagram(spec)
            try:
                svg = await asyncio.to_thread(
                    render_svg, render_dot(spec), find_dot(), header_line(spec)
                )
                drawn.append(page.Diagram(spec.name, _svg_element(svg), mermaid))
            except DiagramError as exc:
                drawn.append(page.Diagram(spec.name, "", mermaid, f"no SVG: {exc}"))
        self._diagrams = (key, drawn)
        return drawn


def _svg_element(svg: str) -> str:
    """Graphviz's document from its ``<svg`` element on (no XML prolog or doctype, which
    have no place inside HTML)."""
    at = svg.find("<svg")
    return svg[at:] if at >= 0 else ""

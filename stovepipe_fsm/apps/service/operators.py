"""Operator commands against a running pipeline's JetStream: ingest, complete, status.

None of them runs the policy, so none loads it from the working directory: ``ingest``
takes the request machine's initial state from the policy the running service recorded
(:mod:`...adapters.jetstream.policy_record`), ``complete`` publishes an outcome message
that the service records with its policy, and ``status`` only reads rows. A machine file
mid-edit, or a config key only a newer machine declares, cannot make them fail. The
``requests`` and ``queues`` of ``status --json`` have the entries of ``simulate --json``,
so a run and a simulation can be compared field by field; ``slot_holders`` is its own
(``docs/service.md`` shows the whole document).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from nats.js import JetStreamContext

from ...adapters.jetstream import Topology, ensure_topology, open_kv_stores
from ...adapters.jetstream.bulk import kv_snapshot
from ...adapters.jetstream.codec import decode_queue, decode_request, decode_search
from ...adapters.jetstream.decision_trail import JetStreamTrail
from ...adapters.jetstream.outcomes import OutcomeMessage, publish_outcome
from ...adapters.jetstream.policy_record import (
    PolicyRecord,
    read_policy_record,
    read_queue_parameters,
)
from ...adapters.jetstream.publisher import JetStreamPublisher
from ...adapters.jetstream.refused_outcomes import read_tallies
from ...adapters.jetstream.stores import KvStores
from ...adapters.memory import SystemClock
from ...domain.bounded_text import clip
from ...domain.culprit_search import CulpritSearch
from ...domain.entities import Queue, Request
from ...domain.errors import NonRetryable, NotFound, StovepipeError
from ...domain.ids import parse_request_id
from ...domain.parameter_text import parameters_text, short_commit
from ...domain.queue_names import InvalidQueueName, normalize_queue_name, validate_queue_name
from ...domain.trail_record import HELD
from ...pipeline import policy_in_force
from ...pipeline.ingest import Ingest
from ...pipeline.queue_verbs import with_queue_verbs
from ...ports.stores import RequestStore, UriIndex
from ...process.culprit import PROBE_SLOTS
from ...views.entities import (
    age_text,
    queue_json,
    render_queue_row,
    render_request_rows,
    request_json,
    search_json,
)
from ...views.explain import Position, Story, history_json, named_requests, search_sentence
from .connect import NatsOptions, connected
from .pauses import read_pauses

#: How often ``complete --wait`` looks at the request and queue rows.
WAIT_POLL_S = 0.2


class NotRecorded(StovepipeError):
    """``complete --wait``: the outcome is stored, but no service recorded it in time."""


async def initial_state(js: JetStreamContext, topology: Topology, machines_dir: str) -> str:
    """The request machine's initial state in force (:mod:`...pipeline.policy_in_force`)."""
    record = await read_policy_record(js, topology)
    return policy_in_force.initial_state(record.request_initial if record else "", machines_dir)


@contextlib.asynccontextmanager
async def opened_stores(
    options: NatsOptions, topology: Topology
) -> AsyncIterator[tuple[JetStreamContext, KvStores]]:
    """The broker's stores, for one command (the topology is created if missing)."""
    async with connected(options) as nc:
        js = nc.jetstream()
        await ensure_topology(js, topology)
        yield js, await open_kv_stores(js, topology)


@contextlib.asynccontextmanager
async def operator_ingest(
    options: NatsOptions, topology: Topology, machines_dir: str
) -> AsyncIterator[Ingest]:
    """Ingest on the broker's stores (the topology is created if missing)."""
    async with connected(options) as nc:
        yield await ingest_on(nc.jetstream(), topology, machines_dir)


async def ingest_on(js: JetStreamContext, topology: Topology, machines_dir: str) -> Ingest:
    """Ingest on the stores of ``js`` (the topology is created if missing)."""
    await ensure_topology(js, topology)
    stores = await open_kv_stores(js, topology)
    return ingest_with(js, topology, stores, await initial_state(js, topology, machines_dir))


def ingest_with(
    js: JetStreamContext,
    topology: Topology,
    stores: KvStores,
    initial: str,
    trail: JetStreamTrail | None = None,
) -> Ingest:
    """Ingest on ``stores``, heads created in the request machine's ``initial`` state."""
    return Ingest(
        initial_state=initial,
        requests=stores.requests,
        queues=stores.queues,
        publisher=JetStreamPublisher(js, topology),
        uri_index=stores.uris,
        counter=stores.counters,
        clock=SystemClock(),
        trail=trail or JetStreamTrail(js, topology),
    )


async def request_for_uri(uri_index: UriIndex, queue: str, uri: str) -> str:
    request_id = await uri_index.get(queue, uri)
    if request_id is None:
        raise NotFound(f"no request for {uri!r} on queue {queue!r}")
    return request_id


async def building_request_for_uri(stores: KvStores, queue: str, uri: str) -> str:
    """The request whose build of ``uri`` a reported outcome ends.

    The dedup index names the newest request for ``uri``; when trunk returned to ``uri``
    while an older request for it still builds, that older one (a slot holder of the
    queue) is the build being reported, and wins over the newer one still waiting.
    """
    request_id = await request_for_uri(stores.uris, queue, uri)
    try:
        holders = (await stores.queues.get(queue)).slot_holders
    except NotFound:
        return request_id
    if request_id in holders:
        return request_id
    for holder in holders:
        try:
            request = await stores.requests.get(holder)
        except NotFound:
            continue
        if request.uri == uri:
            return holder
    return request_id


def check_outcome_name(record: PolicyRecord | None, outcome: str) -> None:
    """``ValueError`` for an outcome the policy in force does not declare.

    Without a recorded policy the name is not checked here: the service dead-letters an
    undeclared outcome with the reason, and applies nothing.
    """
    if record is not None and record.outcomes and outcome not in record.outcomes:
        raise ValueError(
            f"outcome {outcome!r} is not one of {', '.join(sorted(record.outcomes))} "
            f"(the policy in force, {record.hash or 'unhashed'})"
        )


async def complete(
    options: NatsOptions,
    topology: Topology,
    queue: str,
    uri: str,
    outcome: str,
    wait_s: float,
    *,
    request_id: str = "",
) -> dict[str, Any]:
    """Publish ``outcome`` for the build of ``request_id`` (the id its build message
    named), or without one for the head ``uri`` of ``queue``; with ``wait_s`` > 0, wait
    that long for the service to record it and add the request's row to the answer."""
    queue = normalize_queue_name(queue)
    if request_id and parse_request_id(request_id).queue != queue:
        raise ValueError(f"request {request_id!r} is not of queue {queue!r}")
    async with opened_stores(options, topology) as (js, stores):
        if request_id:
            await stores.requests.get(request_id)  # NotFound: no such request
        else:
            request_id = await building_request_for_uri(stores, queue, uri)
        record = await read_policy_record(js, topology)
        check_outcome_name(record, outcome)
        if wait_s > 0 and (record is None or outcome not in record.outcomes):
            raise ValueError("--wait needs the policy in force, which no service has recorded")
        duplicate = await publish_outcome(js, topology, OutcomeMessage(queue, request_id, outcome))
        answer: dict[str, Any] = {
            "request_id": request_id,
            "outcome": outcome,
            "published": True,
            "duplicate": duplicate,
        }
        if wait_s > 0:
            assert record is not None
            request = await _wait_for_outcome(stores, request_id, outcome, record, wait_s)
            answer["request"] = request_json(request)
            if request.state in record.preempted:
                answer["moot"] = f"the build was {request.state} by {request.superseded_by}"
        return answer


async def _wait_for_outcome(
    stores: KvStores, request_id: str, outcome: str, record: PolicyRecord, wait_s: float
) -> Request:
    """The request once its record is whole: the request row ended with ``outcome`` and
    the queue row no longer lists it as a slot holder (recording writes the request row
    first, then frees the slot and applies the end in one queue write). A request a newer
    head preempted is returned as it is: the outcome is moot, nothing is applied."""
    mine = set(record.outcomes[outcome])
    others = {state for name, states in record.outcomes.items() for state in states} - mine
    deadline = time.monotonic() + wait_s
    while True:
        request = await stores.requests.get(request_id)
        if request.state in record.preempted:
            return request
        if request.state in others:
            raise NonRetryable(
                f"request {request_id!r} ended {request.state}; the outcome {outcome} was "
                "refused (dlq list shows why)"
            )
        if request.state in mine:
            queue = await stores.queues.get(request.queue)
            if request_id not in queue.slot_holders:
                return request
        if time.monotonic() >= deadline and request.state == record.request_initial:
            raise NotRecorded(
                f"outcome {outcome} of {request_id!r} is stored and kept: the head is not "
                f"admitted yet (request is {request.state}); it is recorded on admission"
            )
        if time.monotonic() >= deadline:
            raise NotRecorded(
                f"outcome {outcome} of {request_id!r} is stored but was not recorded within "
                f"{wait_s:g}s (request is {request.state}); is a service running?"
            )
        await asyncio.sleep(WAIT_POLL_S)


Row = TypeVar("Row")


async def decoded_rows(
    js: JetStreamContext, bucket: str, decode: Callable[[bytes], Row], damaged: list[dict[str, str]]
) -> list[Row]:
    """Every value of ``bucket`` that ``decode`` reads; the others go to ``damaged`` with
    why, so one bad row is shown for what it is instead of hiding every good one."""
    rows = []
    for key, value in await kv_snapshot(js, bucket):
        try:
            rows.append(decode(value))
        except NonRetryable as exc:
            damaged.append({"bucket": bucket, "key": key, "error": clip(str(exc), 300)})
    return rows


@dataclass(frozen=True)
class StatusRows:
    """Every decodable request, queue and culprit search row, and the rows that are not
    (with why)."""

    requests: list[Request]
    queues: list[Queue]
    damaged: list[dict[str, str]]
    searches: tuple[CulpritSearch, ...] = ()


async def status_rows(js: JetStreamContext, topology: Topology) -> StatusRows:
    """The rows ``status`` shows, each bucket read in one pass (:func:`kv_snapshot`), once
    (the status page also needs the queue rows' leases, which the document leaves out)."""
    damaged: list[dict[str, str]] = []
    return StatusRows(
        await decoded_rows(js, topology.requests_bucket, decode_request, damaged),
        await decoded_rows(js, topology.queues_bucket, decode_queue, damaged),
        damaged,
        tuple(await decoded_rows(js, topology.searches_bucket, decode_search, damaged)),
    )


async def status_document(
    js: JetStreamContext,
    topology: Topology,
    rows: StatusRows | None = None,
    parameters: dict[str, dict[str, object]] | None = None,
) -> dict[str, Any]:
    """Every request and queue row, ordered like ``simulate --json``, and the policy hash
    the service last wrote (``policy``, absent until a service ran with this topology).
    Rows that cannot be decoded are listed under ``damaged`` (absent when there are none);
    each queue's culprit search under ``searches`` (absent when no queue has one).
    ``rows`` and ``parameters``: what :func:`status_rows` and
    :func:`read_queue_parameters` read already (else they are read here).
    """
    if rows is None:
        rows = await status_rows(js, topology)
    requests, queues, damaged = rows.requests, rows.queues, list(rows.damaged)

    def order(request_id: str) -> tuple[str, int]:
        try:
            parsed = parse_request_id(request_id)
        except ValueError:
            return (request_id, 0)
        return (parsed.queue, parsed.counter)

    policy = await read_policy_record(js, topology)
    pauses = await read_pauses(js, topology)
    refused = {
        t.queue: {"count": t.count, "last_at_ms": t.last_at_ms}
        for t in await read_tallies(js, topology)
    }
    if parameters is None:
        parameters = await read_queue_parameters(js, topology)
    searches = _searches(rows.searches, requests, parameters)
    return {
        "requests": [request_json(r) for r in sorted(requests, key=lambda r: order(r.id))],
        "queues": [queue_json(q) for q in sorted(queues, key=lambda q: q.name)],
        # Who holds each queue's slots: the first thing to look at when a queue waits.
        "slot_holders": {q.name: list(q.slot_holders) for q in queues},
        # Per queue: effective parameters, holders since when, the waiting backlog.
        "queue_details": _queue_details(
            queues, requests, parameters, policy.request_initial if policy is not None else ""
        ),
        # Per queue: its culprit search, for which red head, and its probes in flight.
        **({"searches": searches} if searches else {}),
        # The policy the service runs (once a service has written it).
        **({"policy": policy.shown()} if policy is not None else {}),
        # Operator pauses in force (pause/resume), by pattern.
        **({"pauses": [asdict(p) for p in pauses]} if pauses else {}),
        # Build outcomes refused per queue, within their retention (dlq list: why).
        **({"refused_outcomes": refused} if refused else {}),
        **({"damaged": damaged} if damaged else {}),
        **({"name_problems": problems} if (problems := _name_problems(queues)) else {}),
    }


def _queue_details(
    queues: list[Queue],
    requests: list[Request],
    parameters: dict[str, dict[str, object]],
    initial: str,
) -> dict[str, dict[str, Any]]:
    """What an operator asks of a waiting queue: under which parameters, held by whom
    since when, and how much waits behind it since when (``initial``: the request
    machine's waiting state, from the policy record; no backlog without it)."""
    by_id = {r.id: r for r in requests}
    # Grouped once: a scan of every request per queue is quadratic at 1,000 queues.
    waiting_on: dict[str, list[Request]] = {}
    for r in requests:
        if initial and r.state == initial:
            waiting_on.setdefault(r.queue, []).append(r)
    details: dict[str, dict[str, Any]] = {}
    for queue in sorted(queues, key=lambda q: q.name):
        waiting = sorted(
            waiting_on.get(queue.name, []), key=lambda r: (r.ingested_at_ms or 0, r.id)
        )
        oldest = waiting[0] if waiting else None
        green = by_id.get(queue.last_green_request_id)
        details[queue.name] = {
            "parameters": parameters.get(queue.name, {}),
            "holders": [
                {
                    "id": holder,
                    "admitted_at_ms": by_id[holder].admitted_at_ms if holder in by_id else 0,
                }
                for holder in queue.slot_holders
            ],
            "waiting": len(waiting),
            "oldest_waiting": (
                {"id": oldest.id, "uri": oldest.uri, "ingested_at_ms": oldest.ingested_at_ms}
                if oldest is not None
                else None
            ),
            # The green the queue builds on, and since when (the end of its build).
            "last_green": (
                {
                    "uri": queue.last_green_uri,
                    "request_id": queue.last_green_request_id,
                    "at_ms": green.ended_at_ms if green is not None else 0,
                }
                if queue.last_green_uri
                else None
            ),
        }
    return details


def _searches(
    searches: tuple[CulpritSearch, ...],
    requests: list[Request],
    parameters: dict[str, dict[str, object]],
) -> dict[str, dict[str, Any]]:
    """Each queue's search row, with its red head's commit and the queue's probe_slots."""
    uris = {r.id: r.uri for r in requests}
    return {
        s.queue: search_json(
            s, uris.get(s.red_request_id, ""), parameters.get(s.queue, {}).get(PROBE_SLOTS)
        )
        for s in sorted(searches, key=lambda s: s.queue)
    }


def search_line(search: dict[str, Any]) -> str:
    """A queue's search as ``status`` prints it: its red head, then where it stands."""
    red = search["red_request_id"] or "-"
    if search["red_uri"]:
        red += f" ({short_commit(search['red_uri'])})"
    return f"red head {red}: {search_sentence(search, search['probe_slots'])}"


def _name_problems(queues: list[Queue]) -> list[dict[str, str]]:
    """Stored queues whose names a new queue could not have (created before the name
    rule): shown escaped, since such a name may print like another."""
    out = []
    for queue in sorted(queues, key=lambda q: q.name):
        try:
            validate_queue_name(queue.name)
        except InvalidQueueName as exc:
            out.append({"queue": queue.name, "escaped": ascii(queue.name), "problem": str(exc)})
    return out


def recent_requests(doc: dict[str, Any], recent: int | None) -> list[dict[str, Any]]:
    """Each queue's ``recent`` newest requests of a status document (all for ``None``),
    in the document's order (queue, then counter)."""
    by_queue: dict[str, list[dict[str, Any]]] = {}
    for row in doc["requests"]:
        by_queue.setdefault(row["queue"], []).append(row)
    shown: list[dict[str, Any]] = []
    for q in doc["queues"]:
        rows = by_queue.get(q["name"], [])
        shown += rows if recent is None else rows[-recent:]
    return shown


def trimmed_status(doc: dict[str, Any], recent: int | None) -> dict[str, Any]:
    """The document ``status --json`` prints: each queue's ``recent`` newest requests
    (every request for ``None``, as ``--all`` asks), with ``requests_not_shown`` counting
    the others when there are any."""
    if recent is None:
        return doc
    shown = recent_requests(doc, recent)
    hidden = len(doc["requests"]) - len(shown)
    return {**doc, "requests": shown, **({"requests_not_shown": hidden} if hidden else {})}


def render_status(doc: dict[str, Any], *, recent: int | None = 10) -> str:
    """Queues with their slot holders, then each queue's ``recent`` newest requests."""
    holders = doc.get("slot_holders", {})
    lines = []
    if "policy" in doc:
        lines += policy_lines(doc["policy"])
    now_ms = int(time.time() * 1000)
    for paused in doc.get("pauses", []):
        who = f" by {paused['by']}" if paused["by"] else ""
        why = f": {paused['reason']}" if paused["reason"] else ""
        age = age_text(paused["at_ms"], now_ms)
        lines.append(f"paused: {paused['pattern']} for {age}{who}{why}")
    lines.append("queues:")
    details = doc.get("queue_details", {})
    for q in doc["queues"]:
        lines.append(render_queue_row(q, holders.get(q["name"], [])))
        detail = details.get(q["name"])
        if detail is None:
            continue
        since = [
            f"{h['id']} for {age_text(h['admitted_at_ms'], now_ms)}" for h in detail["holders"]
        ]
        if since:
            lines.append(f"    holding: {', '.join(since)}")
        oldest = detail["oldest_waiting"]
        if oldest is not None:
            age = age_text(oldest["ingested_at_ms"], now_ms)
            lines.append(f"    waiting: {detail['waiting']}, oldest {oldest['uri']} for {age}")
        green = detail.get("last_green")
        if green is not None and green["at_ms"]:
            age = age_text(green["at_ms"], now_ms)
            lines.append(f"    last green: {short_commit(green['uri'])} for {age}")
        if detail["parameters"]:
            values = parameters_text(detail["parameters"].items())
            lines.append(f"    parameters: {values}")
        search = doc.get("searches", {}).get(q["name"])
        if search is not None:
            lines.append(f"    {search_line(search)}")
        refused = doc.get("refused_outcomes", {}).get(q["name"])
        if refused is not None:
            age = age_text(refused["last_at_ms"], now_ms)
            lines.append(
                f"    refused outcomes: {refused['count']}, last {age} ago (dlq list: why)"
            )
    shown = recent_requests(doc, recent)
    hidden = len(doc["requests"]) - len(shown) + doc.get("requests_not_shown", 0)
    lines.append(f"requests ({hidden} older not shown; --all):" if hidden else "requests:")
    lines += render_request_rows(shown)
    for named in doc.get("name_problems", []):
        lines.append(f"queue name {named['escaped']} breaks the name rule: {named['problem']}")
    damaged = doc.get("damaged", [])
    if damaged:
        lines.append(f"damaged rows ({len(damaged)}, not decodable):")
        lines += [f"  {d['bucket']} {d['key']}: {d['error']}" for d in damaged]
    return "\n".join(lines)


def utc_text(at_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at_ms / 1000))


def policy_lines(policy: dict[str, Any]) -> list[str]:
    """The policy in force as ``status`` prints it: the hash (``unhashed`` for a service
    run on machines alone), who loaded it when, when each part was loaded, and the last
    refused edit with its located error."""
    shown = policy["hash"] or "unhashed"
    lines = [f"policy: {shown} (loaded {utc_text(policy['loaded_at_ms'])} by {policy['replica']})"]
    machines_at, config_at = policy.get("machines_loaded_at_ms"), policy.get("config_loaded_at_ms")
    if machines_at and config_at:
        lines.append(
            f"    machines loaded {utc_text(machines_at)}, config loaded {utc_text(config_at)}"
        )
    refused = policy.get("refused") or {}
    if refused:
        state = "not in force" if refused.get("now") else "replaced since by a good edit"
        lines.append(
            f"    last refused edit ({refused['part']}) at {utc_text(int(refused['at_ms']))}, "
            f"{state}:"
        )
        lines += [f"      {line}" for line in str(refused["error"]).splitlines()]
    return lines


async def explain_document(
    options: NatsOptions, topology: Topology, request_id: str, queue: str, uri: str
) -> dict[str, Any]:
    """The request (by id, or by queue and uri) and its decision trail.

    The operator verbs about queues (pause, resume, dlq prune) whose pattern matches the
    request's queue are part of its history while it was open (from its ingest to its
    end): a pause is why a head was held. ``NotFound`` (exit 2) when neither a row nor a
    trail record names it.
    """
    async with opened_stores(options, topology) as (js, stores):
        if not request_id:
            request_id = await request_for_uri(stores.uris, normalize_queue_name(queue), uri)
        return await request_history(js, topology, request_id, stores.requests)


async def request_history(
    js: JetStreamContext, topology: Topology, request_id: str, requests: RequestStore | None = None
) -> dict[str, Any]:
    """The request's row (None once pruned) and its decision trail, as ``explain --json``
    prints it; ``NotFound`` when ``request_id`` is no request id, or neither a row nor a
    trail record names it."""
    try:
        parse_request_id(request_id)
    except ValueError as exc:
        raise NotFound(f"{request_id!r} is not a request id: {exc}") from None
    if requests is None:
        requests = (await open_kv_stores(js, topology)).requests
    try:
        row: dict[str, Any] | None = request_json(await requests.get(request_id))
    except NotFound:
        row = None
    trail = JetStreamTrail(js, topology)
    records = await trail.history(request_id)
    if row is None and not records:
        raise NotFound(f"no request {request_id!r} and no decision about it")
    if records:
        ended_at_ms = int(row.get("ended_at_ms") or 0) if row is not None else 0
        verbs = await trail.operator_records(about=records[0].queue)
        records = with_queue_verbs(records, verbs, ended_at_ms)
    position = await _position(js, topology, row, trail) if row is not None else None
    commits = {}
    for named in sorted(named_requests(records)):
        with contextlib.suppress(NotFound):
            commits[named] = (await requests.get(named)).uri
    return history_json(row, records, Story(commits, position))


async def _position(
    js: JetStreamContext, topology: Topology, row: dict[str, Any], trail: JetStreamTrail
) -> Position | None:
    """Where a head that still waits stands in its queue: the queue's waiting heads in
    delivery order (by counter, front first), and why the front waits (its latest hold).
    None for a head that no longer waits, or without a recorded policy to say which
    state waits."""
    policy = await read_policy_record(js, topology)
    if policy is None or not policy.request_initial or row["state"] != policy.request_initial:
        return None
    waiting = waiting_heads((await status_rows(js, topology)).requests, row["queue"], policy)
    ids = [r.id for r in waiting]
    if row["id"] not in ids:
        return None
    front = waiting[0]
    holds = [r for r in await trail.history(front.id) if r.kind == HELD]
    reason = holds[-1].details.get("reason", "") if holds else ""
    return Position(ids.index(row["id"]) + 1, len(ids), front.id, front.uri, reason)


def waiting_heads(requests: list[Request], queue: str, policy: PolicyRecord) -> list[Request]:
    """The heads of ``queue`` that wait (the request machine's initial state), in the
    order the queue's consumer delivers them: by counter, front first."""
    mine = [r for r in requests if r.queue == queue and r.state == policy.request_initial]
    return sorted(mine, key=lambda r: delivery_order(r.id))


def delivery_order(request_id: str) -> int:
    """The counter of ``request_id`` (0 for a damaged id): the queue's delivery order."""
    try:
        return parse_request_id(request_id).counter
    except ValueError:
        return 0

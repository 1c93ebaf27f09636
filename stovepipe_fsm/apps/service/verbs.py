"""``cancel`` and ``retry`` against a running pipeline's JetStream.

They run the request machine the service recorded with its policy hash
(:mod:`...adapters.jetstream.policy_record`), never ``machines/`` in the working
directory; the moves themselves are :mod:`...pipeline.verbs`, through the request
lifecycle (compare-and-set on the request row, the slot freed by the lifecycle, the dedup
entry re-pointed by compare-and-set). Each answers one JSON
object; an illegal move is :class:`~...domain.errors.IllegalOperation` (exit 2) with the
sentence saying why.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext

from ...adapters.jetstream import KvStores, Topology
from ...adapters.jetstream.decision_trail import JetStreamTrail
from ...adapters.jetstream.policy_record import (
    PolicyRecord,
    read_policy_record,
    read_queue_parameters,
)
from ...adapters.memory import SystemClock
from ...domain.errors import IllegalOperation
from ...domain.ids import parse_request_id
from ...domain.queue_names import normalize_queue_name
from ...located.errors import SpecError
from ...pipeline.ingest import Ingest
from ...pipeline.verbs import cancel, queue_coalesces, retry
from ...ports.clock import Clock
from ...process.catalog import compile_request_machine
from ...process.lifecycle import RequestLifecycle
from ...process.roles import RequestRoles
from ...views.entities import request_json
from .connect import NatsOptions
from .operators import ingest_with, opened_stores, request_for_uri


def recorded_lifecycle(
    record: PolicyRecord | None, stores: KvStores, clock: Clock
) -> RequestLifecycle:
    """The request lifecycle over the machine the service recorded, on ``stores``;
    ``IllegalOperation`` when no service recorded one, or it does not load here."""
    if record is None:
        raise IllegalOperation(
            "no service has recorded the policy in force on this broker yet; cancel, "
            "retry and dlq replay take the request machine from it (run serve once)"
        )
    if not record.request_machine:
        raise IllegalOperation(
            f"the policy record ({record.hash}) was written by a service that does not "
            "record the request machine in force; cancel, retry and dlq replay run that "
            "machine (restart serve with this version)"
        )
    try:
        machine = compile_request_machine(record.request_machine, f"request.yaml@{record.hash}")
    except SpecError as exc:
        raise IllegalOperation(
            f"the request machine of the policy in force ({record.hash}) does not load here: {exc}"
        ) from None
    roles = RequestRoles.from_spec(machine.spec)
    return RequestLifecycle(
        machine, roles, stores.requests, stores.queues, clock=clock, offload=True
    )


@dataclass(frozen=True)
class VerbContext:
    js: JetStreamContext
    topology: Topology
    stores: KvStores
    lifecycle: RequestLifecycle
    policy_hash: str
    trail: JetStreamTrail
    #: The policy in force supersedes older heads (``retry`` refuses one behind a newer).
    coalesces: bool = True

    def ingest(self) -> Ingest:
        initial = self.lifecycle.roles.initial
        return ingest_with(self.js, self.topology, self.stores, initial, self.trail)


@contextlib.asynccontextmanager
async def verb_context(options: NatsOptions, topology: Topology) -> AsyncIterator[VerbContext]:
    async with opened_stores(options, topology) as (js, stores):
        record = await read_policy_record(js, topology)
        lifecycle = recorded_lifecycle(record, stores, SystemClock())
        policy_hash = record.hash if record is not None else ""
        trail = JetStreamTrail(js, topology)
        coalesces = record.coalesces if record is not None else True
        yield VerbContext(js, topology, stores, lifecycle, policy_hash, trail, coalesces)


async def resolve_request(ctx: VerbContext, request_id: str, queue: str, uri: str) -> str:
    if request_id:
        return request_id
    return await request_for_uri(ctx.stores.uris, normalize_queue_name(queue), uri)


async def cancel_request(
    options: NatsOptions, topology: Topology, request_id: str, queue: str, uri: str, by: str
) -> dict[str, Any]:
    async with verb_context(options, topology) as ctx:
        request_id = await resolve_request(ctx, request_id, queue, uri)
        result = await cancel(
            ctx.lifecycle, ctx.trail, SystemClock(), request_id, by=by, policy_hash=ctx.policy_hash
        )
    said = "cancelled" if result.cancelled else f"already ended as {result.request.state}"
    return {
        "request_id": request_id,
        "cancelled": result.cancelled,
        "message": f"request {request_id} {said}",
        "request": request_json(result.request),
    }


async def retry_with(
    ctx: VerbContext, request_id: str, by: str, *, verb: str = "retry"
) -> dict[str, Any]:
    # The queue's parameters as the service recorded them: a queue keeping every head
    # retries one behind a newer head.
    queue = parse_request_id(request_id).queue
    recorded = (await read_queue_parameters(ctx.js, ctx.topology)).get(queue, {})
    result = await retry(
        ctx.lifecycle,
        ctx.ingest(),
        ctx.stores.uris,
        request_id,
        by=by,
        verb=verb,
        coalesces=queue_coalesces(ctx.coalesces, recorded),
    )
    said = (
        f"request {request_id} retried as {result.request_id}"
        if result.created
        else f"request {request_id} was already retried as {result.request_id}"
    )
    return {
        "request_id": result.request_id,
        "retry_of": request_id,
        "created": result.created,
        "published": result.published,
        "message": said,
    }


async def retry_request(
    options: NatsOptions, topology: Topology, request_id: str, queue: str, uri: str, by: str
) -> dict[str, Any]:
    async with verb_context(options, topology) as ctx:
        request_id = await resolve_request(ctx, request_id, queue, uri)
        return await retry_with(ctx, request_id, by)

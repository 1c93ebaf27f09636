"""``cancel`` and ``retry`` against a running pipeline's JetStream.

What they need of the request machine comes from the policy record the service wrote
(:mod:`...adapters.jetstream.policy_record`), never from ``machines/`` in the working
directory; the moves themselves are :mod:`...pipeline.verbs` (compare-and-set on the
request row, the dedup entry re-pointed by compare-and-set). Each answers one JSON
object; an illegal move is :class:`~...domain.errors.IllegalOperation` (exit 2) with the
sentence saying why.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext

from ...adapters.jetstream import KvStores, Topology, ensure_topology, open_kv_stores
from ...adapters.jetstream.policy_record import PolicyRecord, read_policy_record
from ...adapters.jetstream.publisher import JetStreamPublisher
from ...adapters.jetstream.trail import JetStreamTrail
from ...adapters.memory import SystemClock
from ...domain.errors import IllegalOperation
from ...domain.queue_names import normalize_queue_name
from ...pipeline.ingest import Ingest
from ...pipeline.verbs import VerbPolicy, cancel, retry
from ...views.entities import request_json
from .connect import NatsOptions, connected
from .operators import request_for_uri


def verb_policy(record: PolicyRecord | None) -> VerbPolicy:
    """The verbs' view of the policy in force; ``IllegalOperation`` without one."""
    if record is None or not record.request_initial or not record.terminal_states:
        raise IllegalOperation(
            "no service has recorded the policy in force on this broker yet; cancel, "
            "retry and dlq replay take the request machine from it (run serve once)"
        )
    retryable = {
        state
        for name, states in record.outcomes.items()
        if record.green_outcome and name != record.green_outcome
        for state in states
    }
    if record.withdrawn:
        retryable.add(record.withdrawn)
    return VerbPolicy(
        hash=record.hash,
        initial=record.request_initial,
        terminal=frozenset(record.terminal_states),
        withdraw=record.withdraw,
        withdrawn=record.withdrawn,
        retryable=frozenset(retryable),
    )


@dataclass(frozen=True)
class VerbContext:
    js: JetStreamContext
    topology: Topology
    stores: KvStores
    policy: VerbPolicy
    trail: JetStreamTrail

    def ingest(self) -> Ingest:
        return Ingest(
            initial_state=self.policy.initial,
            requests=self.stores.requests,
            queues=self.stores.queues,
            publisher=JetStreamPublisher(self.js, self.topology),
            uri_index=self.stores.uris,
            counter=self.stores.counters,
            clock=SystemClock(),
            trail=self.trail,
        )


@contextlib.asynccontextmanager
async def verb_context(options: NatsOptions, topology: Topology) -> AsyncIterator[VerbContext]:
    async with connected(options) as nc:
        js = nc.jetstream()
        await ensure_topology(js, topology)
        stores = await open_kv_stores(js, topology)
        policy = verb_policy(await read_policy_record(js, topology))
        yield VerbContext(js, topology, stores, policy, JetStreamTrail(js, topology))


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
            ctx.policy,
            ctx.stores.requests,
            ctx.stores.queues,
            ctx.trail,
            SystemClock(),
            request_id,
            by=by,
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
    result = await retry(
        ctx.policy, ctx.ingest(), ctx.stores.uris, request_id, by=by, verb=verb
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

"""``webhook`` in process on a real broker: two deliveries of one ref handled at once,
and what a webhook without a clone can tell from what is stored."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import pytest
from test_webhook import ZERO, github_push, to_github

from stovepipe_fsm.adapters.jetstream import open_cell
from stovepipe_fsm.adapters.jetstream.deliveries import KvDeliveries
from stovepipe_fsm.adapters.jetstream.ref_cursors import POLL, KvRefCursors, RefCursor
from stovepipe_fsm.adapters.jetstream.server import free_port
from stovepipe_fsm.adapters.jetstream.topology import ensure_bucket
from stovepipe_fsm.apps.options import DEFAULT_MACHINES
from stovepipe_fsm.apps.service.operators import ingest_on
from stovepipe_fsm.apps.service.webhook import WebhookServer, WebhookSettings
from stovepipe_fsm.pipeline.ingest import Head, Ingest, IngestResult

QUEUE = "mono/main"
A, B, C = "a" * 40, "b" * 40, "c" * 40


class GatedCursors(KvRefCursors):
    """Once ``gate`` is set, the first two reads wait for each other (both deliveries
    read the same cursor), and each write is announced."""

    def __init__(self, cell) -> None:  # type: ignore[no-untyped-def]
        super().__init__(cell)
        self.gate = False
        self.reads = 0
        self.both_read = asyncio.Event()
        self.written: dict[str, asyncio.Event] = {B: asyncio.Event(), C: asyncio.Event()}

    async def read(self, queue: str, ref: str) -> RefCursor:
        cursor = await super().read(queue, ref)
        if self.gate:
            self.reads += 1
            if self.reads == 2:
                self.both_read.set()
            await self.both_read.wait()
        return cursor

    async def advance(self, read: RefCursor, commit: str, **options) -> bool:  # type: ignore[no-untyped-def]
        moved = await super().advance(read, commit, **options)
        if commit in self.written:
            self.written[commit].set()
        return moved


@dataclass
class Hook:
    server: WebhookServer
    ingest: Ingest
    cursors: GatedCursors

    async def push(self, payload: dict) -> tuple[int, dict]:
        code, body, _ = await asyncio.to_thread(to_github, self.server.port, payload)
        return code, json.loads(body)

    async def latest(self) -> str:
        row = await self.ingest.queues.get(QUEUE)
        for uri in (A, B, C):
            if await self.ingest.uri_index.get(QUEUE, uri) == row.latest_request_id:
                return uri
        return ""


@pytest.fixture
async def hook(js_env) -> AsyncIterator[Hook]:
    ingest = await ingest_on(js_env.js, js_env.topology, DEFAULT_MACHINES)
    await ensure_bucket(js_env.js, js_env.topology.deliveries_bucket_spec())
    deliveries = KvDeliveries(await open_cell(js_env.js, js_env.topology.deliveries_bucket))
    cursors = GatedCursors(await open_cell(js_env.js, js_env.topology.service_bucket))
    settings = WebhookSettings(
        follows={"refs/heads/main": QUEUE}, github_secret=b"It's a Secret to Everybody"
    )
    server = await WebhookServer(ingest, deliveries, cursors, settings, free_port()).start()
    try:
        yield Hook(server, ingest, cursors)
    finally:
        await server.close()


def ingest_after(hook: Hook, uri: str, written: str) -> None:
    """The batch that holds ``uri`` is ingested only once the cursor moved to ``written``."""
    plain = hook.ingest.ingest_many

    async def gated(heads: Iterable[Head], **options) -> list[IngestResult]:  # type: ignore[no-untyped-def]
        heads = list(heads)
        if any(head.uri == uri for head in heads):
            await hook.cursors.written[written].wait()
        return await plain(heads, **options)

    hook.ingest.ingest_many = gated  # type: ignore[method-assign]


@pytest.mark.parametrize("older_first", [False, True], ids=["newer-wins", "older-wins"])
async def test_two_deliveries_at_once_leave_the_newer_head_latest(hook, older_first) -> None:
    """The pushes A->B and B->C are handled at once, both reading the cursor at A. Whichever
    write of the cursor wins and whichever took the newer ids, C ends ``latest`` and the
    cursor stands at C."""
    assert (await hook.push(github_push(ZERO, A, [A])))[0] == 200
    hook.cursors.gate = True
    if older_first:
        ingest_after(hook, C, written=B)  # B is ingested and written first
    else:
        ingest_after(hook, B, written=C)  # C is written first, B then takes the newer id
    late, newer = await asyncio.gather(
        hook.push(github_push(A, B, [B])), hook.push(github_push(B, C, [C]))
    )
    assert newer[0] == 200, newer
    assert late[0] in (200, 202), late
    assert await hook.latest() == C
    assert (await hook.cursors.read(QUEUE, "main")).commit == C


async def test_without_a_clone_a_push_of_an_ingested_commit_is_stale(hook) -> None:
    """The cursor (a poller's, knowing nothing behind C) does not name B, but B was
    ingested into the queue: a push landing on B is stale. A push landing on a commit
    never ingested nor named is not detected and is ingested."""
    await hook.ingest.ingest(QUEUE, B)
    await hook.ingest.ingest(QUEUE, C)
    cursors = hook.cursors
    assert await cursors.advance(await cursors.read(QUEUE, "main"), C, reporter=POLL)

    code, report = await hook.push(github_push(A, B, [B]))
    assert (code, report["stale"]) == (202, True) and "ingested" in report["why"]
    assert await hook.latest() == C
    code, report = await hook.push(github_push(ZERO, A, [A]))  # A: unknown here
    assert (code, [i["uri"] for i in report["ingested"]]) == (200, [A])
    assert await hook.latest() == A

"""``webhook`` in process on a real broker: two deliveries of one ref handled at once,
and what a webhook without a clone can tell from what is stored."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import pytest
from test_service_poll import commit, make_repo
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
#: Commits a webhook without a clone is told of (none exists anywhere).
A, B, C = "a" * 40, "b" * 40, "c" * 40


class GatedCursors(KvRefCursors):
    """Once ``gate`` is set, the first two reads wait for each other (both deliveries
    read the same cursor), and each write is announced."""

    def __init__(self, cell, commits: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
        super().__init__(cell)
        self.gate = False
        self.reads = 0
        self.both_read = asyncio.Event()
        self.written = {commit: asyncio.Event() for commit in commits}

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
    #: A, B and C, one after the other on the ref.
    commits: tuple[str, str, str]

    async def push(self, payload: dict) -> tuple[int, dict]:
        code, body, _ = await asyncio.to_thread(to_github, self.server.port, payload)
        return code, json.loads(body)

    async def latest(self) -> str:
        row = await self.ingest.queues.get(QUEUE)
        for uri in self.commits:
            if await self.ingest.uri_index.get(QUEUE, uri) == row.latest_request_id:
                return uri
        return ""


async def start_hook(js_env, commits: tuple[str, str, str], git_repo=None) -> Hook:  # type: ignore[no-untyped-def]
    ingest = await ingest_on(js_env.js, js_env.topology, DEFAULT_MACHINES)
    await ensure_bucket(js_env.js, js_env.topology.deliveries_bucket_spec())
    deliveries = KvDeliveries(await open_cell(js_env.js, js_env.topology.deliveries_bucket))
    cell = await open_cell(js_env.js, js_env.topology.service_bucket)
    cursors = GatedCursors(cell, commits)
    settings = WebhookSettings(
        follows={"refs/heads/main": QUEUE},
        github_secret=b"It's a Secret to Everybody",
        git_repo=git_repo,
    )
    server = await WebhookServer(ingest, deliveries, cursors, settings, free_port()).start()
    return Hook(server, ingest, cursors, commits)


@pytest.fixture
async def hook(js_env) -> AsyncIterator[Hook]:
    """A webhook without a clone."""
    started = await start_hook(js_env, (A, B, C))
    try:
        yield started
    finally:
        await started.server.close()


@pytest.fixture(params=[False, True], ids=["no-clone", "clone"])
async def any_hook(request, js_env, tmp_path) -> AsyncIterator[Hook]:
    """A webhook without a clone, or with one holding A, B and C."""
    if request.param:
        repo = make_repo(tmp_path)
        a, b, c = (commit(repo, name) for name in "ABC")
        started = await start_hook(js_env, (a, b, c), git_repo=repo)
    else:
        started = await start_hook(js_env, (A, B, C))
    try:
        yield started
    finally:
        await started.server.close()


def ingest_after(hook: Hook, uri: str, written: str, then: str = "") -> None:
    """The batch that holds ``uri`` is ingested only once the cursor moved to ``written``;
    ``then``, a head of another origin, is ingested right after it."""
    plain = hook.ingest.ingest_many

    async def gated(heads: Iterable[Head], **options) -> list[IngestResult]:  # type: ignore[no-untyped-def]
        heads = list(heads)
        if any(head.uri == uri for head in heads):
            await hook.cursors.written[written].wait()
            results = await plain(heads, **options)
            if then:
                await hook.ingest.ingest(QUEUE, then)
            return results
        return await plain(heads, **options)

    hook.ingest.ingest_many = gated  # type: ignore[method-assign]


@pytest.mark.parametrize("older_first", [False, True], ids=["newer-wins", "older-wins"])
async def test_two_deliveries_at_once_leave_the_newer_head_latest(any_hook, older_first) -> None:
    """The pushes A->B and B->C are handled at once, both reading the cursor at A. Whichever
    write of the cursor wins and whichever took the newer ids, C ends ``latest`` and the
    cursor stands at C."""
    hook = any_hook
    a, b, c = hook.commits
    assert (await hook.push(github_push(ZERO, a, [a])))[0] == 200
    hook.cursors.gate = True
    if older_first:
        ingest_after(hook, c, written=b)  # B is ingested and written first
    else:
        ingest_after(hook, b, written=c)  # C is written first, B then takes the newer id
    late, newer = await asyncio.gather(
        hook.push(github_push(a, b, [b])), hook.push(github_push(b, c, [c]))
    )
    assert newer[0] == 200, newer
    assert late[0] in (200, 202), late
    assert await hook.latest() == c
    assert (await hook.cursors.read(QUEUE, "main")).commit == c


async def test_a_newer_head_of_another_origin_is_left_latest_after_a_race(hook) -> None:
    """In the race, an operator ingests X after the late push's B: the loser does not
    make C ``latest`` again over X, which nothing says is older than C."""
    other = "e" * 40
    assert (await hook.push(github_push(ZERO, A, [A])))[0] == 200
    hook.cursors.gate = True
    ingest_after(hook, B, written=C, then=other)
    await asyncio.gather(hook.push(github_push(A, B, [B])), hook.push(github_push(B, C, [C])))
    row = await hook.ingest.queues.get(QUEUE)
    assert row.latest_request_id == await hook.ingest.uri_index.get(QUEUE, other)


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

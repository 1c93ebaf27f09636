"""Culprit finding on a real nats-server, with a real git repository.

A linear trunk after a green base; a burst of commits is pushed and ingested as ``poll``
ingests it, and a middle commit of the burst breaks the build. The test is the build
farm: it reads the build stream, tells a probe from a head by the request's ``probe_of``,
and reports each outcome by the request id of its build message with ``complete``'s
``--request-id`` (a message on the outcome stream, which the service records): red from
the broken commit on, green before it. The red newest head starts a search with two
probe slots; the farm holds every probe until the search has listed all it started, so
it sees as many in flight as the service ever runs at once, and a head pushed meanwhile
is admitted while the probes build. ``validation.repository.culprit_found`` names the
broken commit with its green parent; a flaky red below it is not named.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from git_histories import Repo
from test_service_oncall import story
from test_service_support import WAIT_S, Running, running_service, stream_messages, wait_for
from test_status_page import fetch

from stovepipe_fsm.adapters.git import GitSourceControlProvider
from stovepipe_fsm.adapters.jetstream import open_cell
from stovepipe_fsm.adapters.jetstream.ref_cursors import KvRefCursors
from stovepipe_fsm.adapters.jetstream.server import free_port
from stovepipe_fsm.apps.service.connect import NatsOptions
from stovepipe_fsm.apps.service.http import HttpEndpoint, render_metrics
from stovepipe_fsm.apps.service.operators import complete, render_status, status_document
from stovepipe_fsm.apps.service.poll import Poller, PollTarget, poll_round
from stovepipe_fsm.domain.errors import NotFound
from stovepipe_fsm.domain.hooks import CULPRIT_FOUND, CULPRIT_UNRESOLVED

pytestmark = pytest.mark.nats

QUEUE = "mono/main"
PROBE_SLOTS = 2


def trunk(path: Path, commits: int) -> tuple[Repo, list[str]]:
    """A repository whose ``main`` is the base ``c0`` only; ``c1..c<commits>`` are made
    by :func:`push` (returned as the names they will have)."""
    repo = Repo(path)
    path.mkdir(parents=True)
    repo.git("init", "-q", "-b", "main")
    repo.commit("c0", src__app_py="0\n")
    return repo, [f"c{n}" for n in range(commits + 1)]


def push(repo: Repo, *names: str) -> dict[str, str]:
    """Commit ``names`` on ``main`` in order: name -> commit id."""
    return {name: repo.commit(name, src__app_py=f"{name}\n") for name in names}


@dataclass
class Farm:
    """The build system: reads the build stream, reports outcomes on the outcome stream.

    A commit at or after ``culprit`` is red, one before it green; a commit in ``flaky``
    is red on its first build only. Heads are reported at once, except those whose
    commit is in ``held``. Probes are reported once every probe the search row lists has
    reached the farm, all together, and while ``probing`` is set: ``peak`` is the most
    probe builds the farm ever had in flight.
    """

    run: Running
    js_env: Any
    names: dict[str, str]
    culprit: str
    flaky: set[str] = field(default_factory=set)
    held: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)
    probes: dict[str, str] = field(default_factory=dict)
    reported: dict[str, str] = field(default_factory=dict)
    probe_builds: list[str] = field(default_factory=list)
    peak: int = 0
    probing: asyncio.Event = field(default_factory=asyncio.Event)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.probing.set()

    def name(self, commit: str) -> str:
        return next(n for n, c in self.names.items() if c == commit)

    def outcome(self, commit: str) -> str:
        name = self.name(commit)
        if name in self.flaky:
            self.flaky.discard(name)
            return "failed"
        return "failed" if int(name[1:]) >= int(self.culprit[1:]) else "succeeded"

    async def report(self, request_id: str, commit: str) -> None:
        outcome = self.outcome(commit)
        self.reported[request_id] = outcome
        options = NatsOptions(url=self.js_env.server.url, max_reconnect_attempts=3)
        await complete(options, self.js_env.topology, QUEUE, "", outcome, 0, request_id=request_id)

    async def listed_probes(self) -> set[str]:
        searches = self.run.pipeline.ports.searches
        try:
            return {p.request_id for p in (await searches.get(QUEUE)).probes}
        except NotFound:
            return set()

    async def step(self) -> None:
        topology = self.js_env.topology
        builds = await stream_messages(
            self.js_env.js, topology.build_stream, topology.build_subject(QUEUE)
        )
        for message in builds:
            request_id = message["request_id"]
            if request_id in self.seen:
                continue
            self.seen.add(request_id)
            request = await self.run.request(request_id)
            if request.probe_of:
                self.probes[request_id] = request.uri
                self.probe_builds.append(request_id)
            elif self.name(request.uri) not in self.held:
                await self.report(request_id, request.uri)
        in_flight = set(self.probes) - set(self.reported)
        self.peak = max(self.peak, len(in_flight))
        if self.probing.is_set() and in_flight and in_flight >= await self.listed_probes():
            for request_id in sorted(in_flight):
                await self.report(request_id, self.probes[request_id])

    async def serve(self) -> None:
        while not self.stopped.is_set():
            await self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopped.wait(), 0.05)


@contextlib.asynccontextmanager
async def farm_running(farm: Farm) -> AsyncIterator[Farm]:
    """The farm serving until the block ends. It is stopped by a flag, never cancelled: a
    cancellation that lands while a report closes its connection is swallowed by the
    client's close, and the farm would serve for ever."""
    task = asyncio.create_task(farm.serve())
    try:
        yield farm
    finally:
        farm.stopped.set()
        await asyncio.wait_for(task, WAIT_S)


@contextlib.asynccontextmanager
async def culprit_service(js_env: Any, repo: Repo) -> AsyncIterator[tuple[Running, Poller]]:
    """The service on the shipped machines (culprit.yaml among them), ``probe_slots`` 2
    for the queue, ancestry from ``repo``; and a poller of its ``main``."""
    config = {
        "defaults": {"gate_wait_delay_ms": 200},
        "queues": {QUEUE: {"repository": str(repo.path), "probe_slots": PROBE_SLOTS}},
    }
    provider = GitSourceControlProvider({QUEUE: repo.path})
    async with running_service(js_env.server, js_env.topology, config, provider=provider) as run:
        cursors = KvRefCursors(await open_cell(js_env.js, js_env.topology.service_bucket))
        yield run, Poller(run.pipeline.stages.ingest, cursors)


async def poll(poller: Poller, repo: Repo) -> list[str]:
    """One ``poll`` round of ``main``: the request ids ingested, oldest first."""
    (report,) = await poll_round(poller, [PollTarget(repo.path, "main", QUEUE)])
    earlier = [e["request_id"] for e in report["earlier"]]  # type: ignore[attr-defined]
    return [*earlier, str(report["request_id"])]


async def hooks(js_env: Any, kind: str) -> list[dict[str, str]]:
    topology = js_env.topology
    events = await stream_messages(js_env.js, topology.hooks_stream, topology.hook_subject(kind))
    return [e["payload"] for e in events]


async def on_call(js_env: Any, http: HttpEndpoint) -> tuple[str, str]:
    """What on-call reads: the queue page's HTML and ``status``'s text."""
    await asyncio.sleep(1.1)  # past the page's shared read
    _, _, html = await fetch(http.port, f"/queue/{QUEUE}")
    text = render_status(await status_document(js_env.js, js_env.topology))
    return html, text


async def green_base(run: Running, poller: Poller, repo: Repo, names: dict[str, str]) -> None:
    """``c0`` ingested, built and green."""
    names["c0"] = repo.head()
    (base,) = await poll(poller, repo)
    await run.wait_state(base, "succeeded")


async def found(js_env: Any) -> dict[str, str]:
    async def one() -> list[dict[str, str]]:
        return await hooks(js_env, CULPRIT_FOUND)

    (event,) = await wait_for(one, "culprit_found")
    return event


async def burst(
    js_env: Any, tmp_path: Path, culprit: str, flaky: Collection[str] = ()
) -> tuple[Farm, list[str], dict[str, str]]:
    """The burst c1..c7 on a green c0, its newest head red: until a culprit is named.
    Returns the farm, the burst's request ids and the ``culprit_found`` payload."""
    repo, order = trunk(tmp_path / "repo", 7)
    names: dict[str, str] = {}
    async with culprit_service(js_env, repo) as (run, poller):
        farm = Farm(run, js_env, names, culprit, flaky=set(flaky))
        async with farm_running(farm):
            await green_base(run, poller, repo, names)
            names.update(push(repo, *order[1:]))
            ids = await poll(poller, repo)
            event = await found(js_env)
    return farm, ids, event


async def test_a_burst_with_a_broken_middle_commit_names_it(js_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repo, order = trunk(tmp_path / "repo", 8)
    names: dict[str, str] = {}
    async with culprit_service(js_env, repo) as (run, poller):
        farm = Farm(run, js_env, names, culprit="c4", held={"c8"})
        farm.probing.clear()
        http = await HttpEndpoint(run.service, free_port()).start()
        async with farm_running(farm), contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(http.close)
            await green_base(run, poller, repo, names)
            names.update(push(repo, *order[1:8]))
            ids = await poll(poller, repo)
            assert len(ids) == 7
            red = ids[-1]
            await run.wait_state(red, "failed")

            async def probing() -> bool:
                return len(set(farm.probes) - set(farm.reported)) == PROBE_SLOTS

            await wait_for(probing, "the first probes in flight")
            # A head pushed while probes build is admitted at once: probes take no slot.
            names.update(push(repo, "c8"))
            (c8,) = await poll(poller, repo)
            await run.wait_state(c8, "processing")
            queue = await run.queue(QUEUE)
            assert queue.slot_holders == (c8,)
            assert queue.latest_request_id == c8
            assert len(await farm.listed_probes()) == PROBE_SLOTS, "still building"
            probing_page, probing_status = await on_call(js_env, http)
            farm.probing.set()
            event = await found(js_env)
            named_page, named_status = await on_call(js_env, http)
        search = await run.pipeline.ports.searches.get(QUEUE)
        metrics = await render_metrics(run.service)
        probe_rows = [await run.request(p) for p in farm.probe_builds]

    assert (event["culprit"], event["green_parent"]) == (names["c4"], names["c3"])
    assert event["request_id"] == red and event["queue"] == QUEUE
    assert int(event["reds"]) >= 2
    assert 0 < farm.peak <= PROBE_SLOTS
    assert farm.peak == PROBE_SLOTS, "the search used both probe slots at once"
    assert (search.state, search.culprit, search.red_request_id) == ("named", names["c4"], red)
    assert search.probes_started == len(farm.probe_builds)
    assert {r.probe_of for r in probe_rows} == {red}
    assert all(r.build_strategy and r.base_uri for r in probe_rows)
    assert not await hooks(js_env, CULPRIT_UNRESOLVED)

    def counted(event: str, value: int) -> str:
        return f'stovepipe_process_events_total{{event="{event}",queue="{QUEUE}"}} {value}'

    assert counted("probes_started", search.probes_started) in metrics, metrics
    assert counted("culprits_found", 1) in metrics
    assert "culprits_unresolved" not in metrics

    # The queue page and status: the search row, and the probes in flight while they build.
    short = {n: c[:10] for n, c in names.items()}
    probes = re.findall(r'<tr class="probe">(.*?)</tr>', probing_page)
    assert len(probes) == PROBE_SLOTS, probing_page
    assert all(f"/request/{red}" in row for row in probes)
    in_flight = f"2 in flight of {PROBE_SLOTS} probe slot(s))"
    searching = "culprit search searching (blamelist 7 commit(s); green through the base, "
    assert searching in probing_page and in_flight in probing_page
    assert f"red head {red} ({short['c7']}): {searching}" in probing_status, probing_status
    assert in_flight in probing_status
    named = f"culprit search named {short['c4']} as the culprit (blamelist 7 commit(s); "
    assert named in named_page and "No probe builds." in named_page, named_page
    assert f"red head {red} ({short['c7']}): {named}" in named_status, named_status
    assert f"0 in flight of {PROBE_SLOTS} probe slot(s))" in named_status

    # explain: the red head's search, and each probe's commit and red head.
    red_story = await story(js_env, red)
    red_name = f"{names['c7'][:10]} (request {red.rsplit('/', 1)[1]})"
    assert f"culprit search named {names['c4'][:10]} as the culprit (blamelist 7" in red_story
    assert "culprit search searching (blamelist 7 commit(s); green through the base, " in (
        red_story
    ), red_story
    probe = farm.probe_builds[0]
    probe_story = await story(js_env, probe)
    first = probe_story.splitlines()[0]
    assert first.endswith(f"probe of {red_name}"), probe_story
    assert f"of the 7 commits in the blamelist) for red head {red_name}" in probe_story
    assert f"admitted: a probe build, in a probe slot, for red head {red_name}" in probe_story


async def test_a_flaky_red_below_the_culprit_is_not_named(js_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    farm, _, event = await burst(js_env, tmp_path, culprit="c5", flaky={"c2"})
    assert event["culprit"] == farm.names["c5"], "the flaky c2 is not named"
    assert event["green_parent"] == farm.names["c4"]
    probed = [(farm.name(farm.probes[r]), o) for r, o in farm.reported.items() if r in farm.probes]
    assert ("c2", "failed") in probed, "the flake was seen"
    greens_above = {n for n, o in probed if o == "succeeded" and "c2" < n < "c5"}
    assert greens_above, "and disproved by a green above it"
    assert farm.peak <= PROBE_SLOTS

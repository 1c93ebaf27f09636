"""A live run replayed: ``export`` of a deployment on a real nats-server, replayed under
the policy that ran, reproduces it request by request; replayed with more slots, it
shows what they buy, from the recorded build durations.

The live run is the service on a real broker and a real generated git repository, with
the test as build system and operator: bursts of heads (older ones superseded), a held
head, a build file that forces a full build, a failed build retried, a force-push to a
rewritten line, a rollback to a commit trunk had before, a pause and a resume, a cancel
of a waiting head, and a head whose deliveries fail until it is dead-lettered.

Tolerance: what the stage decided (each request's final state, strategy, base and what
superseded it, and which heads were built, in order) must be the same. Times may differ
by the live run's delivery latency and, for a head the gate held, by when its held
message was re-checked: at most :data:`TOLERANCE_MS` (the hold delay and a margin).
Every difference is listed in the assertion's message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from git_histories import Repo
from test_service_support import FAST, Running, machines, running_service, wait_for

from stovepipe_fsm.adapters.git import GitSourceControlProvider
from stovepipe_fsm.adapters.jetstream.bulk import kv_snapshot
from stovepipe_fsm.adapters.jetstream.codec import decode_request
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.service.connect import NatsOptions
from stovepipe_fsm.apps.service.export import export_timeline, render_timeline
from stovepipe_fsm.apps.service.pauses import operator_pause, operator_resume
from stovepipe_fsm.apps.service.verbs import cancel_request, retry_request
from stovepipe_fsm.apps.whatif.figures import TOTAL, figures_by_queue
from stovepipe_fsm.domain.entities import Request
from stovepipe_fsm.domain.ids import parse_request_id
from stovepipe_fsm.domain.settle import DEFAULT_RETRY_BASE_S, DEFAULT_RETRY_CAP_S
from stovepipe_fsm.pipeline.ingest import Head
from stovepipe_fsm.simulation.replay import simulate
from stovepipe_fsm.simulation.timed import replay_timed
from stovepipe_fsm.simulation.timeline import load_timeline

pytestmark = pytest.mark.slow

QUEUE = "mono/main"
HOLD_MS = 300
TOLERANCE_MS = HOLD_MS + 200
#: The runtime's own retry backoff: the replay retries a failing head with it too.
OPTIONS = dataclasses.replace(
    FAST, retry_base_s=DEFAULT_RETRY_BASE_S, retry_cap_s=DEFAULT_RETRY_CAP_S
)


def generated_trunk(path: Path) -> tuple[Repo, dict[str, str]]:
    """c1..c12 on trunk (c6 touches a build file), r1 a rewrite of trunk from c2."""
    repo = Repo(path)
    path.mkdir(parents=True)
    repo.git("init", "-q", "-b", "main")
    commits = {"c1": repo.commit("c1", src__app_py="1\n")}
    for n in range(2, 13):
        files = {"src__app_py": f"{n}\n"}
        if n == 6:
            files["build__BUILD"] = "b\n"
        commits[f"c{n}"] = repo.commit(f"c{n}", **files)
    repo.git("checkout", "-q", "-b", "rewrite", commits["c2"])
    commits["r1"] = repo.commit("r1", src__lib_py="r\n")
    repo.git("checkout", "-q", "main")
    return repo, commits


class Live:
    """The test as build system and operator of a running service."""

    def __init__(self, run: Running, options: NatsOptions, js_env: Any) -> None:
        self.run, self.options, self.env = run, options, js_env

    async def burst(self, *uris: str) -> list[str]:
        heads = [Head(QUEUE, uri) for uri in uris]
        return [r.request_id for r in await self.run.pipeline.stages.ingest.ingest_many(heads)]

    async def held(self, request_id: str) -> None:
        """Until the gate holds ``request_id`` once more, and a little after: the next
        re-check is most of a hold delay away, so what the test does now races none."""
        seen = self.run.events.count("held", request_id)

        async def again() -> bool:
            return self.run.events.count("held", request_id) > seen

        await wait_for(again, f"{request_id} held")
        # Clear of the hold too: its delivery may be a few ms behind the ingest live,
        # and a replay delivers at the ingest's instant.
        await asyncio.sleep(0.1)

    async def build(self, request_id: str, ms: int, outcome: str) -> None:
        await self.run.wait_state(request_id, "processing")
        await asyncio.sleep(ms / 1000)
        await self.run.pipeline.stages.record.complete(request_id, outcome)
        await asyncio.sleep(0.15)  # the next step comes after the outcome, live or replayed


async def live_run(live: Live, c: dict[str, str], repo: Path) -> None:
    (a,) = await live.burst(c["c1"])
    await live.build(a, 400, "succeeded")
    _, _, b4 = await live.burst(c["c2"], c["c3"], c["c4"])  # c2, c3 superseded
    await live.run.wait_state(b4, "processing")
    await asyncio.sleep(0.1)
    _, b6 = await live.burst(c["c5"], c["c6"])  # c5 superseded, c6 held behind c4
    await live.held(b6)
    await live.run.pipeline.stages.record.complete(b4, "succeeded")
    await live.build(b6, 300, "failed")  # full: c6 changed build/BUILD
    retried = await retry_request(live.options, live.env.topology, b6, "", "", "test")
    await live.build(retried["request_id"], 200, "succeeded")
    (r1,) = await live.burst(c["r1"])  # a force-push: full, a rewrite
    await live.build(r1, 300, "succeeded")
    back = await live.run.pipeline.stages.ingest.ingest(QUEUE, c["c6"], at_head=True)  # rollback
    assert back.returned
    await live.build(back.request_id, 200, "succeeded")
    js, topology = live.env.js, live.env.topology
    await operator_pause(js, topology, QUEUE, reason="incident", by="test")
    await live.run.service.crew.policy.refresh_pauses()
    (p7,) = await live.burst(c["c7"])
    await live.held(p7)
    await live.held(p7)
    await operator_resume(js, topology, QUEUE, "test")
    await live.run.service.crew.policy.refresh_pauses()
    await live.build(p7, 200, "succeeded")
    (h8,) = await live.burst(c["c8"])
    await live.run.wait_state(h8, "processing")
    (h9,) = await live.burst(c["c9"])
    await live.held(h9)
    await cancel_request(live.options, topology, h9, "", "", "test")
    await asyncio.sleep(0.1)
    await live.run.pipeline.stages.record.complete(h8, "succeeded")
    await asyncio.sleep(0.15)
    hidden = repo.with_name("away")
    repo.rename(hidden)  # git cannot answer: every delivery of c10 fails
    try:
        (h10,) = await live.burst(c["c10"])
        await live.run.wait_state(h10, "failed")
    finally:
        hidden.rename(repo)
    await asyncio.sleep(0.15)
    (h11,) = await live.burst(c["c11"])
    await live.run.wait_state(h11, "processing")
    await asyncio.sleep(0.1)
    (h12,) = await live.burst(c["c12"])  # held behind c11, then green
    await live.held(h12)
    await live.run.pipeline.stages.record.complete(h11, "succeeded")
    await live.build(h12, 300, "succeeded")


def keyed(requests: Iterable[Request]) -> dict[tuple[str, int], Request]:
    """Each request by (commit, how many requests for that commit came before it)."""
    out: dict[tuple[str, int], Request] = {}
    for r in sorted(requests, key=lambda r: parse_request_id(r.id).counter):
        n = sum(1 for key in out if key[0] == r.uri)
        out[(r.uri, n)] = r
    return out


def compare(
    live: dict[tuple[str, int], Request], replay: dict[tuple[str, int], Request], t0: int
) -> tuple[list[str], list[str]]:
    """(differences in what was decided, differences in time beyond the tolerance)."""
    decided: list[str] = []
    timing: list[str] = []
    key_of = {r.id: key for key, r in live.items()}
    replay_key_of = {r.id: key for key, r in replay.items()}
    for key in sorted(live.keys() | replay.keys()):
        a, b = live.get(key), replay.get(key)
        if a is None or b is None:
            decided.append(f"{key}: live {a and a.state} replay {b and b.state}")
            continue
        pairs = {
            "state": (a.state, b.state),
            "strategy": (a.build_strategy, b.build_strategy),
            "base": (a.base_uri, b.base_uri),
            "superseded_by": (
                key_of.get(a.superseded_by, a.superseded_by),
                replay_key_of.get(b.superseded_by, b.superseded_by),
            ),
        }
        decided += [f"{key} {k}: live {x!r} replay {y!r}" for k, (x, y) in pairs.items() if x != y]
        # Whether it was admitted and ended is what the state and strategy say (the
        # replay's clock starts at 0, a time its first admission may well have).
        for field in ("admitted_at_ms", "ended_at_ms"):
            x, y = getattr(a, field), getattr(b, field)
            if x and abs((x - t0) - y) > TOLERANCE_MS:
                timing.append(f"{key} {field}: live {x - t0} replay {y} ms")
    return decided, timing


def built_in_order(requests: dict[tuple[str, int], Request]) -> list[tuple[str, int]]:
    admitted = [(r.admitted_at_ms, k) for k, r in requests.items() if r.build_strategy]
    return [k for _, k in sorted(admitted)]


async def test_an_exported_live_run_replays_as_it_ran(js_env, tmp_path: Path) -> None:
    repo, commits = generated_trunk(tmp_path / "repo")
    config = {
        "defaults": {
            "max_concurrent": 1,
            "gate_wait_delay_ms": HOLD_MS,
            "max_attempts": 2,
            "full_build_paths": ["build/**"],
        },
        "queues": {QUEUE: {"repository": str(repo.path)}},
    }
    provider = GitSourceControlProvider({QUEUE: repo.path})
    options = NatsOptions(url=js_env.server.url, max_reconnect_attempts=3)
    async with running_service(
        js_env.server, js_env.topology, config, provider=provider, options=OPTIONS
    ) as run:
        await live_run(Live(run, options, js_env), commits, repo.path)
        exported = await export_timeline(
            js_env.js,
            js_env.topology,
            since_ms=0,
            queue_glob=QUEUE,
            repositories={QUEUE: str(repo.path)},
        )
    rows = [
        decode_request(v) for _, v in await kv_snapshot(js_env.js, js_env.topology.requests_bucket)
    ]
    live = keyed(rows)
    assert (exported.returns, exported.retries, exported.dead_letters) == (1, 1, 1)
    assert (exported.cancels, exported.pauses) == (1, 2)
    assert exported.outcomes == 10  # c1 c4 c6 c6(retry) r1 c6(return) c7 c8 c11 c12
    history = exported.timeline["history"]
    assert history[commits["r1"]] == [commits["c2"]]  # real parents, not ingest order
    assert exported.timeline["changes"][commits["c6"]].keys() == {"src/app_py", "build/BUILD"}

    path = tmp_path / "exported.jsonl"
    path.write_text(render_timeline(exported.timeline, "jsonl"))
    timeline = load_timeline(path)
    world = simulate(timeline, machines(), StaticConfigStore(config)).world
    replay = keyed(world.requests.snapshot())
    t0 = min(r.ingested_at_ms for r in rows)
    decided, timing = compare(live, replay, t0)
    names = {sha: name for name, sha in commits.items()}
    decided = [f"{names.get(d[2:42], '?')} {d}" for d in decided]
    assert decided == [], "\n".join(decided + timing)
    assert timing == [], "\n".join(timing)
    assert built_in_order(live) == built_in_order(replay)
    states = {key: r.state for key, r in live.items()}
    assert states[(commits["c10"], 0)] == "failed" and not live[(commits["c10"], 0)].admitted_at_ms
    assert states[(commits["c9"], 0)] == "cancelled"
    assert live[(commits["c6"], 0)].build_strategy == "full"
    # The force-push onto c2: built on the newest recorded green that is its ancestor.
    rewritten = live[(commits["r1"], 0)]
    assert (rewritten.build_strategy, rewritten.base_uri) == (
        "incremental_since_green",
        commits["c1"],
    )
    assert world.builds is not None and world.builds.inferred == 0

    # The same export with more slots: ingest->green of every commit green under all
    # three no later with more slots, and sooner for some (built from recorded times).
    to_green: list[dict[tuple[str, int], int]] = []
    builds: list[int] = []
    for slots in (1, 2, 3):
        policy = yaml.safe_load(yaml.safe_dump(config))
        policy["defaults"]["max_concurrent"] = slots
        timed = replay_timed(timeline, machines(), StaticConfigStore(policy))
        green = timed.world.machines.roles.green_outcome.states
        ends = {}
        for key, r in keyed(timed.world.requests.snapshot()).items():
            times = timed.times.get(r.id)
            if r.state in green and times is not None and times.ended_ms is not None:
                ends[key] = times.ended_ms - times.ingest_ms
        to_green.append(ends)
        figures = figures_by_queue(timed)[TOTAL]
        builds.append(figures.builds_full + figures.builds_incremental)
        assert timed.world.builds is not None
        assert not any(r.state == "processing" for r in timed.world.requests.snapshot())
    one, two, three = to_green
    assert builds[0] <= builds[1] <= builds[2], builds  # more slots never build less
    both = one.keys() & two.keys() & three.keys()
    assert both
    assert all(three[k] <= two[k] <= one[k] for k in both), (one, two, three)
    assert any(two[k] < one[k] for k in both), (one, two, three)
    shutil.rmtree(tmp_path / "repo")

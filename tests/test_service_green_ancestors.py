"""The newest green ancestor on a real nats-server, with real git ancestry.

A, B and C go green in turn; the branch is then force-pushed back to B and R committed
on top. The next admission, R, builds incremental on B - the older recorded green it
descends from - not in full; the queue row in the KV bucket lists the greens newest
first, and the trail read back from the stream names the green chosen.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_service_support import running_service

from stovepipe_fsm.adapters.git import GitSourceControlProvider
from stovepipe_fsm.apps.service.connect import NatsOptions
from stovepipe_fsm.apps.service.operators import explain_document
from stovepipe_fsm.domain.entities import INCREMENTAL_SINCE_GREEN
from stovepipe_fsm.domain.trail_record import ADMITTED

pytestmark = pytest.mark.nats

QUEUE = "monorepo/main"


def git(repo: Path, *args: str) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    subprocess.run(["git", "-C", str(repo), *args], check=True, env=env, capture_output=True)


def commit(repo: Path, name: str) -> None:
    git(repo, "commit", "-q", "--allow-empty", "-m", name)
    git(repo, "tag", name)


async def test_after_a_force_push_the_next_admission_builds_on_the_older_green(
    js_env, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    for name in "ABC":
        commit(repo, name)
    config = {"defaults": {"gate_wait_delay_ms": 200}, "queues": {QUEUE: {"repository": str(repo)}}}
    provider = GitSourceControlProvider({QUEUE: repo})
    async with running_service(js_env.server, js_env.topology, config, provider=provider) as run:
        ids = {}
        for name in "ABC":
            ids[name] = await run.ingest(QUEUE, name)
            await run.wait_state(ids[name], "processing")
            await run.pipeline.stages.record.complete(ids[name], "succeeded")
            await run.wait_state(ids[name], "succeeded")
        row = await run.queue(QUEUE)
        assert [(g.uri, g.request_id) for g in row.greens] == [
            ("C", ids["C"]),
            ("B", ids["B"]),
            ("A", ids["A"]),
        ]
        assert all(g.at_ms > 0 for g in row.greens)

        git(repo, "reset", "-q", "--hard", "B")  # the force-push: C leaves the branch
        commit(repo, "R")
        ids["R"] = await run.ingest(QUEUE, "R")
        await run.wait_state(ids["R"], "processing")
        r = await run.request(ids["R"])
        assert (r.build_strategy, r.base_uri) == (INCREMENTAL_SINCE_GREEN, "B")
        assert (await run.queue(QUEUE)).last_green_uri == "C"

    options = NatsOptions(url=js_env.server.url, max_reconnect_attempts=3)
    story = await explain_document(options, js_env.topology, ids["R"], "", "")
    (admitted,) = [h for h in story["history"] if h["kind"] == ADMITTED]
    assert admitted["detail"]["base_request"] == ids["B"]
    assert admitted["detail"]["newer_greens_not_ancestors"] == "1"
    assert "full_cause" not in admitted["detail"]
    assert f"green of {ids['B']}" in admitted["sentence"]

"""A head named by a revision git cannot resolve is built in full, on a real broker and git.

``HEAD@{upstream}`` in a clone without an upstream makes git exit 128 with its own words;
the service must read that as unknown ancestry (a full build), not as a retryable
failure that ends dead-lettered.
"""

from __future__ import annotations

from pathlib import Path

from nats_server import JsEnv
from test_git_source_control import commit_file, init_repo
from test_service_support import running_service, stream_messages

from stovepipe_fsm.adapters.git import GitSourceControlProvider

Q1 = "monorepo/main"


async def test_an_unresolvable_revision_is_a_full_build(js_env: JsEnv, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    first = commit_file(repo, "a.txt", "1")
    config = {"defaults": {"max_concurrent": 1, "max_attempts": 3}, "queues": {Q1: {}}}
    provider = GitSourceControlProvider({Q1: repo})
    async with running_service(js_env.server, js_env.topology, config, provider=provider) as run:
        a = await run.ingest(Q1, first)
        await run.wait_state(a, "processing")
        await run.pipeline.stages.record.complete(a, "succeeded")
        b = await run.ingest(Q1, "HEAD@{upstream}")
        await run.wait_state(b, "processing")
        request = await run.request(b)
        assert (request.build_strategy, request.base_uri) == ("full", "")
        assert run.events.count("retry", b) == 0 and run.events.count("dead_letter") == 0
        prefix = f"{js_env.topology.prefix}.dlq."
        assert await stream_messages(js_env.js, js_env.topology.dead_letter_stream, prefix) == []

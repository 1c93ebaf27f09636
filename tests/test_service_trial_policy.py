"""On a real nats-server: the monorepo trial policy (config alone) runs live, and
``explain`` tells each head's story.

``examples/policies/monorepo_trial``: ``mono/main`` keeps the newest two heads with two
slots, ``mono/release-*`` validates every head one at a time, a build-file change since
last green forces a full build and a docs-only change since last green is skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from test_service_explain import explain
from test_service_support import running_service

from stovepipe_fsm.adapters.memory import MemorySourceControl, MemorySourceControlProvider
from stovepipe_fsm.process.catalog import load_process_machines

TRIAL = Path(__file__).resolve().parents[1] / "examples" / "policies" / "monorepo_trial"
MAIN, RELEASE = "mono/main", "mono/release-1"


def trial_config() -> dict[str, Any]:
    """The example's config, with a short hold so the test does not wait 5 s a recheck."""
    config: dict[str, Any] = yaml.safe_load((TRIAL / "config" / "queues.yaml").read_text())
    config["defaults"]["gate_wait_delay_ms"] = 100
    return config


def sentences(document: dict[str, Any]) -> list[str]:
    return [entry["sentence"] for entry in document["history"]]


async def test_the_trial_policy_runs_live_and_explain_tells_each_story(  # type: ignore[no-untyped-def]
    js_env,
) -> None:
    graph = MemorySourceControl(
        {"A": [], "B": ["A"], "C": ["B"], "R1": [], "R2": ["R1"], "R3": ["R2"]},
        {"B": ["docs/guide.md"], "C": ["lib/BUILD.bazel", "lib/a.py"], "R2": ["src/x.py"]},
    )
    policy = load_process_machines(TRIAL / "machines")
    async with running_service(
        js_env.server,
        js_env.topology,
        trial_config(),
        provider=MemorySourceControlProvider(default=graph),
        policy=policy,
    ) as run:
        ids = {"A": await run.ingest(MAIN, "A")}
        await run.wait_state(ids["A"], "processing")
        await run.pipeline.record_outcome(ids["A"], "succeeded")
        ids["B"] = await run.ingest(MAIN, "B")
        await run.wait_state(ids["B"], "skipped")
        ids["C"] = await run.ingest(MAIN, "C")
        await run.wait_state(ids["C"], "processing")

        # A release queue keeps every head: R2 and R3 wait behind R1, none superseded.
        for uri in ("R1", "R2", "R3"):
            ids[uri] = await run.ingest(RELEASE, uri)
        await run.wait_state(ids["R1"], "processing")
        await run.pipeline.record_outcome(ids["R1"], "failed")
        await run.wait_state(ids["R2"], "processing")
        assert await run.state(ids["R3"]) == "accepted"

        stories = {name: sentences(await explain(js_env, ids[name])) for name in ids}
    said = {name: " | ".join(lines) for name, lines in stories.items()}
    assert "no last green" in said["A"], said["A"]
    assert "skipped" in said["B"] and "docs/**" in said["B"] and "docs/guide.md" in said["B"]
    assert "**/BUILD.bazel" in said["C"] and "lib/BUILD.bazel" in said["C"], said["C"]
    assert "superseded" not in said["R2"] + said["R3"]
    assert "admitted" in said["R2"], said["R2"]
    assert f"gate_closed (slot holders: {ids['R2']}" in said["R3"], said["R3"]

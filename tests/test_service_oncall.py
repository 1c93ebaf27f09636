"""On a real nats-server, what on-call asks of a running policy, answered by ``explain``
and the queue page: why a build is full, behind whom a head waits, what failed and when
it is tried again, and the last green.

The policy (``tests/fixtures/plugins/oncall_trial``) is the monorepo trial's: a
speculative ``mono/main`` (two slots, an embargo on ``*-wip`` commits from a plugin),
serial release queues that keep every head, build files that force a full build and a
plugin action that cannot read a commit the repository lacks. A release freeze is an
operator pause of ``mono/release-*``.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import yaml
from test_service_explain import explain
from test_service_support import Running, running_service, wait_for
from test_status_page import fetch

from stovepipe_fsm.adapters.jetstream.server import free_port
from stovepipe_fsm.adapters.memory import MemorySourceControl, MemorySourceControlProvider
from stovepipe_fsm.apps.service.http import HttpEndpoint
from stovepipe_fsm.apps.service.operators import render_status, status_document
from stovepipe_fsm.apps.service.pauses import operator_pause
from stovepipe_fsm.domain.trail_record import TrailRecord
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.views.explain import render_history, story_from_json

POLICY = Path(__file__).resolve().parent / "fixtures" / "plugins" / "oncall_trial"
MAIN, RELEASE = "mono/main", "mono/release-1"


def config() -> dict[str, Any]:
    """The policy's config, with a short hold so a recheck does not take 5 s."""
    loaded: dict[str, Any] = yaml.safe_load((POLICY / "config" / "queues.yaml").read_text())
    loaded["defaults"]["gate_wait_delay_ms"] = 100
    return loaded


async def story(js_env: Any, request_id: str) -> str:
    """What ``explain`` prints for the request."""
    doc = await explain(js_env, request_id)
    records = [TrailRecord.from_json(r) for r in doc["history"]]
    return render_history(doc["request"], records, story_from_json(doc))


async def held_for(js_env: Any, request_id: str, reason: str) -> bool:
    doc = await explain(js_env, request_id)
    return any(r["kind"] == "held" and r["detail"].get("reason") == reason for r in doc["history"])


async def run_main(run: Running, js_env: Any) -> dict[str, str]:
    ids = {"A": await run.ingest(MAIN, "A")}
    await run.wait_state(ids["A"], "processing")
    await run.pipeline.record_outcome(ids["A"], "succeeded")
    for uri in "BC":  # two slots: both build, B on A, C in full for its build file
        ids[uri] = await run.ingest(MAIN, uri)
        await run.wait_state(ids[uri], "processing")
    ids["D"] = await run.ingest(MAIN, "D")
    await wait_for(lambda: held_for(js_env, ids["D"], "gate_closed"), "D held")
    await run.pipeline.record_outcome(ids["B"], "succeeded")
    await run.wait_state(ids["D"], "processing")
    # A commit the repository lacks: the plugin cannot read its diff; retried, then given up.
    ids["GHOST"] = await run.ingest(MAIN, "GHOST")
    await run.wait_state(ids["GHOST"], "failed")
    ids["E-wip"] = await run.ingest(MAIN, "E-wip")
    await wait_for(lambda: held_for(js_env, ids["E-wip"], "embargoed"), "E-wip embargoed")
    return ids


async def run_release(run: Running, js_env: Any) -> dict[str, str]:
    ids = {uri: await run.ingest(RELEASE, uri) for uri in ("R1", "R2", "R3")}
    await run.wait_state(ids["R1"], "processing")
    await wait_for(lambda: held_for(js_env, ids["R2"], "gate_closed"), "R2 held")
    await operator_pause(
        js_env.js, js_env.topology, "mono/release-*", reason="release freeze", by="oncall"
    )
    await wait_for(lambda: held_for(js_env, ids["R2"], "paused"), "R2 held by the freeze")
    return ids


async def test_explain_and_the_queue_page_answer_on_calls_questions(js_env) -> None:  # type: ignore[no-untyped-def]
    graph = MemorySourceControl(
        {"A": [], "B": ["A"], "C": ["B"], "D": ["C"], "E-wip": ["D"],
         "R1": [], "R2": ["R1"], "R3": ["R2"]},
        {"B": ["src/a.py"], "C": ["lib/BUILD.bazel", "lib/c.py"], "D": ["src/d.py"],
         "E-wip": ["src/e.py"], "R2": ["src/r2.py"], "R3": ["src/r3.py"]},
    )
    policy = load_process_machines(POLICY / "machines")
    provider = MemorySourceControlProvider(default=graph)
    async with running_service(
        js_env.server, js_env.topology, config(), provider=provider, policy=policy
    ) as run:
        http = await HttpEndpoint(run.service, free_port()).start()
        try:
            ids = {**await run_main(run, js_env), **await run_release(run, js_env)}
            said = {name: await story(js_env, rid) for name, rid in ids.items()}
            main_page = (await fetch(http.port, f"/queue/{MAIN}"))[2]
            release_page = (await fetch(http.port, f"/queue/{RELEASE}"))[2]
            status_text = render_status(await status_document(js_env.js, js_env.topology))
        finally:
            await http.close()

    # Why full: no last green; a build file changed since last green, path and glob.
    assert "admitted: full build (why full: no last green)" in said["A"], said["A"]
    assert "admitted: incremental_since_green build on A (descends from last green A)" in (
        said["B"]
    )
    assert (
        "admitted: full build (why full: lib/BUILD.bazel changed since last green "
        "(full_build_paths **/BUILD.bazel))" in said["C"]
    ), said["C"]
    # Behind whom: D waited on the two slot holders, named by commit too.
    assert f"gate_closed (slot holders: {ids['B']} (B), {ids['C']} (C))" in said["D"], said["D"]
    assert said["D"].count("parameters: ") == 1 and "max_concurrent=2" in said["D"]
    # What failed, and when it is tried again, until the dead letter.
    ghost = said["GHOST"]
    first = re.search(r"attempt 1 of 3 failed: (.*)", ghost)
    assert first and "NotFound: commit 'GHOST' not found" in first.group(1), ghost
    next_try = r"; next try at \d{4}-\d\d-\d\dT[\d:.]+Z, dead letter if attempt 3 fails"
    assert re.search(next_try, ghost), ghost
    assert "attempt 2 of 3 failed: " in ghost
    assert "dead-lettered after 3 failed attempt(s): gave up after 3 attempts: " in ghost
    # A plugin's decision: held by its condition, with the glob it noted.
    assert ": embargoed, a rule of plugin oncall_rules (slot holders: " in said["E-wip"]
    assert "plugin oncall_rules noted: embargoed (glob=*-wip)" in said["E-wip"], said["E-wip"]
    assert "plugin oncall_rules noted: change size (paths=4)" in said["E-wip"]  # both notes kept
    # The freeze: the front waits on it, the head behind waits on the front.
    assert ": paused (slot holders: " in said["R2"], said["R2"]
    assert "now: waiting at the front of its queue (held: paused); 2 waiting" in said["R2"]
    assert (
        "now: waiting 2nd behind R2 (request 2) at the front (held: paused); 2 waiting"
        in said["R3"]
    ), said["R3"]
    assert "operator oncall ran pause: paused: release freeze" in said["R3"], said["R3"]

    # The queue pages: heads front first with why each waits, holders, last green.
    rows = re.findall(r'<tr class="head" data-position="(\d)">(.*?)</tr>', release_page)
    assert [p for p, _ in rows] == ["1", "2"]
    assert ">R2<" in rows[0][1] and "paused" in rows[0][1]
    assert ">R3<" in rows[1][1] and "behind the front" in rows[1][1]
    assert "Last refused" not in release_page and "none yet" in release_page  # no green yet
    facts = main_page.split('id="queue-facts"')[1].split("</table>")[0]
    assert re.search(r">B</code></a> for \d+s", facts), facts  # last green: commit, age
    main_rows = re.findall(r'<tr class="head" data-position="(\d)">(.*?)</tr>', main_page)
    assert len(main_rows) == 1 and "E-wip" in main_rows[0][1] and "embargoed" in main_rows[0][1]
    holders = main_page.split('id="holders"')[1].split("</table>")[0]
    assert ">C<" in holders and ">D<" in holders
    assert html.escape("plugin oncall_rules noted: embargoed (glob=*-wip)") in main_page
    assert "<th><code>embargo</code></th><td class=\"params\"><code>[*-wip]</code>" in main_page
    # status: last green with its age, per queue.
    assert re.search(r"mono/main: .*\n(?:    .*\n)*    last green: B for \d+s", status_text)

"""``explain`` on a real nats-server: the walkthrough's story, kept across a restart.

The seed's "Waiting for a slot" walkthrough runs on the service (real git ancestry); then
each head's decision trail is read back from the trail stream. A and F tell the same
story the simulated world's trail tells; B..E end superseded by a newer head; a second
service run on the same broker neither loses nor doubles a record.
"""

from __future__ import annotations

import yaml
from test_service_cli import ROOT, cli, tag  # noqa: F401
from test_service_support import Running, machines, running_service, wait_for

from stovepipe_fsm.adapters.git import GitSourceControlProvider
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.apps.service.connect import NatsOptions
from stovepipe_fsm.apps.service.demo import make_repository
from stovepipe_fsm.apps.service.export import export_format, export_timeline, render_timeline
from stovepipe_fsm.apps.service.operators import (
    explain_document,
    render_status,
    status_document,
)
from stovepipe_fsm.domain.trail_record import ADMITTED, ENDED, HELD, INGESTED, RECLAIMED, SUPERSEDED
from stovepipe_fsm.simulation.replay import simulate
from stovepipe_fsm.simulation.timeline import load_timeline

WALKTHROUGH = ROOT / "examples" / "walkthrough.yaml"
QUEUE = "monorepo/main"


def comparable(history: list[dict]) -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    """Kind and why, without what a run's clock and config decide (times, counts,
    sequence numbers, the hold delay among the parameters)."""
    out = []
    for record in history:
        why = {k: v for k, v in record["detail"].items() if k != "parameters"}
        out.append((record["kind"], why))
    return out


async def explain(js_env, request_id: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    options = NatsOptions(url=js_env.server.url, max_reconnect_attempts=3)
    return await explain_document(options, js_env.topology, request_id, "", "")


async def run_walkthrough(run: Running) -> dict[str, str]:
    ids = {"A": await run.ingest(QUEUE, "A")}
    await run.wait_state(ids["A"], "processing")
    for uri in "BCD":
        ids[uri] = await run.ingest(QUEUE, uri)

    async def held(uri: str) -> bool:
        return run.events.count("held", ids[uri]) >= 1

    await wait_for(lambda: held("D"), "D held")
    for uri in "EF":
        ids[uri] = await run.ingest(QUEUE, uri)
    for uri in "BCDE":
        await run.wait_state(ids[uri], "superseded")
    await wait_for(lambda: held("F"), "F held")
    # status, while F waits behind A: who holds the slot since when, what waits.
    doc = await status_document(run.service.js, run.service.topology)
    detail = doc["queue_details"][QUEUE]
    assert [h["id"] for h in detail["holders"]] == [ids["A"]]
    assert detail["holders"][0]["admitted_at_ms"] > 0
    assert detail["waiting"] == 1 and detail["oldest_waiting"]["uri"] == "F"
    assert detail["parameters"]["max_concurrent"] == 1
    assert detail["parameters"]["gate_wait_delay_ms"] == 200
    text = render_status(doc)
    assert f"holding: {ids['A']} for " in text and "waiting: 1, oldest F for " in text
    await run.pipeline.stages.record.complete(ids["A"], "succeeded")
    await run.wait_state(ids["F"], "processing")
    return ids


async def test_explain_tells_the_walkthrough_and_survives_a_restart(js_env, tmp_path) -> None:
    repo = make_repository(tmp_path / "repo")
    config = {"defaults": {"gate_wait_delay_ms": 200}, "queues": {QUEUE: {"repository": str(repo)}}}
    provider = GitSourceControlProvider({QUEUE: repo})
    async with running_service(js_env.server, js_env.topology, config, provider=provider) as run:
        ids = await run_walkthrough(run)
        stories = {uri: await explain(js_env, rid) for uri, rid in ids.items()}

    # The gate may finish A's end before record's second write (a slot reclaimed): a
    # record of its own, which the simulated world, recording in one step, never needs.
    a = [r for r in stories["A"]["history"] if r["kind"] != RECLAIMED]
    f = stories["F"]["history"]
    assert [r["kind"] for r in a] == [INGESTED, ADMITTED, ENDED]
    assert [r["kind"] for r in f] == [INGESTED, HELD, ADMITTED]
    assert f[1]["detail"]["reason"] == "gate_closed" and f[1]["detail"]["holders"] == ids["A"]
    assert f[2]["sentence"] == (
        "admitted: incremental_since_green build on A (descends from last green A); "
        f"green of {ids['A']} (0 newer green(s) not ancestors)"
    )
    for uri in "BCDE":
        history = stories[uri]["history"]
        assert history[0]["kind"] == INGESTED and history[-1]["kind"] == SUPERSEDED
        newer = history[-1]["detail"]["by"]
        assert newer > ids[uri] and newer in ids.values(), (uri, newer)
    assert all(r["policy"] == "" or isinstance(r["policy"], str) for r in a)

    # The simulated world's trail tells A's and F's story the same way.
    world = simulate(
        load_timeline(WALKTHROUGH), machines(), load_policy_store("config/queues.yaml")
    ).world
    assert world.trail is not None
    sim_ids = {r.uri: r.id for r in world.requests.snapshot()}
    for uri in "AF":
        simulated = [r.as_json() for r in await world.trail.history(sim_ids[uri])]
        live = [r for r in stories[uri]["history"] if r["kind"] != RECLAIMED]
        assert comparable(simulated) == comparable(live), uri

    # export: the run's ingests and outcomes as a timeline simulate replays.
    exported = await export_timeline(
        js_env.js, js_env.topology, since_ms=0, queue_glob="monorepo/*"
    )
    assert (exported.heads, exported.outcomes, exported.without_times) == (6, 1, 0)
    steps = exported.timeline["steps"]
    assert [s["ingest"]["uri"] for s in steps if isinstance(s, dict) and "ingest" in s] == list(
        "ABCDEF"
    )
    rows = {r["uri"]: r for r in (await status_document(js_env.js, js_env.topology))["requests"]}
    row_a = rows["A"]
    assert exported.timeline["builds"] == [
        {
            "uri": "A",
            "queue": QUEUE,
            "admitted_ms": row_a["admitted_at_ms"] - row_a["ingested_at_ms"],
            "duration_ms": row_a["ended_at_ms"] - row_a["admitted_at_ms"],
            "outcome": "succeeded",
        }
    ]
    assert exported.timeline["history"]["F"] == ["E"]
    path = tmp_path / "exported.yaml"
    path.write_text(yaml.safe_dump(exported.timeline, sort_keys=False))
    replayed = simulate(
        load_timeline(path), machines(), load_policy_store("config/queues.yaml")
    ).world
    ended = {r.uri: r.state for r in replayed.requests.snapshot()}
    # Replayed under the shipped policy (its own hold delay): A built and succeeded as it
    # did live; what became of B..F depends on that policy, which is whatif's business.
    assert ended["A"] == "succeeded" and sorted(ended) == list("ABCDEF")
    # The same export as JSON lines (chosen by the file name) replays the same.
    lines = tmp_path / "exported.jsonl"
    lines.write_text(render_timeline(exported.timeline, export_format(None, str(lines))))
    assert lines.read_text().startswith('{"timeline": 1, ')
    again = simulate(load_timeline(lines), machines(), load_policy_store("config/queues.yaml"))
    assert {r.uri: r.state for r in again.world.requests.snapshot()} == ended

    # A second service on the same broker: every record still there, none doubled.
    async with running_service(js_env.server, js_env.topology, config, provider=provider) as run:
        await run.pipeline.stages.record.complete(ids["F"], "succeeded")
        await run.wait_state(ids["F"], "succeeded")
        after = {uri: await explain(js_env, rid) for uri, rid in ids.items()}
    for uri in "ABCDE":
        assert after[uri]["history"] == stories[uri]["history"], uri
    assert [r["kind"] for r in after["F"]["history"]] == [INGESTED, HELD, ADMITTED, ENDED]


def test_export_with_a_bad_since_exits_2(nats_server, tag) -> None:  # noqa: F811
    done = cli("export", "--since", "last tuesday", "--nats", nats_server.url)
    assert done.returncode == 2
    assert "neither an ISO time" in done.stderr


def test_explain_of_an_unknown_request_exits_2(nats_server, tag) -> None:  # noqa: F811
    done = cli("explain", "request/nowhere/9", "--nats", nats_server.url, "--topology-tag", tag)
    assert done.returncode == 2, done.stderr
    assert "no request 'request/nowhere/9'" in done.stderr
    bad = cli("explain", "--nats", nats_server.url, "--topology-tag", tag)
    assert bad.returncode == 2 and "give a REQUEST_ID" in bad.stderr

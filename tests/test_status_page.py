"""The status page without a browser: the HTML of hostile strings, the overview's order,
filter and pages at 1,000 queues (its render time is printed), the latest-records read
of the trail on a real nats-server, and the HTTP side (read-only methods, the security
policy, the request view, the diagrams with and without Graphviz) on a running service.

The browser tests (tests/browser, ``make test-browser``) load the same pages in Chromium.
"""

from __future__ import annotations

import asyncio
import dataclasses
import html
import re
import time
import urllib.error
import urllib.request
from typing import Any

import nats.js.errors
import pytest
from test_service_support import running_service, wait_for

from stovepipe_fsm.adapters.jetstream.bulk import kv_snapshot
from stovepipe_fsm.adapters.jetstream.decision_trail import JetStreamTrail
from stovepipe_fsm.adapters.jetstream.server import free_port
from stovepipe_fsm.apps.service import http as http_module
from stovepipe_fsm.apps.service import status_page
from stovepipe_fsm.apps.service.http import HttpEndpoint
from stovepipe_fsm.apps.service.pauses import pause
from stovepipe_fsm.apps.service.status_page import StatusPage
from stovepipe_fsm.domain.trail_record import HELD, INGESTED, SUPERSEDED, TrailRecord, detail
from stovepipe_fsm.views import page

HOSTILE = "<script>window.pwned=1</script>\"'&"
QUEUE = "team/app"
CONFIG = {"defaults": {"gate_wait_delay_ms": 100}}


def _doc(queues: int, *, hostile: bool = False) -> dict[str, Any]:
    """A ``status`` document of ``queues`` queues; every seventh holds a slot and has
    two heads waiting, every eleventh is paused."""
    names = [f"q/{i:04d}" for i in range(queues)]
    if hostile:
        names[0] = "team/<script"
    details, rows = {}, []
    for i, name in enumerate(names):
        busy = i % 7 == 0
        details[name] = {
            "parameters": {"max_concurrent": 1, "paused": i % 11 == 0},
            "holders": [{"id": f"request/{name}/1", "admitted_at_ms": 1_000}] if busy else [],
            "waiting": 2 if busy else 0,
            "oldest_waiting": (
                {"id": f"request/{name}/2", "uri": HOSTILE if hostile else "B", "ingested_at_ms": 1}
                if busy
                else None
            ),
        }
        rows.append(
            {
                "name": name,
                "in_flight_count": int(busy),
                "last_green_uri": "",
                "latest_request_id": "",
            }
        )
    return {
        "requests": [],
        "queues": rows,
        "slot_holders": {},
        "queue_details": details,
        "policy": {"hash": "cafe", "loaded_at_ms": 0, "replica": "r"},
        "pauses": [{"pattern": "q/*", "at_ms": 1, "reason": HOSTILE, "by": HOSTILE}],
    }


def test_every_user_string_lands_escaped() -> None:
    doc = _doc(3, hostile=True)
    views = page.queue_views(doc, {"team/<script": {"request/team/<script/1": 9_000}}, {})
    record = TrailRecord(INGESTED, "team/<script", "request/team/<script/2", 5, detail(uri=HOSTILE))
    out = page.render_overview(doc, views, [record], page.Selection(), now_ms=10_000)
    assert "<script" not in out.replace("&lt;script", "")
    assert html.escape(HOSTILE, quote=True) in out  # the uri, the pause reason and who
    filtered = page.render_overview(doc, views, [], page.Selection(HOSTILE), now_ms=10_000)
    assert f'value="{html.escape(HOSTILE, quote=True)}"' in filtered
    assert "<script" not in filtered.replace("&lt;script", "")
    assert "team/&lt;script" in out
    assert 'href="/request/request/team/%3Cscript/1"' in out
    assert "lease expires 1970-01-01T00:00:09.000Z (1s ago)" in out
    history = {
        "request": {
            "id": "request/team/<script/2",
            "queue": "team/<script",
            "uri": HOSTILE,
            "state": "accepted",
        },
        "history": [{**record.as_json(), "sentence": f"ingested {HOSTILE}"}],
    }
    shown = page.render_request("request/team/<script/2", history, "cafe")
    assert "<script" not in shown.replace("&lt;script", "")
    diagram = page.Diagram("request", "", f"stateDiagram-v2\n  a : {HOSTILE}", "no SVG: x")
    assert "<script" not in page.render_policy("cafe", "", [diagram]).replace("&lt;script", "")


def test_the_queue_page_lists_heads_front_first_and_parameters_as_a_table() -> None:
    doc = _doc(1)
    name = "q/0000"
    doc["queues"][0]["last_green_uri"] = "4f2a9c1e0b7d3a5c6e8f90a1b2c3d4e5f6a7b8c9"
    doc["queue_details"][name]["last_green"] = {
        "uri": "4f2a9c1e0b7d3a5c6e8f90a1b2c3d4e5f6a7b8c9",
        "request_id": f"request/{name}/1",
        "at_ms": 10_000 - 180_000,
    }
    doc["queue_details"][name]["parameters"]["full_build_paths"] = ["WORKSPACE", HOSTILE]
    [view] = page.queue_views(doc, {}, {})
    doc["requests"] = [{"id": f"request/{name}/3", "queue": name, "uri": "C"}]
    superseded = TrailRecord(
        SUPERSEDED, name, f"request/{name}/2", 9_000, detail(by=f"request/{name}/3")
    )
    overview = page.render_overview(
        doc, [view], [superseded], page.Selection(), now_ms=10_000
    )
    assert "superseded by C (request 3) (never built)" in overview  # in commit terms
    assert f'href="/queue/{name}"' in overview
    assert "4f2a9c1e0b</code></a> for 3m" in overview  # last green: commit and age
    assert "False" not in overview and "paused=true" in overview  # YAML, not reprs
    assert "full_build_paths: 2" in overview  # a list by its length; whole on its page
    heads = [
        page.HeadView(1, f"request/{name}/2", "B", "accepted", 4_000, "paused", 3),
        page.HeadView(2, f"request/{name}/3", HOSTILE, "accepted", 7_000),
    ]
    held = TrailRecord(HELD, name, f"request/{name}/2", 9_000, detail(reason="paused"))
    out = page.render_queue(
        view, heads, [held], "cafe", commits={f"request/{name}/1": "A"}, now_ms=10_000
    )
    assert re.findall(r'class="head" data-position="(\d+)"', out) == ["1", "2"]
    assert "paused <span class=\"muted\">(3 times)</span>" in out
    assert "behind the front (not delivered yet)" in out
    assert "<th><code>paused</code></th><td class=\"params\"><code>true</code>" in out
    assert "<code>[WORKSPACE, &lt;script&gt;" in out
    assert "<script" not in out.replace("&lt;script", "")
    assert 'id="queue-decisions"' in out and "held once: paused" in out


def test_the_policy_page_shows_the_config_the_loads_and_the_refused_edit() -> None:
    in_force = page.PolicyInForce(
        "machines", "config/queues.yaml", f"queues: {{}}  # {HOSTILE}\n", 60_000, 120_000,
        "config", "queues.yaml:3:18: max_concurrent: -1 is less than 1", 180_000, True,
    )
    out = page.render_policy("cafe", "", [], in_force)
    assert 'id="refused" data-now="true"' in out
    assert "Last refused edit (config) at 1970-01-01T00:03:00.000Z, still on disk" in out
    assert "queues.yaml:3:18: max_concurrent: -1 is less than 1" in out
    assert "loaded <span class=\"when\">1970-01-01T00:01:00.000Z</span>" in out
    assert '<pre id="config">queues: {}  # &lt;script&gt;' in out
    assert "<script" not in out.replace("&lt;script", "")
    quiet = page.render_policy("cafe", "", [], dataclasses.replace(in_force, refused_part=""))
    assert "No edit refused since start." in quiet


def test_a_lease_shows_its_expiry_relative_to_now() -> None:
    doc = _doc(1)
    views = page.queue_views(doc, {"q/0000": {"request/q/0000/1": 40_000}}, {})
    out = page.render_overview(doc, views, [], page.Selection(), now_ms=10_000)
    assert "lease expires 1970-01-01T00:00:40.000Z (in 30s)" in out


def test_a_thousand_queues_page_busy_first_and_filtered(capsys) -> None:  # type: ignore[no-untyped-def]
    doc = _doc(1000)
    paused_by = {q["name"]: "q/*" for q in doc["queues"][:1]}
    started = time.perf_counter()
    views = page.queue_views(doc, {}, paused_by)
    out = page.render_overview(doc, views, [], page.Selection(), now_ms=10_000)
    took_ms = (time.perf_counter() - started) * 1000
    with capsys.disabled():
        print(f"\nstatus page: 1,000 queues rendered in {took_ms:.1f} ms ({len(out)} bytes)")
    shown = re.findall(r'data-queue="([^"]+)"', out)
    assert len(shown) == page.PAGE_SIZE
    # Paused (every 11th), holding (every 7th) first, by name; then the idle ones.
    needing = sorted(v.name for v in views if v.needs_a_look)
    assert shown == needing[: page.PAGE_SIZE]
    assert "1000 queue(s)" in out and "page 1 of 20" in out
    assert 'href="/?page=2"' in out
    last = page.render_overview(doc, views, [], page.Selection(page=99), now_ms=10_000)
    assert "page 20 of 20" in last and len(re.findall(r"data-queue=", last)) == 50
    only = page.render_overview(doc, views, [], page.Selection("q/099"), now_ms=10_000)
    busy = {"q/0990", "q/0994"}  # 990 = 11 * 90 is paused, 994 = 7 * 142 holds a slot
    expected = sorted(busy) + sorted({f"q/099{i}" for i in range(10)} - busy)
    assert re.findall(r'data-queue="([^"]+)"', only) == expected
    assert "10 of 1000 match" in only


def test_the_query_string_picks_the_page_and_filter_and_refuses_nothing() -> None:
    assert page.Selection.from_query({"q": [" team "], "page": ["3"]}) == page.Selection("team", 3)
    assert page.Selection.from_query({"page": ["-2"]}).page == 1
    assert page.Selection.from_query({"page": ["x"]}).page == 1


def test_the_security_policy_allows_no_script_and_nothing_remote() -> None:
    policy = page.content_security_policy()
    assert policy.startswith("default-src 'none';")
    assert "script-src" not in policy and "http" not in policy and "*" not in policy
    assert "unsafe" not in policy


async def test_latest_reads_the_newest_records_across_requests_bounded(js_env) -> None:  # type: ignore[no-untyped-def]
    trail = JetStreamTrail(js_env.js, js_env.topology)
    assert await trail.latest(5) == []
    for n in range(1, 8):
        await trail.append(TrailRecord(INGESTED, "q", f"request/q/{n}", n, tag="1"))
    # Eight holds of one request for one reason are one record (rolled up): the stream
    # has gaps where the earlier holds were.
    for at in range(100, 108):
        await trail.append(TrailRecord(HELD, "q", "request/q/1", at, tag="gate_closed"))
    newest = await trail.latest(3)
    assert [(r.kind, r.request_id) for r in newest] == [
        (HELD, "request/q/1"),
        (INGESTED, "request/q/7"),
        (INGESTED, "request/q/6"),
    ]
    assert newest[0].count == 8
    assert len(await trail.latest(100)) == 8
    # A window of the last two sequences holds one record (the other is a gap): the
    # read widens to the next window for the other two.
    assert await trail.latest(3, windows=(2, 100)) == newest
    # ... unless that takes more messages than allowed: then the newest found so far.
    assert [r.kind for r in await trail.latest(3, windows=(2, 100), max_messages=3)] == [HELD]
    info = await js_env.js.stream_info(js_env.topology.trail_stream)
    assert info.state.consumer_count == 0  # every read's consumer is gone


def _request(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], str]:
    call = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(call, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


async def fetch(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], str]:
    return await asyncio.to_thread(_request, port, path, method)


async def test_the_page_on_a_running_service(js_env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    js, topology = js_env.js, js_env.topology
    async with running_service(js_env.server, topology, CONFIG) as run:
        http = await HttpEndpoint(run.service, free_port()).start()
        try:
            a = await run.ingest(QUEUE, "A")
            await run.wait_state(a, "processing")
            b = await run.ingest(QUEUE, HOSTILE)
            status, headers, body = await fetch(http.port, "/")
            assert status == 200 and headers["Content-Type"].startswith("text/html")
            assert headers["Content-Security-Policy"] == page.content_security_policy()
            assert 'data-queue="team/app"' in body and f"/request/{a}" in body
            assert "<script>window" not in body

            for method in ("POST", "PUT", "DELETE", "PATCH"):
                status, headers, _ = await fetch(http.port, "/", method)
                assert status == 405 and headers["Allow"] == "GET, HEAD", method
            status, headers, body = await fetch(http.port, "/", "HEAD")
            assert status == 200 and body == "" and int(headers["Content-Length"]) > 0

            await pause(js, topology, QUEUE, reason="incident")

            async def shown_paused() -> bool:
                return 'data-paused="true"' in (await fetch(http.port, "/"))[2]

            await wait_for(shown_paused, "the page shows the pause", timeout=5)

            status, _, body = await fetch(http.port, "/queue/team/app")
            assert status == 200 and 'class="head" data-position="1"' in body
            assert f"/request/{b}" in body and 'id="parameters"' in body
            assert (await fetch(http.port, "/queue/no/such"))[0] == 404
            status, _, body = await fetch(http.port, "/card")
            assert status == 200 and "every other queue" in body
            assert "gate_wait_delay_ms</code></th><td class=\"params\"><code>100" in body

            status, _, body = await fetch(http.port, f"/request/{b}")
            assert status == 200 and 'id="history"' in body and "ingested &lt;script&gt;" in body
            status, _, body = await fetch(http.port, "/request/request/team/app/99")
            assert status == 404 and "no request" in body

            status, _, body = await fetch(http.port, "/policy")
            assert status == 200 and 'id="machine-queue_gate"' in body
            assert 'id="machine-culprit"' in body  # the shipped policy's search machine
            if _graphviz_here():
                assert "<svg" in body
            else:  # drawn without Graphviz: each machine's source as text, saying why
                assert "<svg" not in body and "needs the Graphviz &#x27;dot&#x27;" in body
                assert 'class="mermaid-source">stateDiagram-v2' in body

            def no_dot() -> str:
                raise status_page.DiagramError("no Graphviz here")

            monkeypatch.setattr(status_page, "find_dot", no_dot)
            fallback = await StatusPage(run.service).policy()
            assert "<svg" not in fallback and "no SVG: no Graphviz here" in fallback
            assert 'class="mermaid-source">stateDiagram-v2' in fallback
        finally:
            await http.close()


def _graphviz_here() -> bool:
    """Whether Graphviz's ``dot`` is on PATH, which the page draws its SVG with."""
    try:
        status_page.find_dot()
    except status_page.DiagramError:
        return False
    return True


@pytest.mark.parametrize("path", ["/metrics", "/healthz"])
def test_the_other_endpoints_are_not_page_routes(path: str) -> None:
    assert not StatusPage.serves(path)
    assert StatusPage.serves("/") and StatusPage.serves("/request/request/q/1")


async def test_a_connection_that_asks_nothing_is_closed_unanswered(js_env) -> None:  # type: ignore[no-untyped-def]
    """A browser opens spare connections and sends its next request on one of them: an
    answer written there before any request would be read as that request's reply."""
    limits = http_module.HttpLimits(read_deadline_s=0.2)
    async with running_service(js_env.server, js_env.topology, CONFIG) as run:
        http = await HttpEndpoint(run.service, free_port(), limits=limits).start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", http.port)
            await asyncio.sleep(0.5)  # past the read timeout, without a request
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()
            status, _, _ = await fetch(http.port, "/healthz")
            assert status == 200
        finally:
            await http.close()


async def test_a_bucket_snapshot_reads_what_the_key_by_key_listing_reads(js_env) -> None:  # type: ignore[no-untyped-def]
    js, bucket = js_env.js, js_env.topology.service_bucket
    kv = await js.key_value(bucket)
    for n in range(300):
        await kv.put(f"queue.k{n}", f"v{n}".encode())
    await kv.put("queue.k1", b"again")  # a later value of one key
    await kv.delete("queue.k2")
    await kv.put("queue.empty", b"")
    await kv.put("other", b"x")
    listed = []  # a get per key written (the client's own key listing races: see bulk.py)
    for key in [*(f"queue.k{n}" for n in range(300)), "queue.empty", "other"]:
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            continue  # deleted
        if entry.value:
            listed.append((key, entry.value))
    snapshot = await kv_snapshot(js, bucket)
    assert sorted(snapshot) == sorted(listed)
    assert ("queue.k1", b"again") in snapshot and not any(k == "queue.k2" for k, _ in snapshot)
    assert len(await kv_snapshot(js, bucket, "queue.>")) == 299  # k2 deleted, empty left out
    assert await kv_snapshot(js, "no-such-bucket") == []

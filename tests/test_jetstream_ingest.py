"""Ingest on a real broker: its round trips, the batch path, and concurrent ingesters.

The single-head path is counted in sequential round trips: a round starts when a request
goes out while none is in flight, so operations sent side by side count once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from nats.aio.client import Client
from nats_server import JsEnv, close, connect
from test_service_cli import cli, status, tag  # noqa: F401

from stovepipe_fsm.adapters.jetstream import JetStreamPublisher, open_kv_stores
from stovepipe_fsm.adapters.jetstream.decision_trail import JetStreamTrail
from stovepipe_fsm.adapters.memory import ManualClock
from stovepipe_fsm.domain.ids import parse_request_id
from stovepipe_fsm.pipeline.ingest import Head, Ingest

Q = "mono/main"


async def ingest_on(nc: Client, js_env: JsEnv) -> Ingest:
    js = nc.jetstream()
    stores = await open_kv_stores(js, js_env.topology)
    return Ingest(
        initial_state="accepted",
        requests=stores.requests,
        queues=stores.queues,
        publisher=JetStreamPublisher(js, js_env.topology),
        uri_index=stores.uris,
        counter=stores.counters,
        clock=ManualClock(1_000),
        trail=JetStreamTrail(js, js_env.topology),
    )


class Rounds:
    """Sequential round trips of one connection: requests sent while none was in flight."""

    def __init__(self, nc: Client) -> None:
        self.rounds = self.requests = self._in_flight = 0
        request = nc.request

        async def counted(subject: str, *args: Any, **kwargs: Any) -> Any:
            if self._in_flight == 0:
                self.rounds += 1
            self._in_flight += 1
            self.requests += 1
            try:
                return await request(subject, *args, **kwargs)
            finally:
                self._in_flight -= 1

        nc.request = counted  # type: ignore[method-assign]

    def reset(self) -> None:
        self.rounds = self.requests = 0


def counter_of(request_id: str) -> int:
    return parse_request_id(request_id).counter


async def stream_messages(js_env: JsEnv) -> int:
    info = await js_env.js.stream_info(js_env.topology.process_stream)
    return info.state.messages


async def test_a_new_head_takes_four_sequential_round_trips(js_env: JsEnv) -> None:
    ingest = await ingest_on(js_env.nc, js_env)
    rounds = Rounds(js_env.nc)
    await ingest.ingest(Q, "A")  # the first mints on a counter it has not seen yet
    rounds.reset()
    result = await ingest.ingest(Q, "B")
    assert result.created and result.published
    # mint + queue row | claim | request + latest + trail | publish
    assert rounds.rounds == 4
    assert rounds.requests == 7
    row = await ingest.queues.get(Q)
    assert row.latest_request_id == result.request_id
    assert (await ingest.requests.get(result.request_id)).uri == "B"
    assert await stream_messages(js_env) == 2


async def test_a_known_head_mints_nothing_when_remembered_and_only_a_gap_when_not(
    js_env: JsEnv,
) -> None:
    first = await ingest_on(js_env.nc, js_env)
    made = await first.ingest(Q, "A")
    again = await first.ingest(Q, "A")
    assert (again.request_id, again.created) == (made.request_id, False)
    assert await first.counter.peek(Q) == 1  # type: ignore[attr-defined]
    # Another ingester has not seen A: it mints before it learns, and that value is spent.
    other = await ingest_on(js_env.nc, js_env)
    assert (await other.ingest(Q, "A")).request_id == made.request_id
    newer = await other.ingest(Q, "B")
    assert counter_of(newer.request_id) == 3
    assert (await other.queues.get(Q)).latest_request_id == newer.request_id


async def test_a_batch_with_duplicates_ingests_each_head_once_in_listed_order(
    js_env: JsEnv,
) -> None:
    ingest = await ingest_on(js_env.nc, js_env)
    await ingest.ingest(Q, "known")
    heads = [Head(Q, u) for u in ("A", "B", "A", "known", "C")] + [Head("other/q", "A")]
    results = await ingest.ingest_many(heads, window=2)
    ids = [r.request_id for r in results]
    assert ids[0] == ids[2] and len(set(ids)) == 5
    assert [r.created for r in results] == [True, True, True, False, True, True]
    fresh = [counter_of(ids[i]) for i in (0, 1, 4)]
    assert fresh == sorted(fresh) and fresh[0] > 1  # in listed order, after "known"
    assert (await ingest.queues.get(Q)).latest_request_id == ids[4]
    assert (await ingest.queues.get("other/q")).latest_request_id == ids[5]
    for head, request_id in zip(heads, ids, strict=True):
        assert (await ingest.requests.get(request_id)).uri == head.uri
        assert await ingest.uri_index.get(head.queue, head.uri) == request_id
    # One message per head: known's republish carries its id, so the broker drops it.
    assert await stream_messages(js_env) == 5
    trail = await ingest.trail.history(ids[1])  # type: ignore[union-attr]
    assert [r.kind for r in trail] == ["ingested"]


async def test_two_batch_ingesters_into_one_queue_agree_on_every_head(js_env: JsEnv) -> None:
    nc2 = await connect(js_env.server)
    try:
        one, two = await ingest_on(js_env.nc, js_env), await ingest_on(nc2, js_env)
        uris = [f"c{n:03d}" for n in range(60)]
        batch_one = [Head(Q, u) for u in uris[:40]]
        batch_two = [Head(Q, u) for u in uris[20:]]  # 20 heads in both batches
        got_one, got_two = await asyncio.gather(
            one.ingest_many(batch_one, window=8), two.ingest_many(batch_two, window=8)
        )
    finally:
        await close(nc2)
    by_uri: dict[str, str] = {}
    for heads, results in ((batch_one, got_one), (batch_two, got_two)):
        for head, result in zip(heads, results, strict=True):
            assert by_uri.setdefault(head.uri, result.request_id) == result.request_id
        created = [counter_of(r.request_id) for r in results if r.created]
        assert created == sorted(created)  # each ingester's new heads in its listed order
    assert len(by_uri) == 60 and len(set(by_uri.values())) == 60  # one id per head, no reuse
    created_total = sum(r.created for r in got_one) + sum(r.created for r in got_two)
    assert created_total == 60
    for uri, request_id in by_uri.items():
        assert (await one.requests.get(request_id)).uri == uri
        assert await one.uri_index.get(Q, uri) == request_id
    newest = max(by_uri.values(), key=counter_of)
    assert (await one.queues.get(Q)).latest_request_id == newest


@pytest.fixture
def heads_file(tmp_path) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    def write(*lines: str) -> str:
        path = tmp_path / "heads.jsonl"
        path.write_text("".join(f"{line}\n" for line in lines))
        return str(path)

    yield write


def test_ingest_from_a_file_reports_each_head(nats_server, tag, heads_file) -> None:  # noqa: F811
    path = heads_file(
        json.dumps({"queue": "team/app", "uri": "A"}),
        "",
        json.dumps({"queue": "team/app", "uri": "B", "parents": ["A"], "at_head": True}),
        json.dumps({"queue": "team/app", "uri": "A"}),
    )
    common = ["--nats", nats_server.url, "--topology-tag", tag]
    done = cli("ingest", *common, "--from", path)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(x["uri"], x["created"]) for x in lines] == [("A", True), ("B", True), ("A", True)]
    assert lines[0]["request_id"] == lines[2]["request_id"]
    doc = status(nats_server.url, tag)
    assert sorted(r["uri"] for r in doc["requests"]) == ["A", "B"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "heads.jsonl:2: not JSON"),
        ('{"queue": "team/app"}', "heads.jsonl:2: 'uri' must be a string"),
        ('{"queue": "team/app", "uri": "B", "colour": 1}', "heads.jsonl:2: unknown key(s) colour"),
        ('{"queue": "team/app", "uri": "has space"}', "heads.jsonl:2: uri 'has space'"),
        ('{"queue": "/bad//", "uri": "B"}', "heads.jsonl:2:"),
    ],
)
def test_a_bad_line_exits_2_with_its_number_and_writes_nothing(
    nats_server,
    tag,  # noqa: F811
    heads_file,
    line: str,
    message: str,
) -> None:
    path = heads_file(json.dumps({"queue": "team/app", "uri": "A"}), line)
    common = ["--nats", nats_server.url, "--topology-tag", tag]
    done = cli("ingest", *common, "--from", path)
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stdout == ""
    listed = cli("status", "--json", *common)  # no topology either: nothing was written
    assert listed.returncode != 0 or json.loads(listed.stdout)["requests"] == []

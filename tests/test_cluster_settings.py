"""Settings for clustered deployment, on one real broker: replica and retention checks of
the topology, consumer updates, seed lists, the ack-wait heartbeat and prune."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
from nats.js import api
from nats_server import JsEnv, delete_topology, unique_tag
from test_service_cli import cli
from test_service_support import FAST, running_service, wait_for

from stovepipe_fsm.adapters.jetstream import Topology, TopologyMismatch, ensure_topology
from stovepipe_fsm.adapters.jetstream.bulk import kv_entries
from stovepipe_fsm.adapters.jetstream.decision_trail import JetStreamTrail
from stovepipe_fsm.adapters.jetstream.delivery import JetStreamDelivery
from stovepipe_fsm.adapters.jetstream.durable_consumer import ensure_pull_consumer
from stovepipe_fsm.adapters.jetstream.names import request_key as request_key_of
from stovepipe_fsm.adapters.jetstream.names import uri_key
from stovepipe_fsm.adapters.jetstream.prune import _purge_markers, prune_terminal_requests
from stovepipe_fsm.adapters.jetstream.server import free_port
from stovepipe_fsm.adapters.jetstream.topology import BucketSpec, StreamSpec
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.service.arguments import (
    parse_duration,
    parse_size,
    topology_args,
    topology_of,
)
from stovepipe_fsm.apps.service.broker_pipeline import open_pipeline
from stovepipe_fsm.apps.service.connect import NatsOptions, connect, seed_urls
from stovepipe_fsm.apps.service.keepalive import KeptAlive
from stovepipe_fsm.domain.culprit_search import CulpritSearch, Probe
from stovepipe_fsm.domain.ids import format_request_id
from stovepipe_fsm.domain.settle import Attempt
from stovepipe_fsm.domain.trail_record import INGESTED, TrailRecord, detail
from stovepipe_fsm.process.catalog import load_process_machines

# -- topology: replicas and retention are checked, never silently ignored -------------


async def test_a_replica_count_differing_from_the_existing_topology_is_an_error(
    js_env: JsEnv,
) -> None:
    wider = Topology.isolated(js_env.topology.prefix.split("-", 1)[1], replicas=3)
    assert wider.stream_names() == js_env.topology.stream_names()
    with pytest.raises(TopologyMismatch) as caught:
        await ensure_topology(js_env.js, wider)
    text = str(caught.value)
    assert js_env.topology.process_stream in text
    assert "replicas: have 1, want 3" in text
    assert "left unchanged" in text
    info = await js_env.js.stream_info(js_env.topology.process_stream)
    assert info.config.num_replicas == 1  # nothing was modified


def test_several_differences_are_listed_in_the_order_the_fields_are_checked() -> None:
    """Storage, then what the stream or bucket itself needs, then replicas."""
    stream = StreamSpec(
        "s", ("a.>",), api.RetentionPolicy.LIMITS, api.StorageType.FILE, 3, 120.0,
        allow_rollup=True,
    )
    actual = api.StreamConfig(
        name="s", subjects=["a.>"], retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.MEMORY, num_replicas=1, allow_rollup_hdrs=False,
        duplicate_window=120,
    )
    assert stream.differences(actual) == [
        "storage: have memory, want file",
        "allow_rollup_hdrs: have false, want true (held records roll up)",
        "replicas: have 1, want 3",
    ]
    bucket = BucketSpec("b", api.StorageType.FILE, 3, history=1)
    actual = api.StreamConfig(
        name="KV_b", storage=api.StorageType.MEMORY, num_replicas=1, max_msgs_per_subject=0
    )
    assert bucket.differences(actual) == [
        "storage: have memory, want file",
        "history: have 0, want 1",
        "replicas: have 1, want 3",
    ]


async def test_a_bucket_with_another_replica_count_is_a_difference(js_env: JsEnv) -> None:
    wider = Topology.isolated(js_env.topology.prefix.split("-", 1)[1], replicas=3)
    for spec in wider.bucket_specs():
        info = await js_env.js.stream_info(f"KV_{spec.name}")
        assert spec.differences(info.config) == ["replicas: have 1, want 3"]
    for spec in js_env.topology.bucket_specs():
        info = await js_env.js.stream_info(f"KV_{spec.name}")
        assert spec.differences(info.config) == []


async def test_dead_letter_retention_is_applied_and_then_checked(js_env: JsEnv) -> None:
    topology = Topology.isolated(unique_tag(), dead_letter_max_age_s=3 * 86400.0)
    try:
        await ensure_topology(js_env.js, topology)
        info = await js_env.js.stream_info(topology.dead_letter_stream)
        assert info.config.max_age == pytest.approx(3 * 86400.0)
        # The same settings again: fine. Another age (or none): a clear mismatch.
        await ensure_topology(js_env.js, topology)
        forever = Topology.isolated(topology.prefix.split("-", 1)[1])
        with pytest.raises(TopologyMismatch, match="max_age: have 259200s, want unlimited"):
            await ensure_topology(js_env.js, forever)
    finally:
        await delete_topology(js_env.js, topology)


async def test_the_trail_keeps_within_its_byte_bound_by_discarding_its_oldest(
    js_env: JsEnv,
) -> None:
    info = await js_env.js.stream_info(js_env.topology.trail_stream)
    assert info.config.max_bytes == 1 << 30  # the default bound
    assert info.config.discard == api.DiscardPolicy.OLD
    topology = Topology.isolated(unique_tag(), trail_max_bytes=1 << 20)
    try:
        await ensure_topology(js_env.js, topology)
        trail = JetStreamTrail(js_env.js, topology)
        note = "x" * 1000
        for n in range(1, 1501):  # about 1.7 MB of records
            request = format_request_id("q", n)
            await trail.append(TrailRecord(INGESTED, "q", request, n, detail=detail(note=note)))
        info = await js_env.js.stream_info(topology.trail_stream)
        assert info.config.max_bytes == 1 << 20
        assert 0 < info.state.bytes <= 1 << 20
        assert await trail.history(format_request_id("q", 1)) == []  # the oldest: discarded
        newest = await trail.history(format_request_id("q", 1500))
        assert [r.at_ms for r in newest] == [1500]
    finally:
        await delete_topology(js_env.js, topology)


def test_trail_bound_from_the_command_line() -> None:
    parser = argparse.ArgumentParser()
    topology_args(parser)
    parser.add_argument("--topology-tag", default="")
    assert topology_of(parser.parse_args([])).trail_max_bytes == 1 << 30
    given = parser.parse_args(["--retain-trail-bytes", "256MiB"])
    assert topology_of(given).trail_max_bytes == 256 << 20
    assert parse_size("4096") == 4096 and parse_size("2 GiB") == 2 << 30
    for bad in ("", "1GB", "-1", "0", "1.5GiB", "lots"):
        with pytest.raises(ValueError):
            parse_size(bad)
    done = cli("serve", "--retain-trail-bytes", "lots")
    assert done.returncode == 2 and "not a size" in done.stderr
    with pytest.raises(ValueError, match="at least 1048576"):
        Topology(trail_max_bytes=4096)


async def test_build_and_hook_ages_edited_by_an_operator_are_left_alone(js_env: JsEnv) -> None:
    info = await js_env.js.stream_info(js_env.topology.hooks_stream)
    info.config.max_age = 30 * 86400.0
    await js_env.js.update_stream(info.config)
    report = await ensure_topology(js_env.js, js_env.topology)
    assert js_env.topology.hooks_stream in report.existing_streams


# -- consumers follow the configured settings ---------------------------------------


async def test_an_existing_consumer_is_updated_to_the_configured_ack_wait(js_env: JsEnv) -> None:
    stream = js_env.topology.process_stream

    def config(ack_wait: float) -> api.ConsumerConfig:
        return api.ConsumerConfig(
            durable_name="process-q",
            name="process-q",
            filter_subject=js_env.topology.process_subject("q"),
            ack_policy=api.AckPolicy.EXPLICIT,
            max_ack_pending=1,
            max_deliver=-1,
            ack_wait=ack_wait,
        )

    await ensure_pull_consumer(js_env.js, stream, config(30.0))
    assert (await js_env.js.consumer_info(stream, "process-q")).config.ack_wait == 30.0
    await ensure_pull_consumer(js_env.js, stream, config(4.0))
    assert (await js_env.js.consumer_info(stream, "process-q")).config.ack_wait == 4.0
    await ensure_pull_consumer(js_env.js, stream, config(4.0))  # unchanged: no update needed
    assert (await js_env.js.consumer_info(stream, "process-q")).config.ack_wait == 4.0


# -- seeds ------------------------------------------------------------------------------


def test_seed_lists_are_split_and_an_empty_entry_is_refused() -> None:
    assert seed_urls("nats://a:1, nats://b:2") == ["nats://a:1", "nats://b:2"]
    assert NatsOptions(url="nats://a:1").servers == ["nats://a:1"]
    with pytest.raises(ValueError, match="none empty"):
        seed_urls("nats://a:1,,nats://b:2")


async def test_a_dead_seed_does_not_stop_the_connection(js_env: JsEnv) -> None:
    dead = f"nats://127.0.0.1:{free_port()}"
    for url in (f"{dead},{js_env.server.url}", f"{js_env.server.url},{dead}"):
        nc = await connect(
            NatsOptions(url=url, max_reconnect_attempts=1, first_connect_timeout_s=10)
        )
        try:
            assert nc.is_connected
        finally:
            await nc.close()


def test_durations() -> None:
    assert parse_duration("90") == 90.0
    assert parse_duration("15m") == 900.0
    assert parse_duration("7d") == 7 * 86400.0
    assert parse_duration("1.5h") == 5400.0
    for bad in ("", "7 days", "-1s", "0s", "d"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_serve_reports_a_replica_mismatch_and_exits(nats_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    tag = unique_tag()
    common = ["--nats", nats_server.url, "--topology-tag", tag]
    try:
        done = cli("ingest", *common, "--queue", "q", "--uri", "A")
        assert done.returncode == 0, done.stderr
        done = cli("serve", *common, "--replicas", "3")
        assert done.returncode == 1
        assert "TopologyMismatch" in done.stderr
        assert "replicas: have 1, want 3" in done.stderr
        done = cli("ingest", *common, "--queue", "q", "--uri", "B", "--replicas", "3")
        assert done.returncode == 1 and "replicas: have 1, want 3" in done.stderr
    finally:

        async def cleanup() -> None:
            from nats_server import connect as test_connect

            nc = await test_connect(nats_server)
            try:
                await delete_topology(nc.jetstream(), Topology.isolated(tag))
            finally:
                await nc.close()

        asyncio.run(cleanup())


def test_bad_replica_and_ack_wait_settings_are_usage_errors() -> None:
    done = cli("serve", "--replicas", "0")
    assert done.returncode == 2 and "replica count" in done.stderr
    done = cli("serve", "--ack-wait", "soon")
    assert done.returncode == 2 and "not a duration" in done.stderr
    env = {**os.environ, "STOVEPIPE_REPLICAS": "three"}
    done = subprocess.run(
        [sys.executable, "-m", "stovepipe_fsm.apps.cli", "serve", "--nats", "nats://127.0.0.1:1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2 and "STOVEPIPE_REPLICAS" in done.stderr


# -- the ack-wait heartbeat ------------------------------------------------------------


async def test_a_long_step_keeps_its_message_past_the_ack_wait(js_env: JsEnv) -> None:
    """ack_wait 1 s, a 2.6 s step: with the heartbeat no second puller receives the
    message meanwhile; the step's ack settles it."""
    stream, subject = js_env.topology.process_stream, js_env.topology.process_subject("q")
    config = api.ConsumerConfig(
        durable_name="process-q",
        name="process-q",
        filter_subject=subject,
        ack_policy=api.AckPolicy.EXPLICIT,
        max_deliver=-1,
        ack_wait=1.0,
    )
    await ensure_pull_consumer(js_env.js, stream, config)
    first = await js_env.js.pull_subscribe_bind(durable="process-q", stream=stream)
    second = await js_env.js.pull_subscribe_bind(durable="process-q", stream=stream)
    await js_env.js.publish(subject, b"{}")
    (msg,) = await first.fetch(1, timeout=5)
    sent: list[float] = []

    class Slow:
        async def handle(self, delivery: Any) -> Attempt:
            await asyncio.sleep(2.6)
            return Attempt.acked()

    class Counting(JetStreamDelivery):
        async def in_progress(self) -> None:
            before = self.extensions
            await super().in_progress()
            if self.extensions > before:
                sent.append(asyncio.get_running_loop().time())

    delivery = Counting(msg, "q", "request/q/1", ack_wait_s=1.0)
    step = asyncio.ensure_future(KeptAlive(Slow(), 1.0).handle(delivery))
    with pytest.raises(Exception):  # noqa: B017  (a fetch timeout: nothing redelivered)
        await second.fetch(1, timeout=2.4)
    assert await step == Attempt.acked()
    await msg.ack()  # as the consumer performs the decision, once the step returned
    assert len(sent) >= 3
    await asyncio.sleep(1.2)  # past another ack wait: the acked message stays settled
    info = await js_env.js.consumer_info(stream, "process-q")
    assert info.num_ack_pending == 0 and info.num_redelivered == 0


async def test_the_heartbeat_stops_once_the_flow_has_decided() -> None:
    calls: list[str] = []
    two_sent = asyncio.Event()

    class Recording:
        queue, request_id = "q", "request/q/1"

        async def in_progress(self) -> None:
            calls.append("progress")
            if len(calls) >= 2:
                two_sent.set()

    class Holds:
        async def handle(self, delivery: Any) -> Attempt:
            # Decides only once the heartbeat has beaten twice, however late the loop runs.
            await asyncio.wait_for(two_sent.wait(), timeout=30)
            return Attempt.held(100)

    assert await KeptAlive(Holds(), 0.2).handle(Recording()) == Attempt.held(100)  # type: ignore[arg-type]
    sent = calls.count("progress")
    assert sent >= 2
    await asyncio.sleep(0.2)  # four periods: the hold is now the consumer's, no signal follows
    assert calls.count("progress") == sent


class _TimedDelivery:
    """Records what a heartbeat sends; each in-progress signal takes ``signal_s``."""

    queue, request_id, stream_seq = "q", "request/q/1", 1

    def __init__(self, signal_s: float = 0.0) -> None:
        self.signal_s = signal_s
        self.calls: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def in_progress(self) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.signal_s)
            self.calls.append("progress")
        finally:
            self.in_flight -= 1


class _AcksAfter:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def handle(self, delivery: Any) -> Attempt:
        await asyncio.sleep(self.seconds)
        return Attempt.acked()


async def test_a_delivery_decided_within_the_first_period_sends_no_signal() -> None:
    delivery = _TimedDelivery()
    assert await KeptAlive(_AcksAfter(0.0), 0.2).handle(delivery) == Attempt.acked()
    await asyncio.sleep(0.15)  # past the first period (0.05 s)
    assert delivery.calls == []


async def test_a_slow_signal_is_never_overlapped_by_the_next() -> None:
    """The next period starts once a signal is sent: a broker slower than the period
    never has two signals of one delivery in flight."""
    delivery = _TimedDelivery(signal_s=0.12)
    assert await KeptAlive(_AcksAfter(0.6), 0.2).handle(delivery) == Attempt.acked()
    assert delivery.most_in_flight == 1
    sent = delivery.calls.count("progress")
    assert sent >= 2
    await asyncio.sleep(0.3)  # decided: no signal follows
    assert delivery.calls.count("progress") == sent


async def test_a_cancelled_handler_stops_its_heartbeat() -> None:
    delivery = _TimedDelivery()
    step = asyncio.ensure_future(KeptAlive(_AcksAfter(10.0), 0.2).handle(delivery))
    await asyncio.sleep(0.12)  # two periods: two signals
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step
    sent = delivery.calls.count("progress")
    assert sent >= 1
    await asyncio.sleep(0.15)
    assert delivery.calls.count("progress") == sent

# -- prune --------------------------------------------------------------------------------

CONFIG = {"defaults": {"max_concurrent": 1, "gate_wait_delay_ms": 100}, "queues": {"q": {}}}


async def test_prune_removes_only_old_terminal_requests_nothing_named_by_a_queue(
    js_env: JsEnv,
) -> None:
    machines = load_process_machines("machines")
    pipeline = await open_pipeline(js_env.js, js_env.topology, machines, StaticConfigStore(CONFIG))
    ingest = pipeline.stages.ingest
    ids = [(await ingest.ingest("q", uri)).request_id for uri in ("A", "B", "C", "D")]
    lifecycle = pipeline.stages.lifecycle
    roles = machines.roles
    # A and B: superseded by C (terminal); C: admitted and finished (last green);
    # D: the latest head, still waiting (live).
    for old in ids[:2]:
        await lifecycle.supersede(await lifecycle.requests.get(old), ids[2])
    third = await lifecycle.requests.get(ids[2])
    admitted = await lifecycle.admit(third, await lifecycle.plan_admit(third), "full", "")
    await pipeline.stages.record.complete(admitted.id, roles.green_outcome.name)
    terminal = machines.request.terminal
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=2)

    recent = await prune_terminal_requests(js_env.js, js_env.topology, terminal, 86400.0)
    assert recent.pruned == [] and recent.recent == 3 and recent.live == 1

    dry = await prune_terminal_requests(
        js_env.js, js_env.topology, terminal, 86400.0, now=later, dry_run=True
    )
    assert sorted(dry.pruned) == ids[:2]
    assert await pipeline.stages.ingest.uri_index.get("q", "A") == ids[0]  # dry run: all there

    report = await prune_terminal_requests(js_env.js, js_env.topology, terminal, 86400.0, now=later)
    assert sorted(report.pruned) == ids[:2]
    assert report.referenced == [ids[2]]  # the queue's last green request stays
    assert report.live == 1
    for pruned, uri in zip(ids[:2], "AB", strict=True):
        assert not await _exists(pipeline, pruned)
        assert await pipeline.stages.ingest.uri_index.get("q", uri) is None
    assert await _exists(pipeline, ids[2]) and await _exists(pipeline, ids[3])
    assert await pipeline.stages.ingest.uri_index.get("q", "D") == ids[3]
    again = await prune_terminal_requests(js_env.js, js_env.topology, terminal, 86400.0, now=later)
    assert again.pruned == []


async def test_prune_keeps_the_red_head_and_the_probes_a_culprit_search_names(
    js_env: JsEnv,
) -> None:
    """The red head's trail tells its search, and a listed probe whose request went
    missing would be started again: neither is removed while the queue's row names it."""
    machines = load_process_machines("machines")
    pipeline = await open_pipeline(js_env.js, js_env.topology, machines, StaticConfigStore(CONFIG))
    a, b, c, d = [(await pipeline.stages.ingest.ingest("q", uri)).request_id for uri in "ABCD"]
    lifecycle = pipeline.stages.lifecycle
    for old in (a, b, c):
        await lifecycle.supersede(await lifecycle.requests.get(old), d)
    search = CulpritSearch("q", "searching", red_request_id=a, probes=(Probe(b, "B"),))
    assert pipeline.ports is not None and pipeline.ports.searches is not None
    await pipeline.ports.searches.create(search)
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=2)
    terminal = machines.request.terminal
    report = await prune_terminal_requests(js_env.js, js_env.topology, terminal, 86400.0, now=later)
    assert report.pruned == [c]
    assert sorted(report.referenced) == [a, b]
    assert await _exists(pipeline, a) and await _exists(pipeline, b)


async def _kept_on(js_env: JsEnv, bucket: str, key: str) -> int:
    """Messages the bucket's stream keeps on ``key`` (values and delete markers)."""
    info = await js_env.js.stream_info(f"KV_{bucket}", subjects_filter=f"$KV.{bucket}.{key}")
    return sum((info.state.subjects or {}).values())


async def test_prune_removes_the_delete_markers_of_earlier_runs(js_env: JsEnv) -> None:
    machines = load_process_machines("machines")
    pipeline = await open_pipeline(js_env.js, js_env.topology, machines, StaticConfigStore(CONFIG))
    a, b = [(await pipeline.stages.ingest.ingest("q", uri)).request_id for uri in ("A", "B")]
    lifecycle, terminal = pipeline.stages.lifecycle, machines.request.terminal
    await lifecycle.supersede(await lifecycle.requests.get(a), b)
    topology = js_env.topology
    request_key, entry_key = request_key_of(a), uri_key("q", "A")
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=2)
    later = soon + datetime.timedelta(days=2)

    # Pruned: its row and its uri entry leave a delete marker each, younger than the
    # keep window (ten minutes), so the run that made them leaves them alone.
    first = await prune_terminal_requests(js_env.js, topology, terminal, 60.0, now=soon)
    assert first.pruned == [a] and first.purged_markers == 0
    assert await _kept_on(js_env, topology.requests_bucket, request_key) == 1
    assert await _kept_on(js_env, topology.uris_bucket, entry_key) == 1
    # Past the window the next run removes both; nothing else of the buckets goes.
    again = await prune_terminal_requests(js_env.js, topology, terminal, 86400.0, now=later)
    assert again.pruned == [] and again.purged_markers == 2
    assert await _kept_on(js_env, topology.requests_bucket, request_key) == 0
    assert await _kept_on(js_env, topology.uris_bucket, entry_key) == 0
    assert await pipeline.stages.ingest.uri_index.get("q", "B") == b
    # The head reported again is a new request, its uri entry written where the marker was.
    back = await pipeline.stages.ingest.ingest("q", "A")
    assert back.created and await pipeline.stages.ingest.uri_index.get("q", "A") == back.request_id


async def test_a_marker_purge_keeps_a_value_written_after_the_marker(js_env: JsEnv) -> None:
    bucket = js_env.topology.uris_bucket
    kv = await js_env.js.key_value(bucket)
    await kv.put("k", b"first")
    await kv.delete("k")
    seen = await kv_entries(js_env.js, bucket)  # the marker, as a prune read it
    await kv.put("k", b"again")  # written between that read and the purge
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
    assert await _purge_markers(js_env.js, bucket, seen, later) == 1
    assert (await kv.get("k")).value == b"again"
    assert await _kept_on(js_env, bucket, "k") == 1


async def test_prune_keeps_every_recent_green_a_queue_row_lists(js_env: JsEnv) -> None:
    """An older green the row still lists is a base a later head may build on, and the
    trail names its request: it is not pruned, though it is no longer last green."""
    machines = load_process_machines("machines")
    pipeline = await open_pipeline(js_env.js, js_env.topology, machines, StaticConfigStore(CONFIG))
    lifecycle = pipeline.stages.lifecycle
    ids = []
    for uri in ("A", "B"):
        ingested = await pipeline.stages.ingest.ingest("q", uri)
        head = await lifecycle.requests.get(ingested.request_id)
        admitted = await lifecycle.admit(head, await lifecycle.plan_admit(head), "full", "")
        await pipeline.stages.record.complete(admitted.id, machines.roles.green_outcome.name)
        ids.append(head.id)
    row = await lifecycle.queues.get("q")
    assert row.last_green_request_id == ids[1]
    assert [g.request_id for g in row.greens] == [ids[1], ids[0]]
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=2)
    terminal = machines.request.terminal
    report = await prune_terminal_requests(js_env.js, js_env.topology, terminal, 86400.0, now=later)
    assert report.pruned == [] and sorted(report.referenced) == sorted(ids)


async def _exists(pipeline: Any, request_id: str) -> bool:
    from stovepipe_fsm.domain.errors import NotFound

    try:
        await pipeline.stages.lifecycle.requests.get(request_id)
    except NotFound:
        return False
    return True


async def test_the_service_prunes_by_itself_when_told_to(js_env: JsEnv) -> None:
    machines = load_process_machines("machines")
    pipeline = await open_pipeline(js_env.js, js_env.topology, machines, StaticConfigStore(CONFIG))
    old, latest = [(await pipeline.stages.ingest.ingest("q", uri)).request_id for uri in ("A", "B")]
    options = replace(FAST, prune_older_than_s=1.0, prune_interval_s=0.2)
    async with running_service(js_env.server, js_env.topology, CONFIG, options=options):

        async def old_gone() -> bool:
            return not await _exists(pipeline, old)

        await wait_for(old_gone, "the superseded request pruned")
        assert await pipeline.stages.ingest.uri_index.get("q", "A") is None
        await asyncio.sleep(1.5)  # well past the bound: the latest request is never pruned
        assert await _exists(pipeline, latest)
        assert await pipeline.stages.ingest.uri_index.get("q", "B") == latest

"""Topology: subject helpers, idempotent creation, and refusing to clobber a mismatch."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest
from nats.js import api
from nats_server import JsEnv, delete_topology, unique_tag

from stovepipe_fsm.adapters.jetstream import Topology, TopologyMismatch, ensure_topology
from stovepipe_fsm.adapters.jetstream import asked_again as asked_again_module
from stovepipe_fsm.adapters.jetstream.asked_again import TRANSIENT_ATTEMPTS
from stovepipe_fsm.domain.errors import Retryable
from stovepipe_fsm.domain.hooks import VALIDATION_STARTED


def test_subjects_use_the_queue_token() -> None:
    topology = Topology()
    assert topology.process_subject("monorepo/main") == "stovepipe.process.monorepo/main"
    assert topology.process_subject("org/r/1.2") == "stovepipe.process.org/r/1_2E2"
    assert topology.build_subject("monorepo/main") == "stovepipe.build.monorepo/main"
    assert topology.hook_subject(VALIDATION_STARTED) == (
        "stovepipe.hooks.validation.repository.started"
    )
    assert topology.dead_letter_subject("monorepo/main") == "stovepipe.dlq.process.monorepo/main"
    assert topology.process_filter() == "stovepipe.process.*"


@pytest.mark.parametrize("queue", ["monorepo/main", "a.b", "ünï/主", "x" * 200])
def test_process_subject_reverses_to_the_queue(queue: str) -> None:
    topology = Topology()
    assert topology.queue_of_process_subject(topology.process_subject(queue)) == queue


@pytest.mark.parametrize(
    "subject", ["stovepipe.build.q", "stovepipe.process.", "stovepipe.process.a_2e", "other"]
)
def test_foreign_subjects_are_rejected(subject: str) -> None:
    with pytest.raises(ValueError, match="not a process subject"):
        Topology().queue_of_process_subject(subject)


@pytest.mark.parametrize("partition", [0, 1, 7, 999])
@pytest.mark.parametrize("queue", ["monorepo/main", "a.b", "7"])
def test_a_partitions_subject_reverses_to_its_queue_and_partition(
    queue: str, partition: int
) -> None:
    topology = Topology()
    subject = topology.process_subject(queue, partition)
    assert topology.process_address(subject) == (queue, partition)
    assert topology.queue_of_process_subject(subject) == queue
    stream = topology.process_stream_of(partition)
    assert topology.process_stream_of_subject(subject) == stream
    assert topology.partition_of_process_stream(stream) == partition


def test_partitions_have_their_own_streams_subjects_and_sequences() -> None:
    topology = Topology()
    assert topology.process_subject("q", 3) == "stovepipe.process.3.q"
    assert topology.process_filter(3) == "stovepipe.process.3.*"
    assert topology.process_subjects_filter() == "stovepipe.process.>"
    assert topology.process_stream_of(0) == "STOVEPIPE_PROCESS"
    assert topology.process_stream_of(3) == "STOVEPIPE_PROCESS_3"
    first, third = topology.process_stream_spec(0), topology.process_stream_spec(3)
    assert (first.name, first.subjects, first.first_seq) == (
        "STOVEPIPE_PROCESS",
        ("stovepipe.process.*",),
        0,
    )
    # Sequences key the attempts and termination ledgers: the partitions' never meet.
    assert third.first_seq == 3 * 10**15 and third.to_config().first_seq == 3 * 10**15
    assert third.retention == first.retention == api.RetentionPolicy.WORK_QUEUE
    assert topology.stream_specs()[0] == first  # ensure_topology makes partition 0 only


@pytest.mark.parametrize(
    "subject",
    [
        "stovepipe.process.0.q",  # partition 0 has one token less
        "stovepipe.process.01.q",
        "stovepipe.process.1000.q",
        "stovepipe.process.x.q",
        "stovepipe.process.1.",
        "stovepipe.process.1.a_2e",
    ],
)
def test_malformed_partition_subjects_are_rejected(subject: str) -> None:
    with pytest.raises(ValueError, match="not a process subject"):
        Topology().process_address(subject)


@pytest.mark.parametrize(
    "stream", ["STOVEPIPE_PROCESS_0", "STOVEPIPE_PROCESS_01", "STOVEPIPE_BUILD"]
)
def test_streams_that_are_no_partition_are_told_apart(stream: str) -> None:
    assert Topology().partition_of_process_stream(stream) is None


def test_partitions_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match=r"partition must be in 0\.\.999"):
        Topology().process_subject("q", 1000)


def test_consumer_names_are_legal_and_distinct() -> None:
    topology = Topology()
    names = {topology.process_consumer_name(q) for q in ("a/b", "a_2Fb", "a.b", "a_b")}
    assert len(names) == 4
    assert topology.process_consumer_name("monorepo/main") == "process-monorepo_2Fmain"
    assert all("/" not in n and "." not in n for n in names)


def test_isolated_topologies_share_no_name() -> None:
    a, b = Topology.isolated("a"), Topology.isolated("b")
    names_a = {a.prefix, *a.stream_names(), *a.bucket_names()}
    names_b = {b.prefix, *b.stream_names(), *b.bucket_names()}
    assert not names_a & names_b
    default = Topology()
    assert not names_a & {default.prefix, *default.stream_names(), *default.bucket_names()}


@pytest.mark.parametrize(
    "overrides",
    [{"prefix": "has space"}, {"prefix": "wild.*"}, {"process_stream": "A.B"}, {"replicas": 0}],
)
def test_bad_names_are_rejected_up_front(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Topology(**overrides)  # type: ignore[arg-type]


async def test_ensure_is_idempotent(js_env: JsEnv) -> None:
    # js_env already ran ensure_topology once (creating everything); run it twice more.
    for _ in range(2):
        report = await ensure_topology(js_env.js, js_env.topology)
        assert report.created_streams == () and report.created_buckets == ()
        assert set(report.existing_streams) == set(js_env.topology.stream_names())
        assert set(report.existing_buckets) == set(js_env.topology.bucket_names())


async def test_first_ensure_creates_everything_with_dedup_window(js_env: JsEnv) -> None:
    topology = Topology.isolated(unique_tag())
    try:
        report = await ensure_topology(js_env.js, topology)
        assert report.created_streams == topology.stream_names()
        assert report.created_buckets == topology.bucket_names()
        for name in topology.stream_names():
            config = (await js_env.js.stream_info(name)).config
            assert config.duplicate_window == 120.0
        process = (await js_env.js.stream_info(topology.process_stream)).config
        assert process.retention == api.RetentionPolicy.WORK_QUEUE
        assert process.max_consumers == topology.initial_queue_limit
        kv = (await js_env.js.stream_info(f"KV_{topology.requests_bucket}")).config
        assert (kv.max_msgs_per_subject, kv.allow_direct) == (1, False)
    finally:
        await delete_topology(js_env.js, topology)


async def test_mismatching_stream_is_reported_and_left_alone(js_env: JsEnv) -> None:
    topology = Topology.isolated(unique_tag())
    foreign = api.StreamConfig(
        name=topology.process_stream,
        subjects=[f"{topology.prefix}.elsewhere.*"],
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.MEMORY,
        duplicate_window=1.0,
    )
    await js_env.js.add_stream(foreign)
    try:
        with pytest.raises(TopologyMismatch) as caught:
            await ensure_topology(js_env.js, topology)
        message = str(caught.value)
        assert topology.process_stream in message
        for field in ("subjects", "retention", "storage", "duplicate_window"):
            assert f"{field}: have" in message
        after = (await js_env.js.stream_info(topology.process_stream)).config
        assert after.subjects == [f"{topology.prefix}.elsewhere.*"]
        assert after.storage == api.StorageType.MEMORY
    finally:
        await delete_topology(js_env.js, topology)


async def test_mismatching_bucket_is_reported(js_env: JsEnv) -> None:
    topology = Topology.isolated(unique_tag())
    await js_env.js.create_key_value(
        api.KeyValueConfig(bucket=topology.counters_bucket, storage=api.StorageType.MEMORY)
    )
    try:
        with pytest.raises(TopologyMismatch, match=f"bucket '{topology.counters_bucket}'"):
            await ensure_topology(js_env.js, topology)
    finally:
        await delete_topology(js_env.js, topology)


async def test_concurrent_ensures_agree(js_env: JsEnv) -> None:
    """Replicas start together: every ensure succeeds and all end with one topology."""
    topology = Topology.isolated(unique_tag())
    try:
        reports = await asyncio.gather(*(ensure_topology(js_env.js, topology) for _ in range(3)))
        for report in reports:
            seen = {*report.created_streams, *report.existing_streams}
            assert seen == set(topology.stream_names())
        assert await ensure_topology(js_env.js, topology) == (
            await ensure_topology(js_env.js, topology)
        )
    finally:
        await delete_topology(js_env.js, topology)


async def test_an_ensure_the_broker_did_not_answer_is_asked_again(
    js_env: JsEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a cluster a replicated stream's create can go unanswered while replicas start
    side by side: the ensure asks again instead of failing the start, and what the lost
    answer created is found, not made twice."""
    topology = Topology.isolated(unique_tag())
    js = js_env.js
    real_add = js.add_stream
    lost: list[str] = []

    async def add_whose_answer_is_lost(config: api.StreamConfig | None = None, **kw: object):
        info = await real_add(config, **kw)  # type: ignore[arg-type]
        if config is not None and config.name == topology.hooks_stream and not lost:
            lost.append(config.name)
            raise nats.errors.TimeoutError  # the server created it; its answer never came
        return info

    monkeypatch.setattr(asked_again_module, "PAUSE_S", 0.0)
    monkeypatch.setattr(js, "add_stream", add_whose_answer_is_lost)
    try:
        report = await ensure_topology(js, topology)
        assert lost == [topology.hooks_stream]
        # Found on the second try, as existing: created once.
        assert topology.hooks_stream in report.existing_streams
        assert (await js.stream_info(topology.hooks_stream)).config.name == topology.hooks_stream
    finally:
        await delete_topology(js, topology)


async def test_an_ensure_the_broker_never_answers_fails_after_three_tries(
    js_env: JsEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    asks: list[str] = []

    async def silent(name: str, **kw: object) -> None:
        asks.append(name)
        raise nats.errors.TimeoutError

    monkeypatch.setattr(asked_again_module, "PAUSE_S", 0.0)
    monkeypatch.setattr(js_env.js, "stream_info", silent)
    topology = Topology.isolated(unique_tag())
    with pytest.raises(Retryable, match=f"ensure stream {topology.process_stream}"):
        await ensure_topology(js_env.js, topology)
    assert asks == [topology.process_stream] * TRANSIENT_ATTEMPTS

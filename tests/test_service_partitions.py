"""Queues past the account's consumer limit spread over partitions of the process stream.

The broker caps each stream's consumers at the account's JetStream consumer limit, and
every queue has a consumer of its own: past the limit the service moves a queue to a
partition with room (created when none has any), and every head still reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import nats.js.errors
import pytest
from nats.js import JetStreamContext, api
from nats_server import account_limited_server, connect, unique_tag
from test_service_support import Running, running_service, wait_for

from stovepipe_fsm.adapters.jetstream import Topology
from stovepipe_fsm.adapters.jetstream.durable_consumer import (
    delete_durable,
    ensure_pull_consumer,
    existing_consumers,
)
from stovepipe_fsm.adapters.jetstream.partitions import partitions
from stovepipe_fsm.adapters.jetstream.topology import PARTITION_SEQUENCE_SPAN, ensure_partition
from stovepipe_fsm.apps.service.http import render_metrics
from stovepipe_fsm.apps.service.operators import render_status, status_document
from stovepipe_fsm.apps.service.placement import Placement
from stovepipe_fsm.domain.errors import NotFound

#: Each test starts a broker of its own, with account limits.
pytestmark = pytest.mark.nats

CONFIG_DEFAULTS = {"max_attempts": 3}


def config_of(queues: list[str]) -> dict[str, Any]:
    return {"defaults": CONFIG_DEFAULTS, "queues": {queue: {} for queue in queues}}


async def consumers_by_partition(js: JetStreamContext, topology: Topology) -> dict[str, list[int]]:
    """Every queue consumer the broker holds, by durable name: the partitions it is on."""
    out: dict[str, list[int]] = {}
    for partition in await partitions(js, topology):
        for name in await existing_consumers(js, topology.process_stream_of(partition)):
            out.setdefault(name, []).append(partition)
    return out


async def assert_every_queue_on_its_rows_partition(run: Running, queues: list[str]) -> None:
    topology = run.service.topology
    held = await consumers_by_partition(run.nc.jetstream(), topology)
    for queue in queues:
        try:
            partition = (await run.queue(queue)).partition
        except NotFound:  # configured, nothing ingested, and never moved
            partition = 0
        assert held[topology.process_consumer_name(queue)] == [partition], queue
        assert run.service.crew.queues.consumers[queue].partition == partition


async def test_queues_past_the_accounts_consumer_limit_spread_over_partitions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    queues = [f"s/q{n}" for n in range(8)]
    with account_limited_server(tmp_path, max_consumers=3) as server:
        topology = Topology.isolated(unique_tag())
        with caplog.at_level(logging.INFO, logger="stovepipe_fsm.service"):
            async with running_service(server, topology, config_of(queues)) as run:
                js = run.nc.jetstream()
                assert run.service.crew.queues.refused == {}
                assert sorted(run.service.crew.queues.consumers) == queues
                assert await partitions(js, topology) == [0, 1, 2]
                held = await consumers_by_partition(js, topology)
                counts = [sum(p == [k] for p in held.values()) for k in (0, 1, 2)]
                assert counts == [3, 3, 2]
                await assert_every_queue_on_its_rows_partition(run, queues)

                # The last queue's first head waits for the restart below.
                rids = {queue: await run.ingest(queue, "A") for queue in queues[:-1]}
                for rid in rids.values():
                    await run.wait_state(rid, "processing")
                # Each partition numbers its messages from its own span, so the attempts
                # and termination ledgers (keyed by sequence) never confuse two of them.
                used = {run.service.crew.queues.consumers[queue].partition for queue in rids}
                assert used == {0, 1, 2}
                for partition in used:
                    stream = topology.process_stream_of(partition)
                    info = await js.stream_info(stream)
                    assert info.state.last_seq >= partition * PARTITION_SEQUENCE_SPAN
                    assert info.state.last_seq < (partition + 1) * PARTITION_SEQUENCE_SPAN

                    async def consumed(stream: str = stream) -> bool:
                        # Each head acked where it landed (the ack follows the write).
                        return (await js.stream_info(stream)).state.messages == 0

                    await wait_for(consumed, f"every head on {stream} acked")
                # status names the partition of each moved queue, and of no other.
                doc = await status_document(js, topology)
                listed = {q["name"]: q.get("partition", 0) for q in doc["queues"]}
                assert listed == {q: run.service.crew.queues.consumers[q].partition for q in listed}
                assert sorted(set(listed.values())) == [0, 1, 2]
                text = render_status(doc)
                assert f"{queues[0]}: " in text and "partition=2" in text
                metrics = await render_metrics(run.service)
                assert "stovepipe_process_partitions 3\n" in metrics
                assert "stovepipe_process_consumers 8\n" in metrics  # over every partition
                assert "stovepipe_queues_refused 0\n" in metrics
        moves = [r.getMessage() for r in caplog.records if "queue moved" in r.getMessage()]
        assert len(moves) == 5
        # Ingest published each head where the queue's row said: nothing had to be moved.
        assert not [r for r in caplog.records if "waiting message" in r.getMessage()]
        created = [r.getMessage() for r in caplog.records if "created partition" in r.getMessage()]
        assert len(created) == 2

        # A restart finds every queue where it was: no queue moves again.
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="stovepipe_fsm.service"):
            async with running_service(server, topology, config_of(queues)) as run:
                assert sorted(run.service.crew.queues.consumers) == queues
                await assert_every_queue_on_its_rows_partition(run, queues)
                rid = await run.ingest(queues[-1], "A")
                await run.wait_state(rid, "processing")
        assert not [r for r in caplog.records if "queue moved" in r.getMessage()]


class StalePublisher:
    """Publishes as an ingest that read the queue's row just before the queue moved."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def publish_process(self, queue: str, request_id: str, partition: int = 0) -> None:
        await self.inner.publish_process(queue, request_id, 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_head_published_on_the_old_partition_is_moved_to_the_queues_own(
    tmp_path: Path,
) -> None:
    queues = ["m/first", "m/second"]
    with account_limited_server(tmp_path, max_consumers=1) as server:
        topology = Topology.isolated(unique_tag())
        async with running_service(server, topology, config_of(queues)) as run:
            moved = next(q for q in queues if run.service.crew.queues.consumers[q].partition == 1)
            ingest = run.pipeline.stages.ingest
            ingest.publisher = StalePublisher(ingest.publisher)
            rid = await run.ingest(moved, "A")
            await run.wait_state(rid, "processing")
            js = run.nc.jetstream()

            async def nothing_left_on_partition_0() -> bool:
                try:
                    await js.get_msg(
                        topology.process_stream,
                        seq=1,
                        subject=topology.process_subject(moved),
                        next=True,
                    )
                except nats.js.errors.NotFoundError:
                    return True
                return False

            await wait_for(nothing_left_on_partition_0, "the stray head moved away")
            assert run.events.count("orphan") == 0

            # A message on a partition's subject of a queue with no row is an orphan
            # there as on the process stream: dead-lettered, and gone from its stream.
            stray = topology.process_subject("m/unknown", 1)
            await js.publish(stray, b"{}", stream=topology.process_stream_of(1))

            async def dead_lettered() -> bool:
                return run.events.count("orphan") == 1

            await run.service.crew.discovery.discover()
            await wait_for(dead_lettered, "the orphan on partition 1 dead-lettered")
            info = await js.stream_info(topology.process_stream_of(1))
            assert info.state.messages == 0


async def test_two_replicas_agree_on_each_queues_partition(tmp_path: Path) -> None:
    """Replicas starting side by side are refused by the same full stream and move the
    same queues at once: each queue ends with one consumer, on the partition its row
    names, and every head is admitted."""
    queues = [f"r/q{n}" for n in range(7)]
    with account_limited_server(tmp_path, max_consumers=2) as server:
        topology = Topology.isolated(unique_tag())
        async with contextlib.AsyncExitStack() as stack:
            first, second = await asyncio.gather(
                stack.enter_async_context(running_service(server, topology, config_of(queues))),
                stack.enter_async_context(running_service(server, topology, config_of(queues))),
            )
            for run in (first, second):
                assert run.service.crew.queues.refused == {}
                await assert_every_queue_on_its_rows_partition(run, queues)
            held = await consumers_by_partition(first.nc.jetstream(), topology)
            assert sorted(held) == sorted(topology.process_consumer_name(q) for q in queues)
            rids = [await first.ingest(queue, "A") for queue in queues]
            for rid in rids:
                await first.wait_state(rid, "processing")


async def durable_on(js: JetStreamContext, topology: Topology, queue: str, partition: int) -> None:
    """A queue's durable on ``partition``, as a replica opening the queue there makes it."""
    config = api.ConsumerConfig(
        durable_name=topology.process_consumer_name(queue),
        filter_subject=topology.process_subject(queue, partition),
        ack_policy=api.AckPolicy.EXPLICIT,
        max_ack_pending=1,
    )
    await ensure_pull_consumer(js, topology.process_stream_of(partition), config)


async def test_a_consumer_on_a_partition_its_row_no_longer_names_follows_the_row(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Replicas race: one creates a queue's consumer on a partition's last seat at the
    moment another, refused there, moves the queue. The first replica then serves the
    queue from a partition no head is published to. At the queue's next head it opens
    the queue where the row says and deletes its durable on the old partition."""
    queues = ["h/a", "h/b"]
    with account_limited_server(tmp_path, max_consumers=3) as server:
        topology = Topology.isolated(unique_tag())
        async with running_service(server, topology, config_of(queues)) as run:
            js = run.nc.jetstream()
            assert run.service.crew.queues.consumers["h/b"].partition == 0
            # What the replica refused on partition 0 did: a partition made, the row moved.
            other = Placement(js, topology, run.pipeline.ports.queues)
            await other.refresh()
            assert await other.move("h/b", 0) == 1
            assert (await run.queue("h/b")).partition == 1

            with caplog.at_level(logging.INFO, logger="stovepipe_fsm.service"):
                rid = await run.ingest("h/b", "A")
                await run.wait_state(rid, "processing")

                async def followed() -> bool:
                    consumer = run.service.crew.queues.consumers.get("h/b")
                    return consumer is not None and consumer.partition == 1

                await wait_for(followed, "the consumer of h/b on partition 1")
            await assert_every_queue_on_its_rows_partition(run, queues)
            assert (await js.stream_info(topology.process_stream_of(1))).state.messages == 0
        # The head was served where it was published, not moved back to the old consumer.
        assert not [r for r in caplog.records if "waiting message" in r.getMessage()]
        assert [r for r in caplog.records if "deleted the queue's consumer" in r.getMessage()]


async def test_a_start_binds_a_queue_listed_on_two_partitions_where_its_row_says(
    tmp_path: Path,
) -> None:
    """The same race seen from a replica starting later: the queue's durable exists on
    two partitions. The starting replica opens it where the row says and deletes the
    other; a replica still running the deleted one follows the row instead of making
    it again where no head goes."""
    queues = ["d/a", "d/b"]
    with account_limited_server(tmp_path, max_consumers=3) as server:
        topology = Topology.isolated(unique_tag())
        name = topology.process_consumer_name("d/a")
        async with running_service(server, topology, config_of(queues)):
            pass  # the topology, and a durable of each queue on partition 0
        # The race's outcome as the first replica below finds it: d/a has no row, so it
        # lives on partition 0, and its only durable is on partition 1.
        nc = await connect(server)
        try:
            js = nc.jetstream()
            await ensure_partition(js, topology, 1)
            assert await delete_durable(js, topology.process_stream, name)
            await durable_on(js, topology, "d/a", 1)
        finally:
            await nc.close()
        async with contextlib.AsyncExitStack() as stack:
            first = await stack.enter_async_context(
                running_service(server, topology, config_of(queues))
            )
            assert first.service.crew.queues.consumers["d/a"].partition == 1  # bound where listed
            js = first.nc.jetstream()
            await durable_on(js, topology, "d/a", 0)  # as the moving replica made it
            second = await stack.enter_async_context(
                running_service(server, topology, config_of(queues))
            )
            assert second.service.crew.queues.consumers["d/a"].partition == 0
            assert (await consumers_by_partition(js, topology))[name] == [0]

            async def followed() -> bool:
                consumer = first.service.crew.queues.consumers.get("d/a")
                return consumer is not None and consumer.partition == 0

            await wait_for(followed, "the first replica's consumer of d/a on partition 0")
            # Past the loop's retry pause: nothing made the durable again on partition 1.
            await asyncio.sleep(1.5)
            for run in (first, second):
                await assert_every_queue_on_its_rows_partition(run, queues)
            rid = await first.ingest("d/a", "A")
            await first.wait_state(rid, "processing")


async def test_a_durable_deleted_where_the_row_says_is_made_again(tmp_path: Path) -> None:
    """A queue's durable deleted by hand on the partition its row names is made again
    by the loop that lost it, and its next head is admitted."""
    queues = ["g/a", "g/b"]
    with account_limited_server(tmp_path, max_consumers=3) as server:
        topology = Topology.isolated(unique_tag())
        async with running_service(server, topology, config_of(queues)) as run:
            js = run.nc.jetstream()
            name = topology.process_consumer_name("g/a")
            assert await delete_durable(js, topology.process_stream, name)

            async def made_again() -> bool:
                return (await consumers_by_partition(js, topology)).get(name) == [0]

            await wait_for(made_again, "the durable of g/a made again on partition 0")
            assert run.service.crew.queues.consumers["g/a"].partition == 0
            rid = await run.ingest("g/a", "A")
            await run.wait_state(rid, "processing")

"""Executable facts about JetStream consumers that the process runtime relies on.

Each test pins one behaviour of the pinned nats-server (and nats-py) on the stream shape
``ensure_topology`` creates: the runtime's hold, serialization and liveness arguments
are only as good as these facts. ``docs/jetstream.md`` lists them with their figures.

Consumers are shaped like the runtime's: one durable pull consumer per queue, filtered to
the queue's process subject, explicit ack, ``max_ack_pending=1``, ``max_deliver=-1``.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import nats.js.errors
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats_server import (
    JsEnv,
    account_limited_server,
    close,
    connect,
    delete_topology,
    unique_tag,
)
from test_service_support import wait_for

from stovepipe_fsm.adapters.jetstream import Topology, ensure_topology

Q1, Q2 = "monorepo/main", "monorepo/release"
NO_MESSAGE_WAIT_S = 0.2


async def _publish(js: JetStreamContext, topology: Topology, queue: str, body: str) -> None:
    await js.publish(topology.process_subject(queue), body.encode(), headers={"Nats-Msg-Id": body})


async def _consumer(
    js: JetStreamContext, topology: Topology, queue: str, *, ack_wait: float = 30.0
) -> JetStreamContext.PullSubscription:
    name = topology.process_consumer_name(queue)
    await js.add_consumer(
        topology.process_stream,
        api.ConsumerConfig(
            durable_name=name,
            filter_subject=topology.process_subject(queue),
            ack_policy=api.AckPolicy.EXPLICIT,
            max_ack_pending=1,
            max_deliver=-1,
            ack_wait=ack_wait,
        ),
    )
    return await _bind(js, topology, queue)


async def _bind(
    js: JetStreamContext, topology: Topology, queue: str
) -> JetStreamContext.PullSubscription:
    """Another puller on the same durable consumer: what a second service replica does."""
    return await js.pull_subscribe_bind(
        durable=topology.process_consumer_name(queue), stream=topology.process_stream
    )


async def _fetch_one(sub: JetStreamContext.PullSubscription, timeout: float) -> Msg | None:
    try:
        (msg,) = await sub.fetch(1, timeout=timeout)
    except TimeoutError:
        return None
    return msg


async def _must_fetch(sub: JetStreamContext.PullSubscription, timeout: float = 5.0) -> Msg:
    msg = await _fetch_one(sub, timeout)
    assert msg is not None, f"no message within {timeout}s"
    return msg


async def test_a_nak_with_delay_is_a_barrier_for_its_own_queue(js_env: JsEnv) -> None:
    """(a) The held head redelivers after the delay, before any later message of its queue,
    and no puller (not even another replica) gets the later message meanwhile."""
    js, topology = js_env.js, js_env.topology
    await _publish(js, topology, Q1, "A")
    await _publish(js, topology, Q1, "B")
    sub = await _consumer(js, topology, Q1)
    replica = await _bind(js, topology, Q1)

    first = await _must_fetch(sub)
    assert (first.data, first.metadata.num_delivered) == (b"A", 1)
    await first.nak(delay=4 * NO_MESSAGE_WAIT_S)

    # Held: A is not handed out again at once, and B is behind the barrier.
    assert await _fetch_one(sub, NO_MESSAGE_WAIT_S) is None
    assert await _fetch_one(replica, NO_MESSAGE_WAIT_S) is None
    info = await sub.consumer_info()
    assert (info.num_ack_pending, info.num_redelivered) == (1, 0)
    again = await _must_fetch(sub)
    assert (again.data, again.metadata.num_delivered) == (b"A", 2)
    assert again.metadata.sequence.stream == first.metadata.sequence.stream
    await again.ack_sync()

    after = await _must_fetch(replica)
    assert after.data == b"B"
    await after.ack_sync()


async def test_a_held_queue_does_not_block_another_queue(js_env: JsEnv) -> None:
    """(b) Isolation: each queue has its own consumer, so one held head stalls one queue."""
    js, topology = js_env.js, js_env.topology
    for queue, body in ((Q1, "A1"), (Q1, "B1"), (Q2, "A2")):
        await _publish(js, topology, queue, body)
    held_sub = await _consumer(js, topology, Q1)
    other_sub = await _consumer(js, topology, Q2)

    held = await _must_fetch(held_sub)
    await held.nak(delay=10)
    other = await _must_fetch(other_sub, timeout=2.0)
    assert other.data == b"A2"
    # Delivered while Q1's head was still held: pending there, not yet handed out again.
    info = await held_sub.consumer_info()
    assert (info.num_ack_pending, info.num_redelivered, info.num_pending) == (1, 0, 1)
    await other.ack_sync()
    assert await _fetch_one(held_sub, NO_MESSAGE_WAIT_S) is None  # Q1 still held


async def test_fetching_a_batch_of_two_returns_one_after_the_full_timeout(js_env: JsEnv) -> None:
    """(c) With max_ack_pending=1, fetch(batch=2) yields one message but only after waiting
    out its whole timeout: the runtime must fetch batch=1."""
    js, topology = js_env.js, js_env.topology
    await _publish(js, topology, Q1, "A")
    await _publish(js, topology, Q1, "B")
    sub = await _consumer(js, topology, Q1)
    fetching = asyncio.ensure_future(sub.fetch(2, timeout=3.0))

    async def delivered() -> bool:
        return (await sub.consumer_info()).num_ack_pending == 1

    await wait_for(delivered, "A handed to the fetch")
    # A is in the client's hands, yet the fetch has not returned: it waits for a second
    # message the server cannot send (max_ack_pending=1) until its timeout.
    assert not fetching.done()
    msgs = await fetching
    assert [m.data for m in msgs] == [b"A"]
    # Whereas batch=1 returns with the message, long before its own timeout:
    await msgs[0].ack_sync()
    (b,) = await asyncio.wait_for(sub.fetch(1, timeout=60.0), timeout=30.0)
    assert b.data == b"B"


async def test_unlimited_max_deliver_keeps_redelivering(js_env: JsEnv) -> None:
    """(d) max_deliver=-1: 30 NAKs, with and without delay, and the message still comes
    back. Every redelivery, a delayed one (a hold) included, increments num_delivered,
    so the runtime cannot read its failure budget off num_delivered."""
    js, topology = js_env.js, js_env.topology
    await _publish(js, topology, Q1, "A")
    sub = await _consumer(js, topology, Q1)
    info = await sub.consumer_info()
    assert info.config.max_deliver == -1
    for attempt in range(1, 31):
        msg = await _must_fetch(sub)
        assert (msg.data, msg.metadata.num_delivered) == (b"A", attempt)
        await msg.nak(delay=0.01 if attempt % 2 else None)
    last = await _must_fetch(sub)
    assert last.metadata.num_delivered == 31
    await last.ack_sync()
    assert (await sub.consumer_info()).num_ack_pending == 0


async def test_in_progress_extends_the_ack_deadline(js_env: JsEnv) -> None:
    """(e) ack_wait=1s, a 2.5s handler signalling in_progress every 0.5s: no redelivery to a
    second replica while it works. Without in_progress the same message is redelivered."""
    js, topology = js_env.js, js_env.topology
    await _publish(js, topology, Q1, "A")
    sub = await _consumer(js, topology, Q1, ack_wait=1.0)
    replica = await _bind(js, topology, Q1)

    msg = await _must_fetch(sub)

    async def slow_handler() -> None:
        for _ in range(5):
            await asyncio.sleep(0.5)
            await msg.in_progress()
        await msg.ack_sync()

    stolen, _ = await asyncio.gather(_fetch_one(replica, 3.0), slow_handler())
    assert stolen is None
    info = await sub.consumer_info()
    assert (info.num_redelivered, info.num_ack_pending) == (0, 0)

    # Control: the same consumer without in_progress redelivers after ack_wait.
    await _publish(js, topology, Q1, "B")
    given = await _must_fetch(sub)  # delivered, then neither acked nor extended
    assert await _fetch_one(replica, NO_MESSAGE_WAIT_S) is None  # not before the ack wait
    redelivered = await _must_fetch(replica, timeout=3.0)
    assert (redelivered.data, redelivered.metadata.num_delivered) == (b"B", 2)
    assert redelivered.metadata.sequence.stream == given.metadata.sequence.stream
    assert (await sub.consumer_info()).num_redelivered == 1
    await redelivered.ack_sync()


async def test_process_stream_refuses_a_second_consumer_for_a_queue(js_env: JsEnv) -> None:
    """The process stream is a work queue: the server refuses two consumers whose filters
    overlap, so a queue can never be served by two consumers (and lose serialization)."""
    js, topology = js_env.js, js_env.topology
    await _consumer(js, topology, Q1)
    with pytest.raises(nats.js.errors.BadRequestError) as caught:
        await js.add_consumer(
            topology.process_stream,
            api.ConsumerConfig(
                durable_name="intruder",
                filter_subject=topology.process_subject(Q1),
                ack_policy=api.AckPolicy.EXPLICIT,
            ),
        )
    assert caught.value.err_code == 10100
    assert "not unique on workqueue stream" in (caught.value.description or "")


async def _add_consumers(js: JetStreamContext, stream: str, subjects: list[str]) -> int:
    """Create one durable per subject until the server refuses; how many were created."""
    for index, subject in enumerate(subjects):
        try:
            await js.add_consumer(
                stream,
                api.ConsumerConfig(
                    durable_name=f"c{index}",
                    filter_subject=subject,
                    ack_policy=api.AckPolicy.EXPLICIT,
                ),
            )
        except nats.js.errors.BadRequestError as exc:
            assert exc.err_code == 10026
            assert exc.description == "maximum consumers limit reached"
            return index
    return len(subjects)


async def test_consumers_beyond_max_consumers_are_refused(js_env: JsEnv) -> None:
    """(f) A stream's max_consumers caps the number of queues one process stream serves."""
    topology = Topology.isolated(unique_tag(), initial_queue_limit=3)
    await ensure_topology(js_env.js, topology)
    try:
        subjects = [topology.process_subject(f"q{n}") for n in range(5)]
        assert await _add_consumers(js_env.js, topology.process_stream, subjects) == 3
    finally:
        await delete_topology(js_env.js, topology)


async def test_server_default_caps_consumers_per_stream_at_1000(js_env: JsEnv) -> None:
    """(f) nats-server 2.15 caps a stream that leaves max_consumers unset (-1) at 1000,
    although the account limit reports unlimited; an explicit max_consumers lifts it,
    which is why the topology sets one (``Topology.initial_queue_limit``)."""
    js = js_env.js
    assert (await js.account_info()).limits.max_consumers == -1
    tag = unique_tag().upper()
    unset, explicit = f"DEFAULT_{tag}", f"EXPLICIT_{tag}"
    await js.add_stream(name=unset, subjects=[f"{tag}.unset.*"])
    await js.add_stream(name=explicit, subjects=[f"{tag}.explicit.*"], max_consumers=1100)
    try:
        assert (await js.stream_info(unset)).config.max_consumers == -1
        created = await _add_consumers(js, unset, [f"{tag}.unset.{n}" for n in range(1001)])
        assert created == 1000
        created = await _add_consumers(js, explicit, [f"{tag}.explicit.{n}" for n in range(1001)])
        assert created == 1001
    finally:
        for stream in (unset, explicit):
            await js.delete_stream(stream)


@pytest.mark.nats  # a broker of its own, with limits
async def test_a_streams_consumer_limit_is_raised_in_place_up_to_the_accounts(
    tmp_path: Path,
) -> None:
    """(f'') A stream's max_consumers can be raised by a stream update, with its
    consumers and messages kept; the account's JetStream max_consumers applies to each
    stream (two streams hold that many each) and an update above it is refused (10026).
    """
    with account_limited_server(tmp_path, max_consumers=4) as server:
        nc = await connect(server)
        try:
            js = nc.jetstream()
            assert (await js.account_info()).limits.max_consumers == 4
            await js.add_stream(name="FULL", subjects=["full.*"], max_consumers=2)
            await js.publish("full.0", b"kept")
            assert await _add_consumers(js, "FULL", [f"full.{n}" for n in range(4)]) == 2
            config = (await js.stream_info("FULL")).config
            raised = await js.update_stream(replace(config, max_consumers=4))
            assert (raised.config.max_consumers, raised.state.consumer_count) == (4, 2)
            assert raised.state.messages == 1
            with pytest.raises(nats.js.errors.BadRequestError) as caught:
                await js.update_stream(replace(config, max_consumers=5))
            assert caught.value.err_code == 10026
            # The account's limit is per stream: another stream holds four more.
            await js.add_stream(name="OTHER", subjects=["other.*"])
            assert await _add_consumers(js, "OTHER", [f"other.{n}" for n in range(6)]) == 4
        finally:
            await close(nc)


async def test_a_stale_ack_of_an_earlier_delivery_settles_the_message(js_env: JsEnv) -> None:
    """(h) After ack_wait the server redelivers, yet it still accepts the ack of the first
    delivery: the message is settled and removed while delivery 2 is in hand, the queue
    moves on to its next message, and delivery 2's NAK changes nothing. A slow first
    delivery can therefore finish a message a second delivery is still working on, so
    every step of process must stay idempotent."""
    js, topology = js_env.js, js_env.topology
    await _publish(js, topology, Q1, "A")
    await _publish(js, topology, Q1, "B")
    sub = await _consumer(js, topology, Q1, ack_wait=1.0)

    first = await _must_fetch(sub)
    assert (first.data, first.metadata.num_delivered) == (b"A", 1)
    assert await _fetch_one(sub, NO_MESSAGE_WAIT_S) is None  # not before the ack wait
    second = await _must_fetch(sub, timeout=3.0)  # first neither acked nor extended
    assert (second.data, second.metadata.num_delivered) == (b"A", 2)
    assert second.metadata.sequence.stream == first.metadata.sequence.stream
    assert second.metadata.sequence.consumer > first.metadata.sequence.consumer
    assert (await sub.consumer_info()).num_ack_pending == 1

    await first.ack_sync()  # the stale delivery's ack: accepted, no error

    info = await sub.consumer_info()
    assert (info.num_ack_pending, info.num_redelivered) == (0, 0)
    assert info.ack_floor.stream_seq == first.metadata.sequence.stream
    stream = await js.stream_info(topology.process_stream)
    assert stream.state.messages == 1  # A is gone from the work queue; B remains
    # The barrier is released although delivery 2 of A is still in hand.
    nxt = await _must_fetch(sub, timeout=1.0)
    assert (nxt.data, nxt.metadata.num_delivered) == (b"B", 1)
    await nxt.ack_sync()

    await second.nak()  # would redeliver A at once if the server still tracked it
    assert await _fetch_one(sub, 0.5) is None
    assert (await sub.consumer_info()).num_ack_pending == 0
    assert (await js.stream_info(topology.process_stream)).state.messages == 0

"""Pull requests of many consumers answered on one subscription (``SharedInbox``).

On a real broker: two work-queue consumers fetched through one inbox get their own
messages, a wake ends a parked wait at once, an expiry ends it with nothing, a message
answered to a request nobody waits on any more is kept for the next fetch, and a status
that is not an expiry is raised.
"""

from __future__ import annotations

import asyncio

import nats.js.errors
import pytest
from nats.js import api
from nats_server import connect, unique_tag

from stovepipe_fsm.adapters.jetstream import NatsServer
from stovepipe_fsm.adapters.jetstream.shared_inbox import SharedInbox


async def _stream(js, tag: str) -> str:  # type: ignore[no-untyped-def]
    stream = f"INBOX_{tag.upper()}"
    await js.add_stream(
        name=stream, subjects=[f"{tag}.*"], retention=api.RetentionPolicy.WORK_QUEUE
    )
    for name in ("a", "b"):
        await js.add_consumer(
            stream,
            config=api.ConsumerConfig(
                durable_name=name,
                filter_subject=f"{tag}.{name}",
                ack_policy=api.AckPolicy.EXPLICIT,
                max_ack_pending=1,
            ),
        )
    return stream


async def test_each_consumer_gets_its_own_messages_and_a_wake_ends_the_wait(
    nats_server: NatsServer,
) -> None:
    nc = await connect(nats_server)
    tag = unique_tag()
    js = nc.jetstream()
    inbox = SharedInbox(nc)
    await inbox.open()
    try:
        stream = await _stream(js, tag)
        a, b = inbox.reply_subject("a"), inbox.reply_subject("b")
        parked_b = asyncio.ensure_future(inbox.fetch(stream, "b", b, 60.0))
        await js.publish(f"{tag}.a", b"for a")
        got = await inbox.fetch(stream, "a", a, 60.0)
        assert got is not None and got.data == b"for a"
        await got.ack()
        await asyncio.sleep(0.1)
        assert not parked_b.done()  # b's message has not come: b still waits
        inbox.wake(b)
        assert await asyncio.wait_for(parked_b, 5) is None
        # Ended by the wake, not by its 60 s expiry: the pull request still waits at the
        # broker.
        assert (await js.consumer_info(stream, "b")).num_waiting == 1
        # b's request is still alive at the broker: its answer is kept for the next fetch.
        await js.publish(f"{tag}.b", b"for b")
        await asyncio.sleep(0.2)
        kept = await inbox.fetch(stream, "b", b, 60.0)
        assert kept is not None and kept.data == b"for b"
        await kept.ack()
        # An expiry ends the wait with nothing.
        assert await inbox.fetch(stream, "a", a, 0.3) is None
        with pytest.raises(nats.js.errors.Error):  # no such consumer: not an expiry
            await inbox.fetch(stream, "nobody", inbox.reply_subject("nobody"), 2.0)
    finally:
        await inbox.close()
        await nc.close()

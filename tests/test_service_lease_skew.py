"""Leases hold on replicas whose clocks disagree, on a real nats-server.

A lease is stamped by the replica that admits a head and compared with now by whichever
replica gates the queue next. A replica whose own clock runs 20 s ahead of the others
must not find a lease with 15 s left run out: every replica's times are the broker's.
"""

from __future__ import annotations

import contextlib
import datetime
import time

import pytest
from test_service_support import running_service, wait_for

from stovepipe_fsm.adapters.jetstream.broker_clock import broker_time_ms

QUEUE = "team/app"
LEASE_MS = 15_000
CONFIG = {"defaults": {"gate_wait_delay_ms": 100, "max_validation_ms": LEASE_MS}}
AHEAD_MS = 20_000


class AheadClock:
    """A replica's wall clock running ``ahead_ms`` ahead of the machine's."""

    def __init__(self, ahead_ms: int) -> None:
        self.ahead_ms = ahead_ms

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.ahead_ms


async def test_a_replica_20s_ahead_takes_no_slot_whose_lease_has_not_run_out(js_env) -> None:  # type: ignore[no-untyped-def]
    server, topology = js_env.server, js_env.topology
    async with contextlib.AsyncExitStack() as on_time:
        first = await on_time.enter_async_context(running_service(server, topology, CONFIG))
        building = await first.ingest(QUEUE, "A")
        await first.wait_state(building, "processing")
        async with running_service(server, topology, CONFIG, clock=AheadClock(AHEAD_MS)) as ahead:
            await on_time.aclose()  # from now on only the replica ahead decides
            waiting = await ahead.ingest(QUEUE, "B")

            async def decided() -> bool:
                held = ahead.events.count("held", waiting) >= 2
                return held or await ahead.state(waiting) != "accepted"

            await wait_for(decided, "the replica ahead to decide on B")
            assert await ahead.state(waiting) == "accepted"
            queue = await ahead.queue(QUEUE)
            assert queue.slot_holders == (building,)
            # A lease the replica ahead stamps is the broker's now plus the lease too.
            await ahead.pipeline.record_outcome(building, "succeeded")
            await ahead.wait_state(waiting, "processing")
            ((holder, expires),) = (await ahead.queue(QUEUE)).leases
            assert holder == waiting
            assert abs(expires - (time.time_ns() // 1_000_000 + LEASE_MS)) < AHEAD_MS // 4


def test_the_brokers_time_is_read_to_the_millisecond() -> None:
    noon = int(datetime.datetime(2026, 12, 3, 12, 0, tzinfo=datetime.UTC).timestamp()) * 1000
    assert broker_time_ms("2026-12-03T12:00:00.501648255Z") == noon + 501
    assert broker_time_ms("2026-12-03T13:00:00.5+01:00") == noon + 500
    assert broker_time_ms("2026-12-03T12:00:00Z") == noon
    with pytest.raises(ValueError, match="not an RFC 3339 time"):
        broker_time_ms("yesterday")

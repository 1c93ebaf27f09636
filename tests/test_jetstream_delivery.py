"""JetStreamDelivery: how the Delivery port maps onto a JetStream message."""

from __future__ import annotations

from typing import Any

from stovepipe_fsm.adapters.jetstream.delivery import JetStreamDelivery


class RecordingMsg:
    """Stands where a nats Msg would; records what the delivery asked of the broker."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def ack(self) -> None:
        self.calls.append(("ack", None))

    async def nak(self, delay: float | None = None) -> None:
        self.calls.append(("nak", delay))

    async def in_progress(self) -> None:
        self.calls.append(("in_progress", None))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_in_progress_reaches_the_broker_only_past_half_the_ack_wait() -> None:
    msg, clock = RecordingMsg(), Clock()
    delivery = JetStreamDelivery(msg, "q", "request/q/1", ack_wait_s=30, clock=clock)  # type: ignore[arg-type]
    await delivery.in_progress()  # fresh message: the deadline is 30 s away
    clock.now += 14.9
    await delivery.in_progress()
    assert msg.calls == []
    clock.now += 0.2  # past half the wait: extend
    await delivery.in_progress()
    assert msg.calls == [("in_progress", None)]
    clock.now += 10  # the deadline was just renewed
    await delivery.in_progress()
    clock.now += 5.1
    await delivery.in_progress()
    assert msg.calls == [("in_progress", None)] * 2
    assert delivery.extensions == 2


async def test_without_an_ack_wait_every_in_progress_is_sent() -> None:
    msg = RecordingMsg()
    delivery = JetStreamDelivery(msg, "q", "request/q/1")  # type: ignore[arg-type]
    await delivery.in_progress()
    await delivery.in_progress()
    assert msg.calls == [("in_progress", None)] * 2


async def test_hold_is_a_nak_with_the_delay_in_seconds_and_ack_is_an_ack() -> None:
    msg = RecordingMsg()
    delivery = JetStreamDelivery(msg, "q", "request/q/1")  # type: ignore[arg-type]
    await delivery.hold(2500)
    assert msg.calls == [("nak", 2.5)] and delivery.outcome == "held"
    other = JetStreamDelivery(msg, "q", "request/q/2")  # type: ignore[arg-type]
    await other.ack()
    assert msg.calls[-1] == ("ack", None) and other.outcome == "acked"

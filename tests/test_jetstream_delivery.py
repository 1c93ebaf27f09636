"""JetStreamDelivery, how the Delivery port maps onto a JetStream message, and how the
consumer settles the message once the flow has decided."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from stovepipe_fsm.adapters.jetstream import Topology
from stovepipe_fsm.adapters.jetstream.codec import WorkMessage, encode_work
from stovepipe_fsm.adapters.jetstream.consumer import ProcessConsumer
from stovepipe_fsm.adapters.jetstream.delivery import JetStreamDelivery
from stovepipe_fsm.adapters.jetstream.outcome_consumer import OutcomeConsumer
from stovepipe_fsm.adapters.jetstream.outcomes import OutcomeMessage, encode_outcome
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.domain.entities import QueueConfig
from stovepipe_fsm.domain.errors import Retryable
from stovepipe_fsm.domain.settle import Attempt


class RecordingMsg:
    """Stands where a nats Msg would; records what the delivery asked of the broker."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.data = b""
        self.metadata: Any = None

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


class Decides:
    """A controller that decides ``attempt`` for every delivery and touches nothing."""

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self.seen: list[Any] = []

    async def handle(self, delivery: Any) -> Attempt:
        self.seen.append(delivery)
        return self.attempt


class Ledger:
    """The attempts ledger of a message never failed: nothing to read or forget."""

    async def forget(self, seq: int) -> None:
        raise AssertionError("a first delivery has no failures to forget")


def consumer(handler: Decides, events: list[tuple[str, str]]) -> ProcessConsumer:
    config = StaticConfigStore(QueueConfig.of(max_attempts=3))
    # Settling a decided delivery asks nothing of the JetStream context.
    return ProcessConsumer(
        None,  # type: ignore[arg-type]
        Topology.isolated("settle"),
        "q",
        handler=handler,
        config=config,
        ledger=Ledger(),  # type: ignore[arg-type]
        terminations=None,  # type: ignore[arg-type]
        observer=lambda event, queue, request_id, detail: events.append((event, request_id)),
    )


def work_msg() -> RecordingMsg:
    msg = RecordingMsg()
    msg.data = encode_work(WorkMessage("q", "request/q/1"))
    msg.metadata = SimpleNamespace(num_delivered=1, sequence=SimpleNamespace(stream=7))
    return msg


async def test_hold_is_a_nak_with_the_delay_in_seconds_and_ack_is_an_ack() -> None:
    # The flow only decides; the consumer performs what the settle policy makes of it.
    events: list[tuple[str, str]] = []
    held = Decides(Attempt.held(2500))
    msg = work_msg()
    await consumer(held, events).settle(msg)  # type: ignore[arg-type]
    assert msg.calls == [("nak", 2.5)] and events == [("held", "request/q/1")]
    assert [d.request_id for d in held.seen] == ["request/q/1"]
    other = work_msg()
    await consumer(Decides(Attempt.acked()), events).settle(other)  # type: ignore[arg-type]
    assert other.calls == [("ack", None)] and events[-1] == ("acked", "request/q/1")


# --- the outcome consumer settles through the same policy ----------------------------


class OutcomeMsg(RecordingMsg):
    def __init__(self, delivered: int) -> None:
        super().__init__()
        topology = Topology.isolated("settle")
        self.subject = topology.outcome_subject("q")
        self.data = encode_outcome(OutcomeMessage("q", "request/q/1", "failed"))
        self.metadata = SimpleNamespace(
            num_delivered=delivered, sequence=SimpleNamespace(stream=9)
        )


def outcome_consumer(record: Any, events: list[tuple[str, str]]) -> OutcomeConsumer:
    return OutcomeConsumer(
        None,  # type: ignore[arg-type]
        Topology.isolated("settle"),
        record,
        observer=lambda event, queue, request_id, detail: events.append((event, detail)),
        retry_base_s=0.5,
        retry_cap_s=4.0,
    )


async def test_an_outcome_recorded_is_acked_and_a_transient_failure_retried_forever() -> None:
    events: list[tuple[str, str]] = []

    async def recorded(request_id: str, outcome: str) -> None:
        return None

    async def down(request_id: str, outcome: str) -> None:
        raise Retryable("store unavailable")

    msg = OutcomeMsg(delivered=1)
    await outcome_consumer(recorded, events).settle(msg)  # type: ignore[arg-type]
    assert msg.calls == [("ack", None)] and events == [("recorded", "failed")]
    for delivered, delay in ((1, 0.5), (2, 1.0), (500, 4.0)):  # never given up on
        msg = OutcomeMsg(delivered)
        await outcome_consumer(down, events).settle(msg)  # type: ignore[arg-type]
        assert msg.calls == [("nak", delay)]
        assert events[-1] == ("outcome_retry", "Retryable: store unavailable")

"""A consumer create refused for the stream's limit, decided without a broker.

The real broker's side of this is covered on a single node and on a cluster
(tests/test_service_consumer.py, tests/cluster/test_cluster_limits.py); what a real
broker cannot be made to do on demand is refuse every try while reporting room, or
report a limit another replica raised a moment ago. A stand-in connection answers
those here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import nats.errors
import nats.js.errors
import pytest
from nats.js import api

from stovepipe_fsm.adapters.jetstream import consumer_limit, durable_consumer
from stovepipe_fsm.adapters.jetstream.consumer_limit import wanted_limit
from stovepipe_fsm.adapters.jetstream.durable_consumer import (
    CREATE_ATTEMPTS,
    TRANSIENT_ATTEMPTS,
    ConsumerLimitReached,
    ensure_pull_consumer,
)
from stovepipe_fsm.domain.errors import Retryable


@dataclass
class _Reply:
    data: bytes


@dataclass
class _Limits:
    max_consumers: int


@dataclass
class _Account:
    limits: _Limits


@dataclass
class FullStream:
    """A stream that refuses the first ``refusals`` creates for its consumer limit and
    reports ``consumers`` consumers under ``max_consumers``."""

    consumers: int
    max_consumers: int
    refusals: int
    account_limit: int = -1
    creates: int = 0
    updates: list[int] = field(default_factory=list)
    _prefix: str = "$JS.API"

    @property
    def _nc(self) -> FullStream:
        return self

    async def consumer_info(self, stream: str, name: str) -> None:
        raise nats.js.errors.NotFoundError(code=404, err_code=10014, description="not found")

    async def add_consumer(self, stream: str, config: api.ConsumerConfig) -> None:
        self.creates += 1
        if self.creates <= self.refusals:
            raise nats.js.errors.BadRequestError(
                code=400, err_code=10026, description="maximum consumers limit reached"
            )

    async def account_info(self) -> _Account:
        return _Account(_Limits(self.account_limit))

    async def request(self, subject: str, body: bytes, timeout: float) -> _Reply:
        if ".STREAM.INFO." in subject:
            info = {
                "config": {"name": "S", "max_consumers": self.max_consumers, "kept": True},
                "state": {"consumer_count": self.consumers},
            }
            return _Reply(json.dumps(info).encode())
        config: dict[str, Any] = json.loads(body)
        assert config["kept"] is True  # every other field goes back as it was read
        self.updates.append(config["max_consumers"])
        self.max_consumers = config["max_consumers"]
        return _Reply(json.dumps({"config": config}).encode())


CONFIG = api.ConsumerConfig(durable_name="process-q", filter_subject="p.q")
CREATED = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(durable_consumer, "CREATE_PAUSE_S", 0.0)


async def test_a_full_stream_is_raised_once_and_the_create_tried_again() -> None:
    stream = FullStream(consumers=2, max_consumers=2, refusals=1)
    await ensure_pull_consumer(stream, "S", CONFIG)  # type: ignore[arg-type]
    assert stream.updates == [1002] and stream.creates == 2


async def test_a_limit_already_raised_elsewhere_is_not_raised_again() -> None:
    stream = FullStream(consumers=3, max_consumers=1002, refusals=2)
    await ensure_pull_consumer(stream, "S", CONFIG)  # type: ignore[arg-type]
    assert stream.updates == [] and stream.creates == 3


async def test_a_count_behind_the_brokers_still_raises_the_refused_limit() -> None:
    """On a cluster the reported count lags: refused at a limit of 2 with 1 reported."""
    stream = FullStream(consumers=1, max_consumers=2, refusals=1)
    await ensure_pull_consumer(stream, "S", CONFIG)  # type: ignore[arg-type]
    assert stream.updates == [1002]


async def test_refusals_while_the_stream_has_room_give_up_saying_so() -> None:
    stream = FullStream(consumers=3, max_consumers=1002, refusals=CREATE_ATTEMPTS)
    with pytest.raises(ConsumerLimitReached, match=r"5 times .* although it had room"):
        await ensure_pull_consumer(stream, "S", CONFIG)  # type: ignore[arg-type]
    assert stream.creates == CREATE_ATTEMPTS


async def test_at_the_accounts_limit_the_refusal_names_it() -> None:
    stream = FullStream(consumers=5, max_consumers=5, refusals=1, account_limit=5)
    with pytest.raises(ConsumerLimitReached, match=r"account's JetStream consumer limit \(5\)"):
        await ensure_pull_consumer(stream, "S", CONFIG)  # type: ignore[arg-type]
    assert stream.updates == [] and stream.creates == 1


@dataclass
class SlowCluster:
    """A cluster that leaves the consumer requests numbered in ``unanswered`` without an
    answer in time (carrying out a create all the same, as a server whose reply is late
    does)."""

    unanswered: set[int]
    asks: int = 0
    creates: int = 0
    exists: bool = False

    async def consumer_info(self, stream: str, name: str) -> api.ConsumerInfo:
        self._ask()
        if not self.exists:
            raise nats.js.errors.NotFoundError(code=404, err_code=10014, description="not found")
        return api.ConsumerInfo(name=name, stream_name=stream, config=CONFIG, created=CREATED)

    async def add_consumer(self, stream: str, config: api.ConsumerConfig) -> None:
        self.creates += 1
        self.exists = True  # done, whether or not the answer comes in time
        self._ask()

    def _ask(self) -> None:
        self.asks += 1
        if self.asks in self.unanswered:
            raise nats.errors.TimeoutError


async def test_a_consumer_request_without_an_answer_is_asked_again() -> None:
    # The first try's lookup times out; the second try's create is done but its answer
    # lost; the third try finds the consumer there and creates nothing more.
    cluster = SlowCluster(unanswered={1, 3})
    await ensure_pull_consumer(cluster, "S", CONFIG)  # type: ignore[arg-type]
    assert cluster.exists and cluster.creates == 1 and cluster.asks == 4


async def test_a_broker_that_never_answers_fails_after_the_last_try() -> None:
    cluster = SlowCluster(unanswered=set(range(1, 100)))
    with pytest.raises(Retryable, match=r"ensure consumer S/process-q: TimeoutError"):
        await ensure_pull_consumer(cluster, "S", CONFIG)  # type: ignore[arg-type]
    assert cluster.asks == TRANSIENT_ATTEMPTS  # one lookup per try, none answered


def test_the_wanted_limit_doubles_adds_at_least_1000_and_stops_at_the_account() -> None:
    assert wanted_limit(2, 2, -1) == 2 + consumer_limit.MIN_GROWTH
    assert wanted_limit(10_000, 10_000, -1) == 20_000
    assert wanted_limit(10_000, 10_000, 12_000) == 12_000
    assert wanted_limit(5, 50_000, -1) == 50_000  # never lowered

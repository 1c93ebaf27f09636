"""The attempts ledger on a real nats-server: the settle policy decides on the stored
count, a retry's count is written back, and a lost race makes the policy decide again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nats.js.kv import KeyValue
from nats_server import JsEnv

from stovepipe_fsm.adapters.jetstream.attempts import AttemptsLedger, attempts_key
from stovepipe_fsm.domain.errors import NonRetryable, Retryable
from stovepipe_fsm.domain.settle import Attempt, SettleKind, Settlement, settle

SEQ = 41


def policy(exc: Exception, seen: list[int]) -> Callable[[int], Settlement]:
    def decide(failures: int) -> Settlement:
        seen.append(failures)
        return settle(Attempt.raised(exc), failures=failures, max_attempts=3)

    return decide


async def stored(kv: KeyValue) -> int:
    return int((await kv.get(attempts_key("process", SEQ))).value or b"0")


class RacingKv:
    """The bucket, but another replica counts a failure between our read and our write."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.races = 1

    async def get(self, key: str) -> Any:
        return await self.kv.get(key)

    async def _race(self, key: str) -> None:
        if self.races:
            self.races -= 1
            await self.kv.put(key, b"2")

    async def create(self, key: str, value: bytes) -> int:
        await self._race(key)
        return await self.kv.create(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        await self._race(key)
        return await self.kv.update(key, value, last=last)


async def test_retries_count_up_and_the_budget_ends_in_a_dead_letter(js_env: JsEnv) -> None:
    kv = await js_env.js.key_value(js_env.topology.attempts_bucket)
    ledger, seen = AttemptsLedger(kv), []
    down = policy(Retryable("source control unavailable"), seen)
    first = await ledger.decide(SEQ, down)
    second = await ledger.decide(SEQ, down)
    assert [(d.kind, d.failures) for d in (first, second)] == [
        (SettleKind.RETRY, 1),
        (SettleKind.RETRY, 2),
    ]
    assert await stored(kv) == 2
    third = await ledger.decide(SEQ, down)
    assert (third.kind, third.failures) == (SettleKind.DEAD_LETTER, 3)
    assert await stored(kv) == 2, "a dead letter writes no count: its message is settled"
    assert seen == [0, 1, 2]
    await ledger.forget(SEQ)
    assert await ledger.decide(SEQ, down) == first, "a forgotten count starts again"


async def test_a_non_retryable_failure_reports_the_count_without_writing(
    js_env: JsEnv,
) -> None:
    kv = await js_env.js.key_value(js_env.topology.attempts_bucket)
    ledger, seen = AttemptsLedger(kv), []
    await ledger.decide(SEQ, policy(Retryable("down"), seen))
    decision = await ledger.decide(SEQ, policy(NonRetryable("request gone"), seen))
    assert (decision.kind, decision.failures) == (SettleKind.DEAD_LETTER, 1)
    assert decision.reason == "NonRetryable: request gone"
    assert await stored(kv) == 1


async def test_a_lost_race_decides_again_on_the_fresh_count(js_env: JsEnv) -> None:
    kv = await js_env.js.key_value(js_env.topology.attempts_bucket)
    racing = RacingKv(kv)
    ledger, seen = AttemptsLedger(racing), []  # type: ignore[arg-type]
    decision = await ledger.decide(SEQ, policy(Retryable("down"), seen))
    # read 0, lost to the other replica's 2, read 2 again: the third failure gives up
    assert seen == [0, 2]
    assert (decision.kind, decision.failures) == (SettleKind.DEAD_LETTER, 3)
    assert racing.races == 0

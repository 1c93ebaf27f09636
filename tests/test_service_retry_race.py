"""``retry`` racing a new head on a real nats-server: whoever wins, trunk validation never
moves backwards - the new head stays the queue's latest and is validated."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from test_service_support import running_service, wait_for

from stovepipe_fsm.domain.errors import IllegalOperation
from stovepipe_fsm.domain.ids import compare_request_id
from stovepipe_fsm.pipeline.verbs import RetryResult, retry

Q = "monorepo/main"
CONFIG = {"defaults": {"max_concurrent": 1, "gate_wait_delay_ms": 100, "max_attempts": 2}}
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWX"


async def test_a_retry_racing_a_new_head_never_becomes_latest(js_env) -> None:  # type: ignore[no-untyped-def]
    async with running_service(js_env.server, js_env.topology, CONFIG) as run:
        pipeline = run.pipeline
        stages = pipeline.stages

        async def idle() -> bool:
            return (await run.queue(Q)).slot_holders == ()

        accepted = 0
        pairs = zip(LETTERS[::2], LETTERS[1::2], strict=True)
        for round_, (old_uri, new_uri) in enumerate(pairs):
            old = await run.ingest(Q, old_uri)
            await run.wait_state(old, "processing")
            await pipeline.stages.record.complete(old, "failed")
            await wait_for(idle, "the failed head's slot is free")

            retried, new = await asyncio.gather(
                retry(stages.lifecycle, stages.ingest, stages.ingest.uri_index, old),
                _later(round_ * 0.002, run.ingest(Q, new_uri)),
                return_exceptions=True,
            )
            assert isinstance(new, str), new
            assert isinstance(retried, RetryResult | IllegalOperation), retried
            if isinstance(retried, RetryResult):
                accepted += 1
                assert compare_request_id(Q, retried.request_id, new) < 0
            latest = (await run.queue(Q)).latest_request_id
            assert latest == new, f"the retry of {old_uri} took latest from {new_uri}"
            if isinstance(retried, RetryResult):  # admitted before the new head, or not
                again = retried.request_id

                async def settled(again: str = again) -> bool:
                    return await run.state(again) in ("processing", "superseded")

                await wait_for(settled, f"{again} admitted or superseded")
                if await run.state(again) == "processing":
                    await pipeline.stages.record.complete(again, "failed")
            await run.wait_state(new, "processing")
            await pipeline.stages.record.complete(new, "succeeded")
            await wait_for(idle, "the new head's slot is free")
        # The staggered starts let the retry win some rounds and lose others.
        print(f"retries accepted: {accepted} of {len(LETTERS) // 2}")


async def _later(seconds: float, step: Awaitable[str]) -> str:
    await asyncio.sleep(seconds)
    return await step

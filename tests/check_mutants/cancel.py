"""A mutation of the operator's ``cancel`` the model checker must catch.

The verb ends a waiting head by compare-and-set on the row it read, so a cancel racing
an admission has one winner. :func:`blind_cancel` drops that: it writes the head as it
read it while waiting, withdrawn, over whatever the row holds now - the write of a
cancel that read the row before an admission and wrote after it, without the CAS that
would have refused it. The checker's cancel lands before or after an admission's write,
so the lost race is one of its interleavings.
"""

from __future__ import annotations

from dataclasses import replace

from stovepipe_fsm.domain.entities import NO_STRATEGY, Queue
from stovepipe_fsm.domain.errors import IllegalOperation
from stovepipe_fsm.pipeline.verbs import CancelResult
from stovepipe_fsm.ports.clock import Clock
from stovepipe_fsm.ports.decision_trail import DecisionTrail
from stovepipe_fsm.process.lifecycle import RequestLifecycle, update_queue


async def blind_cancel(
    lifecycle: RequestLifecycle,
    trail: DecisionTrail | None,
    clock: Clock,
    request_id: str,
    *,
    by: str = "",
    policy_hash: str = "",
) -> CancelResult:
    """``cancel`` without its compare-and-set: the waiting row is written back, withdrawn,
    whatever the admission wrote since (the stored version is only read to overwrite it),
    by hand instead of through the lifecycle."""
    requests, queues = lifecycle.requests, lifecycle.queues
    current = await requests.get(request_id)
    if lifecycle.is_terminal(current):
        raise IllegalOperation(f"request {request_id} already ended as {current.state}")
    (withdrawn,) = lifecycle.roles.withdrawn_states
    waiting = replace(current, build_strategy=NO_STRATEGY, base_uri="", admitted_at_ms=0)
    ended = replace(waiting, state=withdrawn, ended_at_ms=clock.now_ms())
    await requests.update(ended, current.version, current.version + 1)

    def give_back(queue: Queue) -> Queue:
        return queue.without_holder(request_id)

    await update_queue(queues, current.queue, give_back)
    return CancelResult(ended.with_version(current.version + 1), cancelled=True)

"""The operator verbs about one request: ``cancel`` a waiting head, ``retry`` an ended one.

Neither loads a policy: what they need of the request machine comes as a
:class:`VerbPolicy`, which the commands build from the policy record the running service
wrote (an operator command never reads ``machines/``). Every write is a compare-and-set:

- ``cancel`` moves a head still in the initial state to the state the policy's optional
  ``withdraw`` role leads to, by CAS on the request row's version. The process stage
  admits by the same CAS, so a cancel racing an admission has exactly one winner: a
  cancel that loses re-reads the row and finds the head running (refused: a running
  build is never preempted); an admission that loses gives its slot claim back and its
  redelivery acks the ended head. A slot the head claimed before losing is freed here
  as well (the release is idempotent).
- ``retry`` ingests a new request for an ended head's commit (:meth:`Ingest.again`),
  linked by ``retry_of``; the dedup entry is re-pointed by CAS, so running it twice (or
  twice at once) makes one new request, and the second run answers with it.

Each appends one ``operator`` record to the decision trail of the request, keyed by the
verb, so a repeated verb is one record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ..domain.entities import Queue, Request
from ..domain.errors import IllegalOperation, NotFound, VersionMismatch
from ..domain.ids import compare_request_id
from ..domain.trail import OPERATOR, TrailRecord, detail
from ..ports.clock import Clock
from ..ports.stores import QueueStore, RequestStore, UriIndex
from ..ports.trail import DecisionTrail
from ..process.lifecycle import update_queue
from .ingest import Ingest

#: How often ``cancel`` re-reads a row that changed under it before giving up.
CAS_ATTEMPTS = 8


@dataclass(frozen=True)
class VerbPolicy:
    """What the verbs need of the request machine, from the policy in force.

    ``withdraw`` is the trigger of the optional role (``""``: the policy declares none)
    and ``withdrawn`` the state it leads to; ``retryable`` the ended states a head may
    be retried from (every build outcome but the green one, and ``withdrawn``).
    """

    hash: str
    initial: str
    terminal: frozenset[str]
    withdraw: str = ""
    withdrawn: str = ""
    retryable: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CancelResult:
    request: Request
    #: False: it had already ended as the cancel would have ended it (a repeat).
    cancelled: bool


@dataclass(frozen=True)
class RetryResult:
    old: Request
    request_id: str
    #: False: an earlier retry of ``old`` made ``request_id`` (a repeat).
    created: bool
    published: bool


def _time_text(at_ms: int) -> str:
    if not at_ms:
        return "at an unrecorded time"
    seconds, millis = divmod(at_ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


async def cancel(
    policy: VerbPolicy,
    requests: RequestStore,
    queues: QueueStore,
    trail: DecisionTrail | None,
    clock: Clock,
    request_id: str,
    *,
    by: str = "",
) -> CancelResult:
    """End the waiting head ``request_id`` through the policy's withdraw transition.

    ``IllegalOperation`` when the policy has no withdraw role, the head is running, or it
    ended otherwise than the withdrawal ends it; ``NotFound`` for no such request.
    """
    if not policy.withdraw or not policy.withdrawn:
        raise IllegalOperation(
            f"the policy in force ({policy.hash or 'unhashed'}) declares no withdraw "
            "transition (role 'withdraw' in request.yaml), so no waiting head can be "
            "cancelled; declare one (docs/machines.md, Roles and outcomes)"
        )
    for _ in range(CAS_ATTEMPTS):
        request = await _load(requests, request_id)
        if request.state == policy.withdrawn:
            if not request.build_strategy:  # never admitted: a cancel ended it
                # The same record as the first cancel wrote (one record, even if that
                # one's write was lost to a crash right after the row's).
                await _note(trail, request, "cancel", by, _withdrawn(policy), clock)
            return CancelResult(request, cancelled=False)
        if request.state in policy.terminal:
            raise IllegalOperation(
                f"request {request_id} already ended as {request.state}; there is nothing "
                "to cancel"
            )
        if request.state != policy.initial:
            raise IllegalOperation(
                f"request {request_id} is running ({request.state}, admitted "
                f"{_time_text(request.admitted_at_ms)}); a running build is never preempted"
            )
        ended = replace(request, state=policy.withdrawn, ended_at_ms=clock.now_ms())
        try:
            await requests.update(ended, request.version, request.version + 1)
        except VersionMismatch:
            continue  # admitted, superseded or cancelled meanwhile: decide on what it is now
        ended = ended.with_version(request.version + 1)
        # A claim the gate made before its admission lost to this write is given back.
        await _give_back_claim(queues, ended)
        await _note(trail, ended, "cancel", by, _withdrawn(policy), clock)
        return CancelResult(ended, cancelled=True)
    raise VersionMismatch(f"request {request_id!r} kept changing while cancelling it")


async def _load(requests: RequestStore, request_id: str) -> Request:
    try:
        return await requests.get(request_id)
    except NotFound:
        raise NotFound(f"no request {request_id!r}") from None


async def _give_back_claim(queues: QueueStore, ended: Request) -> None:
    def change(queue: Queue) -> Queue:
        return queue.without_holder(ended.id)

    await update_queue(queues, ended.queue, change)


def _withdrawn(policy: VerbPolicy) -> str:
    return f"withdrawn while waiting ({policy.initial} -> {policy.withdrawn})"


async def retry(
    policy: VerbPolicy,
    ingest: Ingest,
    uri_index: UriIndex,
    request_id: str,
    *,
    by: str = "",
    verb: str = "retry",
) -> RetryResult:
    """A new request for the commit of ``request_id``, which ended failed or cancelled.

    ``verb`` is what the trail record says ran (``dlq replay`` retries this way too).
    ``IllegalOperation`` when it has not ended, ended otherwise (succeeded, superseded),
    or a newer head of its queue was ingested since (validating an older commit again
    would move trunk validation backwards); ``NotFound`` for no such request.
    """
    requests, queues = ingest.requests, ingest.queues
    old = await _load(requests, request_id)
    if old.state not in policy.terminal:
        raise IllegalOperation(
            f"request {request_id} is {old.state}, it has not ended; only a head that "
            f"ended ({', '.join(sorted(policy.retryable)) or 'failed or cancelled'}) is "
            "retried"
        )
    current = await uri_index.get(old.queue, old.uri)
    if current not in (None, old.id):
        try:
            again: Request | None = await requests.get(current)
        except NotFound:
            again = None  # re-pointed by a retry that crashed before its row: heal it
        if again is not None and again.retry_of != old.id:
            raise IllegalOperation(
                f"the commit {old.uri} of {request_id} was ingested again since, as "
                f"{current}; retry that one if it ended"
            )
        return await _retried(ingest, old, by, verb)
    latest = (await queues.get(old.queue)).latest_request_id
    if latest and compare_request_id(old.queue, latest, old.id) > 0:
        try:
            newer = (await requests.get(latest)).state
        except NotFound:
            newer = ""  # pruned: it ended long ago
        then = (
            "it will be validated instead"
            if newer and newer not in policy.terminal
            else f"it ended {newer or 'and was pruned'}: retry that one instead"
        )
        raise IllegalOperation(
            f"a newer head {latest} was ingested since {request_id}; {then} (retrying an "
            "older commit would move trunk validation backwards)"
        )
    if old.state not in policy.retryable:
        raise IllegalOperation(
            f"request {request_id} ended {old.state}; only a head that ended "
            f"{' or '.join(sorted(policy.retryable)) or 'failed or cancelled'} is retried"
        )
    return await _retried(ingest, old, by, verb)


async def _retried(ingest: Ingest, old: Request, by: str, verb: str) -> RetryResult:
    result = await ingest.again(old)
    what = f"retried as {result.request_id}"
    await _note(ingest.trail, old, verb, by, what, ingest.clock, retry=result.request_id)
    return RetryResult(old, result.request_id, result.created, result.published)


async def _note(
    trail: DecisionTrail | None,
    request: Request,
    verb: str,
    by: str,
    what: str,
    clock: Clock,
    **more: str,
) -> None:
    if trail is None:
        return
    pairs = detail(verb=verb, by=by or "operator", what=what, **more)
    record = TrailRecord(
        OPERATOR, request.queue, request.id, clock.now_ms(), detail=pairs, tag=verb
    )
    await trail.append(record)

"""The operator verbs about one request: ``cancel`` a waiting head, ``retry`` an ended one.

Neither loads a policy: both run on a :class:`~..process.lifecycle.RequestLifecycle` over
the request machine the running service recorded (an operator command never reads
``machines/``), and neither writes a request's state or a queue row's slot holders
itself:

- ``cancel`` fires the policy's optional ``withdraw`` role on a head still in the initial
  state, through :meth:`RequestLifecycle.apply`: the machine decides whether it may (a
  withdraw its conditions refuse is refused), the write is a compare-and-set on the
  request row's version, and the lifecycle frees a slot the head holds. The process stage
  admits by the same CAS, so a cancel racing an admission has exactly one winner: a
  cancel that loses re-reads the row and finds the head running (refused: a running
  build is never preempted); an admission that loses gives its slot claim back and its
  redelivery acks the ended head. A slot the head claimed before losing is freed with
  the withdrawal (the release is idempotent).
- ``retry`` ingests a new request for an ended head's commit (:meth:`Ingest.again`),
  linked by ``retry_of``; the dedup entry is re-pointed by CAS, so running it twice (or
  twice at once) makes one new request, and the second run answers with it.

Each appends one ``operator`` record to the decision trail of the request, keyed by the
verb, so a repeated verb is one record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..domain.entities import Request
from ..domain.errors import IllegalOperation, NotFound, VersionMismatch
from ..domain.ids import compare_request_id
from ..domain.trail_record import OPERATOR, TrailRecord, detail
from ..ports.clock import Clock
from ..ports.decision_trail import DecisionTrail
from ..ports.stores import RequestStore, UriIndex
from ..process.gate import EVERY_HEAD
from ..process.lifecycle import IllegalTransition, RequestLifecycle
from ..views.explain import clock_text
from .ingest import Ingest


def queue_coalesces(policy_coalesces: bool, parameters: Mapping[str, object]) -> bool:
    """Whether a queue supersedes older heads: its policy's gate supersedes, and the
    queue does not keep every head (``every_head``, a release queue validating each)."""
    return policy_coalesces and not parameters.get(EVERY_HEAD, False)


#: How often ``cancel`` re-reads a row that changed under it before giving up.
CAS_ATTEMPTS = 8


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


async def cancel(
    lifecycle: RequestLifecycle,
    trail: DecisionTrail | None,
    clock: Clock,
    request_id: str,
    *,
    by: str = "",
    policy_hash: str = "",
) -> CancelResult:
    """End the waiting head ``request_id`` through the policy's withdraw transition.

    ``policy_hash`` names the policy the lifecycle's machine is (for the refusals).
    ``IllegalOperation`` when the policy has no withdraw role, the head is running, it
    ended otherwise than the withdrawal ends it, or the machine refuses the withdrawal;
    ``NotFound`` for no such request.
    """
    roles = lifecycle.roles
    if not roles.withdraw:
        raise IllegalOperation(
            f"the policy in force ({policy_hash or 'unhashed'}) declares no withdraw "
            "transition (role 'withdraw' in request.yaml), so no waiting head can be "
            "cancelled; declare one (docs/machines.md, Roles and outcomes)"
        )
    for _ in range(CAS_ATTEMPTS):
        request = await _load(lifecycle.requests, request_id)
        if request.state in roles.withdrawn_states:
            if not request.build_strategy:  # never admitted: a cancel ended it
                # The same record as the first cancel wrote (one record, even if that
                # one's write was lost to a crash right after the row's).
                what = _withdrawn(roles.initial, request.state)
                await _note(trail, request, "cancel", by, what, clock)
            return CancelResult(request, cancelled=False)
        if lifecycle.is_terminal(request):
            raise IllegalOperation(
                f"request {request_id} already ended as {request.state}; there is nothing "
                "to cancel"
            )
        if request.state != roles.initial:
            raise IllegalOperation(
                f"request {request_id} is running ({request.state}, admitted "
                f"{_admitted_at(request)}); a running build is never preempted"
            )
        try:
            # The lifecycle also gives back a claim the gate made before its admission
            # lost to this write.
            ended = await lifecycle.apply(request, roles.withdraw)
        except IllegalTransition as refused:
            raise IllegalOperation(
                f"request {request_id} cannot be withdrawn: the policy in force "
                f"({policy_hash or 'unhashed'}) refuses it ({refused})"
            ) from None
        except VersionMismatch:
            continue  # admitted, superseded or cancelled meanwhile: decide on what it is now
        what = _withdrawn(request.state, ended.state)
        await _note(trail, ended, "cancel", by, what, clock)
        return CancelResult(ended, cancelled=True)
    raise VersionMismatch(f"request {request_id!r} kept changing while cancelling it")


async def _load(requests: RequestStore, request_id: str) -> Request:
    try:
        return await requests.get(request_id)
    except NotFound:
        raise NotFound(f"no request {request_id!r}") from None


def _admitted_at(request: Request) -> str:
    at_ms = request.admitted_at_ms
    return clock_text(at_ms) if at_ms else "at an unrecorded time"


def _withdrawn(source: str, dest: str) -> str:
    return f"withdrawn while waiting ({source} -> {dest})"


async def retry(
    lifecycle: RequestLifecycle,
    ingest: Ingest,
    uri_index: UriIndex,
    request_id: str,
    *,
    by: str = "",
    verb: str = "retry",
    coalesces: bool = True,
) -> RetryResult:
    """A new request for the commit of ``request_id``, which ended failed or cancelled.

    ``verb`` is what the trail record says ran (``dlq replay`` retries this way too).
    ``IllegalOperation`` when it is a probe of a culprit search, has not ended, ended
    otherwise (succeeded, superseded), or a newer head of its queue was ingested since
    (validating an older commit again would move trunk validation backwards);
    ``NotFound`` for no such request. Where the
    queue does not ``coalesce`` (:func:`queue_coalesces`: it validates every head), a
    newer head refuses nothing.
    """
    requests, queues = ingest.requests, ingest.queues
    retryable = lifecycle.roles.retryable_states
    old = await _load(requests, request_id)
    if old.probe_of:
        raise IllegalOperation(
            f"request {request_id} is a probe build of the culprit search for "
            f"{old.probe_of}, not a head; the search builds again what it needs"
        )
    if not lifecycle.is_terminal(old):
        raise IllegalOperation(
            f"request {request_id} is {old.state}, it has not ended; only a head that "
            f"ended ({', '.join(sorted(retryable)) or 'failed or cancelled'}) is "
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
        return await _retried(ingest, old, by, verb, coalesces)
    latest = (await queues.get(old.queue)).latest_request_id
    if coalesces and latest and compare_request_id(old.queue, latest, old.id) > 0:
        try:
            newer = (await requests.get(latest)).state
        except NotFound:
            newer = ""  # pruned: it ended long ago
        then = (
            "it will be validated instead"
            if newer and not lifecycle.machine.is_terminal(newer)
            else f"it ended {newer or 'and was pruned'}: retry that one instead"
        )
        raise IllegalOperation(
            f"a newer head {latest} was ingested since {request_id}; {then} (retrying an "
            "older commit would move trunk validation backwards)"
        )
    if old.state not in retryable:
        raise IllegalOperation(
            f"request {request_id} ended {old.state}; only a head that ended "
            f"{' or '.join(sorted(retryable)) or 'failed or cancelled'} is retried"
        )
    return await _retried(ingest, old, by, verb, coalesces)


async def _retried(
    ingest: Ingest, old: Request, by: str, verb: str, coalesces: bool
) -> RetryResult:
    result = await ingest.again(old, newest=coalesces)
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
    pairs, at = detail(verb=verb, by=by or "operator", what=what, **more), clock.now_ms()
    await trail.append(TrailRecord(OPERATOR, request.queue, request.id, at, detail=pairs, tag=verb))

"""The service's side of the outcome stream: each reported build outcome, recorded once.

One durable pull consumer (``record-outcomes``) on the outcome stream, shared by every
replica. Each message is decoded (:func:`.outcomes.decode_outcome`), recorded with the
policy in force (``record(request_id, outcome)``) and settled as the settle policy
(:func:`stovepipe_fsm.domain.settle.settle`, with no ``max_attempts``) decides; this
consumer only says which refusals are final (:func:`refused_for_good`) and performs:

- recorded (or found already recorded: a redelivery, a re-publish), or moot because a
  newer head preempted the build (a policy with the ``preempt`` role): ack;
- refused for good - an undecodable or forged message, an unknown request, an outcome
  the policy does not declare, a request that already ended with *another* outcome, or
  one that was never admitted: counted with its reason in the queue's refused-outcomes
  record (:mod:`.refused_outcomes`: one bounded record per queue, not a dead letter per
  junk message), then the message is removed from the stream and terminated. Nothing
  was applied; the removal tells a report sent again that this one was refused
  (:func:`.outcomes.publish_outcome`), so the fixed report is not dropped as a duplicate;
- early - the request is still in the machine's initial state (its head is not admitted
  yet): NAK with a short backoff (:data:`EARLY_BACKOFF`), without limit, so the outcome is
  applied within seconds of the admission; once the head ends another way (superseded,
  cancelled) the outcome is moot and refused for good as above;
- anything else (the broker or a store hiccups): NAK with backoff, without limit. An
  outcome is never given up on for a transient fault, since a lost outcome would keep
  its request's slot.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from ...domain.bounded_text import clip
from ...domain.errors import (
    AlreadyEnded,
    NonRetryable,
    NotFound,
    NotYetAdmitted,
    Retryable,
    StovepipeError,
    VersionMismatch,
)
from ...domain.settle import (
    DEFAULT_RETRY_BASE_S,
    DEFAULT_RETRY_CAP_S,
    Attempt,
    Backoff,
    SettleKind,
    settle,
)
from .consumer import DEFAULT_ACK_WAIT_S, DEFAULT_FETCH_TIMEOUT_S, Observer, _ignore, _PullLoop
from .errors import is_no_message, translated
from .outcomes import decode_outcome
from .refused_outcomes import (
    ENDED_OTHERWISE,
    OTHER,
    UNDECLARED_OUTCOME,
    UNDECODABLE,
    UNKNOWN_REQUEST,
    Refusal,
    tally_refusal,
)
from .topology import Topology

log = logging.getLogger("stovepipe_fsm.service")

OUTCOME_CONSUMER = "record-outcomes"
#: How much of a refused message's text a log line repeats.
_QUOTE_CHARS = 300

#: Retry delays for an outcome whose head is not admitted yet: short, so the outcome
#: lands soon after the admission, and bounded, so a long wait costs a redelivery every
#: few seconds only.
EARLY_BACKOFF = Backoff(0.25, 2.0)

RecordOutcome = Callable[[str, str], Awaitable[object]]


def refused_for_good(exc: BaseException) -> bool:
    """Errors a redelivery of the same outcome cannot fix.

    ``ValueError``: the outcome is not declared. ``NotFound``: no such request.
    ``NonRetryable``: the request ended otherwise. Any other error of this package that is
    neither transient nor a lost race: the machine refuses the trigger (never admitted).
    """
    if isinstance(exc, ValueError | NotFound | NonRetryable):
        return True
    return isinstance(exc, StovepipeError) and not isinstance(exc, Retryable | VersionMismatch)


def reason_kind(exc: BaseException) -> str:
    """The kind of reason a refusal is counted under (:mod:`.refused_outcomes`)."""
    if isinstance(exc, ValueError):
        return UNDECLARED_OUTCOME
    if isinstance(exc, NotFound):
        return UNKNOWN_REQUEST
    if isinstance(exc, AlreadyEnded):
        return ENDED_OTHERWISE
    return OTHER


class OutcomeConsumer(_PullLoop):
    """Records build outcomes from the outcome stream, one message at a time."""

    def __init__(
        self,
        js: JetStreamContext,
        topology: Topology,
        record: RecordOutcome,
        *,
        observer: Observer = _ignore,
        ack_wait_s: float = DEFAULT_ACK_WAIT_S,
        fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S,
        retry_base_s: float = DEFAULT_RETRY_BASE_S,
        retry_cap_s: float = DEFAULT_RETRY_CAP_S,
    ) -> None:
        self.js = js
        self.topology = topology
        self.record = record
        self.observer = observer
        self.ack_wait_s = ack_wait_s
        self.fetch_timeout_s = fetch_timeout_s
        self.backoff = Backoff(retry_base_s, retry_cap_s)
        self.durable = OUTCOME_CONSUMER

    @property
    def stream(self) -> str:
        return self.topology.outcome_stream

    def consumer_config(self) -> api.ConsumerConfig:
        return self.durable_config(self.topology.outcome_filter())

    async def settle(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        try:
            queue = self.topology.queue_of_outcome_subject(msg.subject)
        except ValueError as exc:
            # No queue to file a dead letter under: the stream's filter admits one token,
            # so only a garbled token gets here. Logged, counted, removed.
            with translated(f"terminate outcome {seq}"):
                await msg.term()
            self.observer("outcome_refused", "", "", str(exc)[:_QUOTE_CHARS])
            log.error("outcome on a subject of no queue removed: %s", str(exc)[:_QUOTE_CHARS])
            return
        # Failures are not counted apart: each earlier delivery of an outcome failed.
        failures = max(msg.metadata.num_delivered or 1, 1) - 1
        try:
            message = decode_outcome(msg.data, queue)
        except NonRetryable as exc:
            rejected = Attempt.rejected(f"undecodable outcome: {exc}")
            decision = settle(rejected, failures=failures, max_attempts=None)
            refusal = Refusal.bounded(_now_ms(msg), seq, "", "", UNDECODABLE, decision.reason)
            await self._refuse(msg, queue, refusal)
            return
        extra = {"queue": queue, "request_id": message.request_id}
        kind = OTHER
        try:
            await self.record(message.request_id, message.outcome)
        except Exception as exc:
            attempt = Attempt.raised(exc, final=refused_for_good(exc))
            backoff = EARLY_BACKOFF if isinstance(exc, NotYetAdmitted) else self.backoff
            kind = reason_kind(exc)
        else:
            attempt, backoff = Attempt.acked(), self.backoff
        decision = settle(attempt, failures=failures, max_attempts=None, backoff=backoff)
        if decision.kind is SettleKind.DEAD_LETTER:
            reason = f"outcome {message.outcome}: {decision.reason}"
            refusal = Refusal.bounded(
                _now_ms(msg), seq, message.request_id, message.outcome, kind, reason
            )
            await self._refuse(msg, queue, refusal)
        elif decision.kind is SettleKind.RETRY:
            with translated(f"nak outcome {seq}"):
                await msg.nak(delay=decision.delay_s)
            self.observer("outcome_retry", queue, message.request_id, decision.reason)
            log.warning(
                "outcome not recorded, retry in %.1fs: %s",
                decision.delay_s,
                decision.reason,
                extra=extra,
            )
        else:
            with translated(f"ack outcome {seq}"):
                await msg.ack()
            self.observer("recorded", queue, message.request_id, message.outcome)
            log.info("outcome %s recorded", message.outcome, extra=extra)

    async def _refuse(self, msg: Msg, queue: str, refusal: Refusal) -> None:
        """Count, remove, then terminate: the outcome is applied to nothing.

        When the refusal cannot be counted or the message cannot be removed, the message
        is NAKed with backoff instead (it comes back, and is refused again, counted once),
        never left unsettled and never terminated uncounted.
        """
        seq = refusal.stream_seq
        try:
            await tally_refusal(self.js, self.topology, queue, refusal)
            await self._remove(seq)
        except Exception as exc:
            delay = self.backoff.delay_s(msg.metadata.num_delivered or 1)
            with translated(f"nak outcome {seq}"):
                await msg.nak(delay=delay)
            log.error(
                "outcome refused but not yet filed and removed, retry in %.1fs: %s",
                delay,
                clip(f"{type(exc).__name__}: {exc}", _QUOTE_CHARS),
            )
            return
        with translated(f"terminate outcome {seq}"):
            await msg.term()
        self.observer("outcome_refused", queue, refusal.request_id, refusal.reason)
        log.error(
            "outcome refused: %s",
            clip(refusal.reason, _QUOTE_CHARS),
            extra={"queue": clip(queue, _QUOTE_CHARS), "request_id": refusal.request_id},
        )

    async def _remove(self, seq: int) -> None:
        """Delete the refused message from the outcome stream (already gone: done)."""
        with translated(f"remove refused outcome {seq}"):
            try:
                await self.js.delete_msg(self.stream, seq)
            except nats.js.errors.APIError as exc:
                if not (isinstance(exc, nats.js.errors.NotFoundError) or is_no_message(exc)):
                    raise


def _now_ms(msg: Msg) -> int:
    """When the refused message was stored (the broker's time)."""
    return int(msg.metadata.timestamp.timestamp() * 1000)

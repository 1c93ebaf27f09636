"""The pull loops of the process stage: per-queue runners and the dead-letter reconciler.

Theory of operation
-------------------
Each queue has one durable pull consumer on the process stream, filtered to the queue's
subject, with ``max_ack_pending = 1``: the server hands out the queue's next message only
after the previous one is acked or terminated, so the queue is strictly serialized even
when several service replicas pull from the same consumer. A hold is a NAK with delay;
the held message stays pending, so it remains the queue's barrier, and only that queue's.

A runner loops on ``fetch(1)`` (never a batch: with one message allowed in flight, a
batch request just waits out its timeout). An idle runner is *parked*: its one pull
request waits at the broker for minutes (``fetch_timeout_s``, 300 s by default, shortened
by a random quarter so that thousands of queues do not renew together), and the broker
answers it the moment a message is deliverable, whether newly published, redelivered
after a NAK delay or after an ack deadline. An idle queue therefore costs one pull request
every few minutes, not one a second, and still reacts in milliseconds. A parked request
lives only in the broker's memory: whoever learns that it may be gone (a reconnect, a new
consumer or stream leader, a publish that nothing answered) calls :meth:`_PullLoop.wake`
and the runner issues a fresh one. The service's queue runners fetch through one
:class:`~.shared_inbox.SharedInbox` (one subscription for all of them); a runner without
one uses a pull subscription of its own. The runner hands each message to the
controller, which only decides (it never settles a message), and asks the settle policy
(:func:`stovepipe_fsm.domain.settle.settle`) what becomes of it. It performs the answer,
and is the only one that settles a process message:

- ack: the message is acked and its failures forgotten;
- hold: the message is NAKed with the flow's hold delay, its failure count kept as it is;
- retry: the failure count is stored in the attempts bucket (holds are never counted)
  and the message is NAKed with the policy's backoff;
- dead letter (``NonRetryable``, an undecodable or invalid payload, or failures reaching
  the queue's ``max_attempts``): a termination mark is written, a bounded dead-letter
  record is published, then the message is terminated. Nothing leaves the process stream
  without a dead-letter record;
- none (the service is stopping mid-step): the message is handed straight back.

Every path out of :meth:`ProcessConsumer.settle` settles the message: when the settling
itself fails (the mark, the record or the term cannot be written, the ledger cannot be
read) the message is NAKed with a backoff, so it comes back soon and never waits out the
ack deadline as the queue's unsettled barrier. What is logged about a message is bounded
(:func:`~stovepipe_fsm.domain.bounded_text.clip`), whatever its payload holds.

The dead-letter consumer reads those records and fails the request closed through
:class:`~stovepipe_fsm.pipeline.dlq.DeadLetterReconciler`, which frees its slot. It
honours a record only when the service's own termination mark for the record's stream
sequence names the same queue and request (:mod:`.terminations`), so a record published
by anyone else fails nothing. A failure the reconciler cannot get past by retrying (a
stored value it cannot decode) is final: the record is acked, logged and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from ...domain.bounded_text import clip
from ...domain.entities import QueueConfig
from ...domain.errors import NonRetryable, described
from ...domain.ids import parse_request_id
from ...domain.settle import (
    DEFAULT_RETRY_BASE_S,
    DEFAULT_RETRY_CAP_S,
    Attempt,
    Backoff,
    SettleKind,
    Settlement,
    settle,
)
from .attempts import AttemptsLedger
from .codec import check_work, decode_work
from .dead_letter import DeadLetter, publish_dead_letter
from .delivery import JetStreamDelivery
from .durable_consumer import durable_exists, ensure_pull_consumer
from .errors import translated
from .shared_inbox import SharedInbox
from .terminations import TerminationLedger, TerminationMark
from .topology import Topology

log = logging.getLogger("stovepipe_fsm.service")

DEFAULT_ACK_WAIT_S = 10.0
#: How long a parked pull request waits at the broker before it is renewed.
DEFAULT_FETCH_TIMEOUT_S = 300.0
#: A parked request younger than this is not renewed by :meth:`_PullLoop.nudge`: the
#: broker answers a live request within milliseconds, so only an older one is suspect.
NUDGE_AFTER_S = 2.0
DEAD_LETTER_RETRY_S = 2.0
#: The most characters of a request id or an error a log line quotes.
LOG_FIELD_CHARS = 300

#: ``observer(event, queue, request_id, detail)``: the service's metrics and the demo's
#: live timeline both hang off this one hook.
Observer = Callable[[str, str, str, str], None]


class Handler(Protocol):
    async def handle(self, delivery: Any) -> Attempt: ...


class RetryNote(Protocol):
    """Notes a failed attempt that is retried: ``(queue, request_id, stream_seq, the
    settlement, max_attempts)``."""

    async def __call__(
        self, queue: str, request_id: str, stream_seq: int, decision: Settlement, max_attempts: int
    ) -> None: ...


class ConfigSource(Protocol):
    def get(self, queue: str) -> QueueConfig: ...


def _ignore(event: str, queue: str, request_id: str, detail: str) -> None:
    return None


class _PullLoop:
    """A durable pull consumer fetched one message at a time until told to stop.

    ``fetch(1)``, never more: on a ``max_ack_pending = 1`` consumer a larger batch returns
    one message and then waits out its whole timeout (docs/jetstream.md). Subclasses say
    which stream and consumer config, and how to settle a message.
    """

    js: JetStreamContext
    durable: str
    ack_wait_s: float
    fetch_timeout_s: float
    _sub: JetStreamContext.PullSubscription | None = None
    #: The pull request in flight (a task), and when it was issued (``time.monotonic``).
    _fetching: asyncio.Future[list[Msg]] | None = None
    _armed_at: float = 0.0
    #: Where the loop fetches when it shares one subscription with others (else its own
    #: pull subscription), its reply subject there, and whether it waits on it now.
    inbox: SharedInbox | None = None
    _reply: str = ""
    _waiting_on_inbox: bool = False
    _opened: bool = False
    #: Set by :meth:`retire`: the loop ends after the message in hand.
    _retired: bool = False

    @property
    def stream(self) -> str:
        raise NotImplementedError

    def consumer_config(self) -> api.ConsumerConfig:
        raise NotImplementedError

    def durable_config(
        self, filter_subject: str, *, max_ack_pending: int | None = None
    ) -> api.ConsumerConfig:
        """The durable every loop here uses: explicit acks, every message from the start,
        never given up by the server (the loop settles each one), this loop's ack wait;
        ``max_ack_pending`` where a loop serializes its messages."""
        return api.ConsumerConfig(
            durable_name=self.durable,
            name=self.durable,
            filter_subject=filter_subject,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL,
            max_deliver=-1,
            ack_wait=self.ack_wait_s,
            max_ack_pending=max_ack_pending,
        )

    async def settle(self, msg: Msg) -> None:
        raise NotImplementedError

    def log_extra(self) -> dict[str, str]:
        return {}

    async def open(self, existing: api.ConsumerConfig | None = None) -> None:
        """Make sure the durable exists with this loop's settings, and bind to it;
        ``existing`` is its config when the caller listed the stream's consumers."""
        await ensure_pull_consumer(self.js, self.stream, self.consumer_config(), existing)
        if self.inbox is not None:
            self._reply = self.inbox.reply_subject(self.durable)
        else:
            with translated(f"bind consumer {self.durable}"):
                self._sub = await self.js.pull_subscribe_bind(
                    durable=self.durable, stream=self.stream
                )
        self._opened = True

    async def close(self) -> None:
        self._opened = False
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    def wake(self) -> None:
        """Give up the parked pull request and issue a fresh one now.

        For when the broker may have lost it (a reconnect, a new leader) or the loop must
        look at its stop event. A message the old request still brings lands in the same
        inbox and is taken by the next fetch; a message being settled is not disturbed.
        """
        if self.inbox is not None and self._waiting_on_inbox:
            self.inbox.wake(self._reply)
        fetching = self._fetching
        if fetching is not None and not fetching.done():
            fetching.cancel()

    def retire(self) -> None:
        """End the loop after the message in hand is settled (the durable is left as it
        is), without stopping the others."""
        self._retired = True
        self.wake()

    def nudge(self) -> None:
        """A message was just published for this loop: if its parked request is old
        enough to be suspect (a live one would already have been answered), renew it."""
        if self.parked and time.monotonic() - self._armed_at >= NUDGE_AFTER_S:
            self.wake()

    @property
    def parked(self) -> bool:
        """Whether the loop is waiting on a pull request (rather than settling)."""
        return self._fetching is not None or self._waiting_on_inbox

    async def run(self, stop: asyncio.Event, *, watch_stop: bool = True) -> None:
        """Fetch and settle until ``stop`` is set; the message in hand is always settled.

        ``watch_stop=False``: the caller wakes the loop itself when it sets ``stop`` (a
        service with thousands of loops saves a task per loop)."""
        if not self._opened:
            await self.open()
        if not watch_stop:
            await self._loop(stop)
            return
        stopping = asyncio.ensure_future(stop.wait())
        stopping.add_done_callback(lambda _: self.wake())
        try:
            await self._loop(stop)
        finally:
            stopping.cancel()

    async def _loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set() and not self._retired:
            try:
                await self.poll_once()
            except Exception as exc:  # a broker hiccup: log, back off, keep the loop alive
                log.warning(
                    "%s loop error: %s: %s",
                    self.durable,
                    type(exc).__name__,
                    exc,
                    extra=self.log_extra(),
                )
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=1.0)
                with contextlib.suppress(Exception):
                    await self._recover()

    async def _recover(self) -> None:
        """After a loop error: the consumer may be gone (deleted by hand, or since it was
        listed on start), so recreate it if so, or the loop would fail for ever."""
        await ensure_pull_consumer(self.js, self.stream, self.consumer_config())

    async def poll_once(self) -> bool:
        """Fetch at most one message and settle it; ``False`` when none was waiting (the
        request expired, or :meth:`wake` renewed it)."""
        # A random quarter off the wait: loops started together renew at spread times.
        timeout = self.fetch_timeout_s * (1.0 - 0.25 * random.random())
        if self.inbox is not None:
            self._waiting_on_inbox, self._armed_at = True, time.monotonic()
            try:
                msg = await self.inbox.fetch(self.stream, self.durable, self._reply, timeout)
            finally:
                self._waiting_on_inbox = False
            if msg is None:
                return False
            await self.settle(msg)
            return True
        assert self._sub is not None, "open() first"
        fetching = asyncio.ensure_future(self._sub.fetch(1, timeout=timeout))
        self._fetching, self._armed_at = fetching, time.monotonic()
        try:
            await asyncio.wait((fetching,))
        except asyncio.CancelledError:
            fetching.cancel()
            raise
        finally:
            self._fetching = None
        if fetching.cancelled():
            return False
        exc = fetching.exception()
        if isinstance(exc, (TimeoutError, nats.errors.TimeoutError)):
            return False
        if exc is not None:
            raise exc
        msgs = fetching.result()
        for msg in msgs:
            await self.settle(msg)
        return bool(msgs)


class ProcessConsumer(_PullLoop):
    """Pulls one queue's process messages one at a time and settles each one."""

    def __init__(
        self,
        js: JetStreamContext,
        topology: Topology,
        queue: str,
        *,
        handler: Handler,
        config: ConfigSource,
        ledger: AttemptsLedger,
        terminations: TerminationLedger,
        observer: Observer = _ignore,
        ack_wait_s: float = DEFAULT_ACK_WAIT_S,
        fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S,
        retry_base_s: float = DEFAULT_RETRY_BASE_S,
        retry_cap_s: float = DEFAULT_RETRY_CAP_S,
        inbox: SharedInbox | None = None,
        partition: int = 0,
        still_here: Callable[[ProcessConsumer], Awaitable[bool]] | None = None,
        on_retry: RetryNote | None = None,
    ) -> None:
        self.js = js
        #: Told of each failed attempt that is retried, before the message is handed back
        #: (the decision trail notes it: the error, the attempt, when the next try is due).
        self.on_retry = on_retry
        self.topology = topology
        self.queue = queue
        #: The process stream partition the queue's row named when the loop opened
        #: (``partitions.py``).
        self.partition = partition
        #: Asked before a lost durable is recreated: whether the queue still lives on
        #: this partition. ``False`` when it has moved (another replica moved it and
        #: deleted this durable); the one asking then retires this loop and opens the
        #: queue where its row says, so the durable is not recreated where no head goes.
        self.still_here = still_here
        self.inbox = inbox
        self.handler = handler
        self.config = config
        self.ledger = ledger
        self.terminations = terminations
        self.observer = observer
        self.ack_wait_s = ack_wait_s
        self.fetch_timeout_s = fetch_timeout_s
        self.backoff = Backoff(retry_base_s, retry_cap_s)
        self.subject = topology.process_subject(queue, partition)
        self.durable = topology.process_consumer_name(queue)

    def consumer_config(self) -> api.ConsumerConfig:
        return self.durable_config(self.subject, max_ack_pending=1)

    @property
    def stream(self) -> str:
        return self.topology.process_stream_of(self.partition)

    async def _recover(self) -> None:
        """As every loop does, unless the durable is gone and the queue has moved: only
        a lost durable asks :attr:`still_here` (a broker that does not answer makes
        every loop fail at once, and each then costs one lookup, as it always did)."""
        if self.still_here is not None:
            if await durable_exists(self.js, self.stream, self.durable):
                return  # the broker failed, not the durable
            if not await self.still_here(self):
                return  # the queue moved, and this loop is retired
        await super()._recover()

    def log_extra(self) -> dict[str, str]:
        return {"queue": self.queue}

    async def settle(self, msg: Msg) -> None:
        """Run the controller on ``msg`` and perform what the settle policy decides.

        Whatever fails on the way, the message leaves settled: see :meth:`_settle_failed`.
        """
        try:
            await self._settle(msg)
        except Exception as exc:
            await self._settle_failed(msg, exc)

    async def _settle(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        max_attempts = self.config.get(self.queue).max_attempts
        try:
            work = check_work(decode_work(msg.data), self.queue)
        except NonRetryable as exc:
            # Never handed to the flow, so never counted: no ledger read. The record names
            # no request: a payload that failed its checks must not fail one closed.
            claimed = _stated_id(msg.data)
            said = f" (it names request {clip(claimed, 200)!r})" if claimed else ""
            attempt = Attempt.rejected(f"undecodable payload: {exc}{said}")
            await self._perform(msg, seq, "", self._decide(attempt, 0, max_attempts))
            return
        delivery = JetStreamDelivery(msg, self.queue, work.request_id, ack_wait_s=self.ack_wait_s)
        try:
            attempt = await self.handler.handle(delivery)
        except asyncio.CancelledError as exc:
            # Shutdown ran out of patience mid-step: the policy's "none" (nothing settled
            # it) is performed as a hand-back, every step being safe to repeat, instead of
            # leaving the message to the ack deadline.
            crashed = Attempt.raised(exc, crashed=True)
            decision = self._decide(crashed, 0, max_attempts)
            await self._perform(msg, seq, work.request_id, decision)
            raise
        except Exception as exc:
            attempt = Attempt.raised(exc)
            decision = await self.ledger.decide(
                seq, lambda failures: self._decide(attempt, failures, max_attempts)
            )
            await self._perform(msg, seq, work.request_id, decision, max_attempts)
            return
        # A finished flow's settlement does not depend on the failure count (an ack
        # forgets it, a hold leaves it as it is), so the ledger is not read for one.
        decision = self._decide(attempt, 0, max_attempts)
        await self._perform(msg, seq, work.request_id, decision)

    async def _settle_failed(self, msg: Msg, exc: Exception) -> None:
        """Settling ``msg`` failed part-way: hand it back with a backoff.

        Every step before is safe to repeat (a second dead-letter record is dropped as a
        duplicate, a fail-closed request stays failed), so the redelivery simply tries
        again; the backoff grows with the delivery count so a broken dead-letter path
        does not spin. If even the NAK fails the broker is unreachable, and the message
        comes back after the ack deadline, the only road left.
        """
        delay = self.backoff.delay_s(_delivered(msg))
        reason = said(exc)
        try:
            await msg.nak(delay=delay)
        except Exception as nak_exc:
            log.error(
                "settling failed (%s) and the message could not be handed back: %s",
                reason,
                said(nak_exc),
                extra=self.log_extra(),
            )
            return
        self.observer("settle_failed", self.queue, "", reason)
        log.warning(
            "settling failed, redelivery in %.1fs: %s", delay, reason, extra=self.log_extra()
        )

    def _decide(self, attempt: Attempt, failures: int, max_attempts: int) -> Settlement:
        return settle(attempt, failures=failures, max_attempts=max_attempts, backoff=self.backoff)

    async def _perform(
        self,
        msg: Msg,
        seq: int,
        request_id: str,
        decision: Settlement,
        max_attempts: int = 0,
    ) -> None:
        extra = {"queue": self.queue, "request_id": clip(request_id, LOG_FIELD_CHARS)}
        kind = decision.kind
        if kind is SettleKind.NONE:
            with contextlib.suppress(Exception):
                await asyncio.shield(msg.nak())
            return
        if kind is SettleKind.DEAD_LETTER:
            letter = DeadLetter.bounded(
                self.queue, request_id, decision.reason, decision.failures, seq
            )
            await self._store_dead_letter(letter)
            with translated(f"terminate {letter.request_id}"):
                await msg.term()
            await self.ledger.forget(seq)
            self.observer("dead_letter", self.queue, letter.request_id, letter.error)
            log.error("dead-lettered: %s", clip(letter.error, LOG_FIELD_CHARS), extra=extra)
            return
        if kind is SettleKind.RETRY:
            if self.on_retry is not None and request_id:
                try:
                    await self.on_retry(self.queue, request_id, seq, decision, max_attempts)
                except Exception as exc:  # the retry itself must not depend on the note
                    log.warning("failed attempt not noted: %s", said(exc), extra=extra)
            with translated(f"nak {request_id}"):
                await msg.nak(delay=decision.delay_s)
            self.observer("retry", self.queue, request_id, decision.reason)
            log.warning(
                "retry %d/%d in %.1fs: %s",
                decision.failures,
                max_attempts,
                decision.delay_s,
                clip(decision.reason, LOG_FIELD_CHARS),
                extra=extra,
            )
            return
        if kind is SettleKind.HOLD:
            with translated(f"hold {request_id}"):
                await msg.nak(delay=decision.delay_s)
            outcome = "held"
            if decision.reason:  # an environment failure: held uncounted, alerted on
                self.observer("environment_hold", self.queue, request_id, decision.reason)
                log.warning(
                    "held in %.1fs, not counted: %s",
                    decision.delay_s,
                    clip(decision.reason, LOG_FIELD_CHARS),
                    extra=extra,
                )
                return
        else:
            with translated(f"ack {request_id}"):
                await msg.ack()
            outcome = "acked"
            if msg.metadata.num_delivered > 1:
                # Failures are only recorded on a delivery that is then NAKed, so a first
                # delivery has none to forget; skipping it saves a round trip per decision.
                await self.ledger.forget(seq)
        self.observer(outcome, self.queue, request_id, "")
        # The decision itself, with its reason, is logged where it is made (process.trail).
        log.debug(outcome, extra=extra)

    async def _store_dead_letter(self, letter: DeadLetter) -> None:
        """Mark the termination, then publish the record (a minimal one if the full one
        is refused); raises when no record could be stored, and then the caller must not
        terminate the message."""
        mark = TerminationMark(letter.queue, letter.request_id)
        extra = self.log_extra()
        await self.terminations.mark(letter.stream_seq, mark)
        try:
            await publish_dead_letter(self.js, self.topology, letter)
        except Exception as exc:
            minimal = letter.minimal()
            if minimal == letter:
                raise
            refused = said(exc)
            log.warning(
                "dead-letter record refused (%s); publishing a minimal one", refused, extra=extra
            )
            await publish_dead_letter(self.js, self.topology, minimal)


class DeadLetterConsumer(_PullLoop):
    """Fails dead-lettered requests closed so that their queues move on."""

    def __init__(
        self,
        js: JetStreamContext,
        topology: Topology,
        reconcile: Callable[[DeadLetter], Awaitable[object]],
        *,
        terminations: TerminationLedger,
        observer: Observer = _ignore,
        fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S,
        retry_s: float = DEAD_LETTER_RETRY_S,
        ack_wait_s: float = DEFAULT_ACK_WAIT_S,
    ) -> None:
        self.js = js
        self.topology = topology
        self.reconcile = reconcile
        self.terminations = terminations
        self.observer = observer
        self.fetch_timeout_s = fetch_timeout_s
        self.retry_s = retry_s
        #: A fixed delay between tries: a reconcile waits on the stores, not on itself.
        self.backoff = Backoff(retry_s, retry_s)
        self.ack_wait_s = ack_wait_s
        self.durable = "dlq-process-reconciler"

    @property
    def stream(self) -> str:
        return self.topology.dead_letter_stream

    def consumer_config(self) -> api.ConsumerConfig:
        return self.durable_config(f"{self.topology.prefix}.dlq.process.*")

    async def settle(self, msg: Msg) -> None:
        """Reconcile one record; every path acks it or NAKs it with a delay."""
        try:
            await self._settle(msg)
        except Exception as exc:  # the mark could not be read: try again later
            log.warning("dead letter not reconciled yet: %s", clip(described(exc), LOG_FIELD_CHARS))
            with contextlib.suppress(Exception):
                await msg.nak(delay=self.retry_s)

    async def _settle(self, msg: Msg) -> None:
        try:
            letter = DeadLetter.decode(msg.data)
        except NonRetryable as exc:
            log.error("unreadable dead letter left as is: %s", clip(str(exc), LOG_FIELD_CHARS))
            await msg.ack()  # nothing to reconcile; the record stays in the stream
            return
        extra = {
            "queue": clip(letter.queue, LOG_FIELD_CHARS),
            "request_id": clip(letter.request_id, LOG_FIELD_CHARS),
        }
        refusal = await self._refusal(msg.subject, letter)
        if refusal:
            # Not the service's own record, or one about another queue's request: it must
            # not fail a request that may be healthy; the record stays for an operator.
            await msg.ack()
            self.observer("ignored", letter.queue, letter.request_id, refusal)
            log.warning("dead letter left as is: %s", refusal, extra=extra)
            return
        attempt = Attempt.acked()
        if letter.request_id:
            try:
                await self.reconcile(letter)
            except Exception as exc:
                attempt = Attempt.raised(exc)
        # A dead letter is never dead-lettered again: retried without a limit, or, when
        # no retry can repair it (an undecodable row), left in the stream for an operator.
        decision = settle(attempt, failures=0, max_attempts=None, backoff=self.backoff)
        if decision.kind is SettleKind.RETRY:
            reason = clip(decision.reason, LOG_FIELD_CHARS)
            log.warning("reconcile failed, retrying: %s", reason, extra=extra)
            await msg.nak(delay=decision.delay_s)
            return
        await msg.ack()
        if decision.kind is SettleKind.DEAD_LETTER:
            self.observer("unreconcilable", letter.queue, letter.request_id, attempt.error)
            log.error(
                "dead letter cannot be reconciled, left as is: %s",
                clip(decision.reason, LOG_FIELD_CHARS),
                extra=extra,
            )
            return
        self.observer("reconciled", letter.queue, letter.request_id, letter.error)
        log.info("dead letter reconciled: request failed closed", extra=extra)

    async def _refusal(self, subject: str, letter: DeadLetter) -> str:
        """Why ``letter`` must not be acted on; empty when it may."""
        try:
            expected = self.topology.dead_letter_subject(letter.queue)
        except ValueError:
            return "the record names no valid queue"
        if subject != expected:
            return "the record names another queue than its subject"
        if letter.request_id and not _belongs_to(letter.request_id, letter.queue):
            return "the record names another queue's request"
        mark = await self.terminations.lookup(letter.stream_seq)
        if mark != TerminationMark(letter.queue, letter.request_id):
            return f"no termination by the service matches stream sequence {letter.stream_seq}"
        return ""


def said(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, bounded for a log line."""
    return clip(f"{type(exc).__name__}: {exc}", LOG_FIELD_CHARS)


def _belongs_to(request_id: str, queue: str) -> bool:
    try:
        return parse_request_id(request_id).queue == queue
    except ValueError:
        return False


def _stated_id(data: bytes | None) -> str:
    """The request id an undecodable payload claims, when it claims one as a string."""
    try:
        body = json.loads(data or b"")
    except ValueError:
        return ""
    value = body.get("request_id") if isinstance(body, dict) else None
    return value if isinstance(value, str) else ""


def _delivered(msg: Msg) -> int:
    try:
        return int(msg.metadata.num_delivered)
    except Exception:
        return 1



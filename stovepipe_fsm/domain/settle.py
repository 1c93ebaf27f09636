"""What becomes of a delivery once the flow ran or raised: one pure decision.

Theory of operation
-------------------
The controller never settles a delivery itself: its flow ends by deciding to ack or to
hold it (for how long), or it raises. What the runtime does next is decided here and
nowhere else, from data alone: what the attempt did (:class:`Attempt`), the failures
counted for the message so far, the queue's ``max_attempts`` and the retry
:class:`Backoff`. The answer is a :class:`Settlement`, a value one performer carries
out: the JetStream consumer on a broker, the simulated world on its simulated topic. Both
call :func:`settle`, so ``simulate`` and ``check`` run the very policy ``serve`` runs;
only *how* a decision is carried out (an ACK or a NAK, a dead-letter record, a due time)
differs. The outcome consumer settles reported build outcomes by the same rules, with no
``max_attempts`` (an outcome is never given up on for a transient fault).

The rules:

- **acked**: done; ack it, and its failure count is forgotten.
- **held**: postpone it by the flow's hold delay; waiting for the gate is not a
  failure, so the count stays as it is (holds never count toward ``max_attempts``).
- **crashed**: the runtime stopped mid-delivery, so nothing settled the message; it
  comes back (an expired ack deadline, or a hand-back on shutdown) and nothing counts.
- **non-retryable**: a redelivery cannot fix it: dead-letter at once, reporting the
  failures counted so far.
- **environment failure**: the service itself could not work (no descriptor to start
  git): hold it after the backoff of the failures so far, with the reason to alert on;
  nothing counts, so it never uses up ``max_attempts`` and never fails a head.
- **anything else raised**: one more failure. At ``max_attempts`` failures (when there is
  such a budget), give up and dead-letter; below it, retry after a backoff that doubles
  with each failure.

No I/O, no clock, no randomness: equal inputs give equal settlements, which is what lets
``check`` explore the policy state by state.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .errors import EnvironmentFailure, NonRetryable, described

ACKED = "acked"
HELD = "held"
FINISHED_OUTCOMES = (ACKED, HELD)

DEFAULT_RETRY_BASE_S = 1.0
DEFAULT_RETRY_CAP_S = 60.0
#: More doublings than any base can take before it passes any cap (a float holds 2**1023).
MAX_DOUBLINGS = 1000


class SettleKind(StrEnum):
    """What the runtime does with the message."""

    ACK = "ack"  # the flow is done with it: ack it, forget its failures
    HOLD = "hold"  # the flow waits: redeliver after ``delay_s``, keep its failures
    RETRY = "retry"  # count a failure, redeliver after ``delay_s``
    DEAD_LETTER = "dead_letter"  # record why, remove it; the request is failed closed
    NONE = "none"  # nothing settled it (a crash): it comes back at once, uncounted


@dataclass(frozen=True)
class Attempt:
    """What one delivery attempt did: finished with an outcome, or raised.

    Build one with :meth:`acked`, :meth:`held`, :meth:`finished`, :meth:`raised` or
    :meth:`rejected`; the fields are plain data so a decision can be recorded, compared
    and replayed.
    """

    outcome: str = ""  # "acked" | "held" when the flow ran to its end; "" when it raised
    error: str = ""  # what was raised, described (errors.described)
    non_retryable: bool = False
    environmental: bool = False  # raised an EnvironmentFailure
    crashed: bool = False
    hold_ms: int = 0  # held: how long the flow asks the message to wait

    def __post_init__(self) -> None:
        if self.outcome and self.outcome not in FINISHED_OUTCOMES:
            raise ValueError(f"outcome must be one of {FINISHED_OUTCOMES}, got {self.outcome!r}")
        if self.hold_ms < 0 or (self.hold_ms and self.outcome != HELD):
            raise ValueError(f"only a hold has a delay, >= 0 ms; got {self.hold_ms!r}")
        if bool(self.outcome) == bool(self.error or self.crashed):
            raise ValueError("an attempt either finished with an outcome or raised, not both")
        if self.non_retryable and self.crashed:
            raise ValueError("a crash is not a non-retryable failure")
        if self.environmental and (self.crashed or self.non_retryable or not self.error):
            raise ValueError("an environment failure is a raised, retryable error")

    @classmethod
    def finished(cls, outcome: str, hold_ms: int = 0) -> Attempt:
        """The flow ran to its end, deciding ``outcome`` (``acked``, or ``held`` for
        ``hold_ms``)."""
        return cls(outcome=outcome, hold_ms=hold_ms)

    @classmethod
    def acked(cls) -> Attempt:
        """The flow is done with the message."""
        return cls(outcome=ACKED)

    @classmethod
    def held(cls, delay_ms: int) -> Attempt:
        """The flow asks that the message wait ``delay_ms`` and come back."""
        return cls(outcome=HELD, hold_ms=delay_ms)

    @classmethod
    def raised(
        cls, exc: BaseException, *, crashed: bool = False, final: bool | None = None
    ) -> Attempt:
        """The flow raised ``exc``; ``crashed`` when the runtime itself stopped mid-way.

        ``NonRetryable`` and ``EnvironmentFailure`` are told apart by type; anything
        else is retryable, as the controller's contract says. A stage whose refusals are
        not all ``NonRetryable`` says itself whether no redelivery can fix ``exc`` (``final``).
        """
        fixed_by_nothing = isinstance(exc, NonRetryable) if final is None else final
        non_retryable = not crashed and fixed_by_nothing
        return cls(
            error=described(exc),
            non_retryable=non_retryable,
            environmental=not crashed
            and not non_retryable
            and isinstance(exc, EnvironmentFailure),
            crashed=crashed,
        )

    @classmethod
    def rejected(cls, reason: str) -> Attempt:
        """The message could not even be handed to the flow (an undecodable payload)."""
        return cls(error=reason, non_retryable=True)


@dataclass(frozen=True)
class Backoff:
    """Exponential retry delays: ``base_s``, 2·``base_s``, 4·``base_s`` ... capped."""

    base_s: float = DEFAULT_RETRY_BASE_S
    cap_s: float = DEFAULT_RETRY_CAP_S

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.cap_s < 0:
            raise ValueError(f"backoff must not be negative, got {self.base_s}, {self.cap_s}")

    def delay_s(self, failures: int) -> float:
        """The wait before the redelivery that follows failure number ``failures``.

        The doubling is taken in floats and stops growing long past any cap, so a
        message retried without a budget never overflows it.
        """
        doublings = min(max(failures - 1, 0), MAX_DOUBLINGS)
        return float(min(self.cap_s, self.base_s * 2.0**doublings))


@dataclass(frozen=True)
class Settlement:
    """The decision: what to do with the message, and the failure count that follows.

    ``failures`` is the message's count after this attempt: what a retry stores, what a
    hold keeps, what a dead letter reports as its attempts; 0 after an ack.
    """

    kind: SettleKind
    failures: int
    delay_s: float = 0.0  # HOLD, RETRY: redeliver after this long
    reason: str = ""  # RETRY, DEAD_LETTER, a HOLD for an environment failure: why


DEFAULT_BACKOFF = Backoff()


def settle(
    attempt: Attempt,
    *,
    failures: int,
    max_attempts: int | None,
    backoff: Backoff = DEFAULT_BACKOFF,
) -> Settlement:
    """Decide what becomes of a message after ``attempt``, with ``failures`` counted so far.

    ``max_attempts`` ``None``: no budget, a retryable failure is retried however often.
    """
    if failures < 0:
        raise ValueError(f"failures must be >= 0, got {failures}")
    if max_attempts is not None and max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    if attempt.outcome == ACKED:
        return Settlement(SettleKind.ACK, 0)
    if attempt.outcome == HELD:
        return Settlement(SettleKind.HOLD, failures, attempt.hold_ms / 1000.0)
    if attempt.crashed:
        return Settlement(SettleKind.NONE, failures)
    if attempt.non_retryable:
        return Settlement(SettleKind.DEAD_LETTER, failures, reason=attempt.error)
    if attempt.environmental:
        return Settlement(
            SettleKind.HOLD, failures, backoff.delay_s(failures + 1), reason=attempt.error
        )
    counted = failures + 1
    if max_attempts is not None and counted >= max_attempts:
        reason = f"gave up after {counted} attempts: {attempt.error}"
        return Settlement(SettleKind.DEAD_LETTER, counted, reason=reason)
    return Settlement(SettleKind.RETRY, counted, backoff.delay_s(counted), attempt.error)

"""The settle policy: every branch of what becomes of a delivery after the flow."""

from __future__ import annotations

import dataclasses

import pytest

from stovepipe_fsm.domain.errors import (
    EnvironmentFailure,
    NonRetryable,
    Retryable,
    VersionMismatch,
)
from stovepipe_fsm.domain.settle import (
    Attempt,
    Backoff,
    SettleKind,
    Settlement,
    settle,
)

FAST = Backoff(base_s=0.5, cap_s=3.0)


def decide(attempt: Attempt, failures: int = 0, max_attempts: int = 5) -> Settlement:
    return settle(attempt, failures=failures, max_attempts=max_attempts, backoff=FAST)


def test_an_ack_forgets_the_failures() -> None:
    assert decide(Attempt.finished("acked"), failures=3) == Settlement(SettleKind.ACK, 0)


def test_a_hold_keeps_the_failures_and_never_counts() -> None:
    assert decide(Attempt.finished("held"), failures=2) == Settlement(SettleKind.HOLD, 2)
    # not even at the edge of the budget: waiting for the gate is not a failure
    assert decide(Attempt.finished("held"), failures=4, max_attempts=5).kind is SettleKind.HOLD


def test_a_hold_waits_as_long_as_the_flow_asked() -> None:
    assert Attempt.held(2500) == Attempt.finished("held", 2500)
    assert decide(Attempt.held(2500), failures=1) == Settlement(SettleKind.HOLD, 1, 2.5)
    assert decide(Attempt.acked()) == Settlement(SettleKind.ACK, 0, 0.0)
    with pytest.raises(ValueError, match="only a hold has a delay"):
        Attempt(outcome="acked", hold_ms=5)
    with pytest.raises(ValueError, match="only a hold has a delay"):
        Attempt.held(-1)


def test_a_crash_settles_nothing_and_counts_nothing() -> None:
    attempt = Attempt.raised(RuntimeError("after_claim_slot"), crashed=True)
    assert decide(attempt, failures=4, max_attempts=5) == Settlement(SettleKind.NONE, 4)


def test_a_crash_is_a_crash_whatever_it_raised() -> None:
    attempt = Attempt.raised(NonRetryable("gone"), crashed=True)
    assert attempt.crashed and not attempt.non_retryable
    assert decide(attempt).kind is SettleKind.NONE


def test_non_retryable_is_dead_lettered_at_once_with_the_count_so_far() -> None:
    attempt = Attempt.raised(NonRetryable("request 'request/q/9' not found"))
    assert decide(attempt, failures=2) == Settlement(
        SettleKind.DEAD_LETTER, 2, reason="NonRetryable: request 'request/q/9' not found"
    )


def test_a_rejected_message_is_dead_lettered_with_its_reason_verbatim() -> None:
    attempt = Attempt.rejected("undecodable payload: not json")
    assert decide(attempt) == Settlement(
        SettleKind.DEAD_LETTER, 0, reason="undecodable payload: not json"
    )


def test_a_retryable_failure_is_counted_and_retried_with_backoff() -> None:
    attempt = Attempt.raised(Retryable("source control unavailable"))
    assert decide(attempt, failures=0) == Settlement(
        SettleKind.RETRY, 1, 0.5, "Retryable: source control unavailable"
    )
    assert decide(attempt, failures=2).delay_s == 2.0


def test_any_other_exception_is_retryable() -> None:
    decision = decide(Attempt.raised(VersionMismatch("lost")), failures=1)
    assert (decision.kind, decision.failures, decision.reason) == (
        SettleKind.RETRY,
        2,
        "VersionMismatch: lost",
    )


def test_the_failure_that_reaches_max_attempts_dead_letters() -> None:
    attempt = Attempt.raised(Retryable("down"))
    assert decide(attempt, failures=3, max_attempts=5).kind is SettleKind.RETRY
    assert decide(attempt, failures=4, max_attempts=5) == Settlement(
        SettleKind.DEAD_LETTER, 5, reason="gave up after 5 attempts: Retryable: down"
    )
    # a count already past the budget (the budget was lowered) gives up too
    assert decide(attempt, failures=7, max_attempts=5).failures == 8
    assert decide(attempt, failures=7, max_attempts=5).kind is SettleKind.DEAD_LETTER


def test_one_attempt_allowed_means_the_first_failure_dead_letters() -> None:
    decision = decide(Attempt.raised(Retryable("down")), failures=0, max_attempts=1)
    assert (decision.kind, decision.failures) == (SettleKind.DEAD_LETTER, 1)


def test_backoff_doubles_from_the_base_up_to_the_cap() -> None:
    delays = [Backoff(base_s=1.0, cap_s=60.0).delay_s(n) for n in range(1, 9)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert Backoff().delay_s(1) == 1.0  # the service's default first retry: 1 s
    assert FAST.delay_s(0) == 0.5


def test_equal_inputs_give_equal_settlements() -> None:
    attempt = Attempt.raised(Retryable("down"))
    assert decide(attempt, failures=1) == decide(attempt, failures=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decide(attempt).kind = SettleKind.ACK  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"outcome": "done"}, "outcome must be one of"),
        ({}, "either finished with an outcome or raised"),
        ({"outcome": "acked", "error": "Retryable: x"}, "either finished"),
        ({"error": "x", "non_retryable": True, "crashed": True}, "not a non-retryable"),
    ],
)
def test_an_impossible_attempt_is_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Attempt(**fields)  # type: ignore[arg-type]


def test_bad_counts_and_budgets_are_refused() -> None:
    attempt = Attempt.finished("acked")
    with pytest.raises(ValueError, match="failures must be >= 0"):
        settle(attempt, failures=-1, max_attempts=5)
    with pytest.raises(ValueError, match="max_attempts must be >= 1"):
        settle(attempt, failures=0, max_attempts=0)
    with pytest.raises(ValueError, match="must not be negative"):
        Backoff(base_s=-1.0)


def test_without_a_budget_a_retryable_failure_is_retried_forever() -> None:
    attempt = Attempt.raised(Retryable("down"))
    assert settle(attempt, failures=10_000, max_attempts=None, backoff=FAST) == Settlement(
        SettleKind.RETRY, 10_001, 3.0, "Retryable: down"
    )
    # what no redelivery can fix is still given up on at once
    final = Attempt.raised(NonRetryable("gone"))
    assert settle(final, failures=3, max_attempts=None).kind is SettleKind.DEAD_LETTER


def test_the_caller_may_say_what_no_redelivery_can_fix() -> None:
    # a stage whose refusals are not all NonRetryable classifies them itself
    refused = Attempt.raised(ValueError("outcome 'x' is not one of ..."), final=True)
    assert refused.non_retryable and refused.error.startswith("ValueError: ")
    transient = Attempt.raised(NonRetryable("looks final"), final=False)
    assert not transient.non_retryable
    assert not Attempt.raised(ValueError("x"), crashed=True, final=True).non_retryable


def test_an_environment_failure_is_held_uncounted_with_its_reason() -> None:
    attempt = Attempt.raised(EnvironmentFailure("cannot run 'git': Too many open files"))
    decision = settle(attempt, failures=2, max_attempts=3, backoff=Backoff(1.0, 60.0))
    assert decision == Settlement(
        SettleKind.HOLD, 2, 4.0, "EnvironmentFailure: cannot run 'git': Too many open files"
    )

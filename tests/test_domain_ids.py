"""Request ids: ``request/<queue>/<n>``, ordered by the decimal counter, never guessed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stovepipe_fsm.domain.ids import (
    RequestId,
    compare_request_id,
    format_request_id,
    parse_request_id,
)
from stovepipe_fsm.domain.queue_names import InvalidQueueName, validate_stored_queue_name

Q = "monorepo/main"


def test_parse_splits_queue_and_counter_even_when_the_queue_has_slashes() -> None:
    assert parse_request_id("request/monorepo/main/42") == RequestId("monorepo/main", 42)
    assert parse_request_id("request/a/b/c/7") == RequestId("a/b/c", 7)
    assert str(RequestId("a/b", 3)) == "request/a/b/3"


def test_compare_orders_by_counter_not_by_text() -> None:
    assert compare_request_id(Q, f"request/{Q}/9", f"request/{Q}/10") == -1
    assert compare_request_id(Q, f"request/{Q}/10", f"request/{Q}/9") == 1
    assert compare_request_id(Q, f"request/{Q}/10", f"request/{Q}/10") == 0


@pytest.mark.parametrize(
    "bad",
    [
        "request/monorepo/main/",  # no counter
        "request/monorepo/main/x1",  # not decimal
        "request/monorepo/main/٣",  # a non-ASCII digit
        "request/monorepo/main/007",  # not canonical
        "request/monorepo/main/0",  # counters start at 1
        "request/monorepo/main/-1",
        "req/monorepo/main/1",  # wrong prefix
        "request/1",  # no queue
        "request/bad queue/1",  # invalid queue name
    ],
)
def test_malformed_ids_raise_instead_of_being_ordered(bad: str) -> None:
    with pytest.raises(ValueError):
        compare_request_id(Q, bad, f"request/{Q}/1")
    with pytest.raises(ValueError):
        compare_request_id(Q, f"request/{Q}/1", bad)


def test_an_id_of_another_queue_raises() -> None:
    with pytest.raises(ValueError, match="belongs to queue 'other/q'"):
        compare_request_id(Q, f"request/{Q}/1", "request/other/q/2")


def test_a_non_string_raises() -> None:
    with pytest.raises(ValueError):
        parse_request_id(17)  # type: ignore[arg-type]


def test_a_bad_id_keeps_raising_after_a_good_one_was_parsed() -> None:
    """Parsing is memoized; failures must never be."""
    parse_request_id(f"request/{Q}/5")
    for _ in range(3):
        with pytest.raises(ValueError):
            parse_request_id(f"request/{Q}/05")


def test_format_rejects_counters_below_one() -> None:
    with pytest.raises(ValueError):
        format_request_id(Q, 0)


def _valid(name: str) -> bool:
    try:
        validate_stored_queue_name(name)  # ids parse every name the store may hold
    except InvalidQueueName:
        return False
    return True


@given(
    queue=st.text(min_size=1, max_size=30).filter(_valid),
    a=st.integers(min_value=1, max_value=10**12),
    b=st.integers(min_value=1, max_value=10**12),
)
def test_round_trip_and_order_agree_with_the_counters(queue: str, a: int, b: int) -> None:
    left, right = format_request_id(queue, a), format_request_id(queue, b)
    assert parse_request_id(left) == RequestId(queue, a)
    assert compare_request_id(queue, left, right) == (a > b) - (a < b)

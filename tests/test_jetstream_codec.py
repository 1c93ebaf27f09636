"""JSON codec of stored values: lossless round trips, precise errors on malformed values."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stovepipe_fsm.adapters.jetstream.codec import (
    REQUEST_LAYOUT,
    SCHEMA_VERSION,
    UriEntry,
    WorkMessage,
    decode_queue,
    decode_request,
    decode_search,
    decode_uri_entry,
    decode_work,
    encode_queue,
    encode_request,
    encode_search,
    encode_uri_entry,
    encode_work,
)
from stovepipe_fsm.domain.culprit_search import CulpritSearch, Probe, Tally
from stovepipe_fsm.domain.entities import FULL, Green, Queue, Request
from stovepipe_fsm.domain.errors import NonRetryable

text = st.text(max_size=40)
requests = st.builds(
    Request,
    id=text,
    queue=text,
    uri=text,
    state=text,
    build_strategy=text,
    base_uri=text,
    superseded_by=text,
    version=st.integers(min_value=1, max_value=2**53),
    retry_of=text,
)
queues = st.builds(
    Queue,
    name=text,
    last_green_uri=text,
    last_green_request_id=text,
    latest_request_id=text,
    slot_holders=st.lists(text, max_size=4).map(tuple),
    leases=st.dictionaries(text, st.integers(min_value=0, max_value=2**53), max_size=3).map(
        lambda d: tuple(sorted(d.items()))
    ),
    serial_holder=text,
    recent_greens=st.lists(
        st.builds(Green, uri=text, request_id=text, at_ms=st.integers(0, 2**53)), max_size=3
    ).map(tuple),
    version=st.integers(min_value=1, max_value=2**53),
)


@given(requests)
def test_request_round_trip(request: Request) -> None:
    assert decode_request(encode_request(request)) == request


@given(queues)
def test_queue_round_trip(queue: Queue) -> None:
    decoded = decode_queue(encode_queue(queue))
    assert decoded == queue
    assert type(decoded.slot_holders) is tuple


def test_values_carry_schema_and_kind() -> None:
    body = json.loads(
        encode_request(Request(id="request/q/1", queue="q", uri="u", state="accepted"))
    )
    assert (body["schema"], body["kind"]) == (REQUEST_LAYOUT, "request")
    body = json.loads(encode_queue(Queue(name="q", slot_holders=("request/q/1",))))
    assert (body["kind"], body["slot_holders"]) == ("queue", ["request/q/1"])


TIMED = Request(
    id="request/q/1",
    queue="q",
    uri="u",
    state="succeeded",
    build_strategy=FULL,
    version=4,
    ingested_at_ms=1_700_000_000_000,
    admitted_at_ms=1_700_000_000_500,
    ended_at_ms=1_700_000_090_000,
)


def test_a_layout_one_row_of_an_older_release_reads_with_no_times() -> None:
    old = {
        "schema": 1,
        "kind": "request",
        **{k: getattr(TIMED, k) for k in ("id", "queue", "uri", "state", "build_strategy")},
        "base_uri": "",
        "superseded_by": "",
        "version": 4,
    }
    assert decode_request(json.dumps(old).encode()) == TIMED.without_times()


def test_layout_two_keeps_the_times_and_layout_one_drops_them() -> None:
    assert json.loads(encode_request(TIMED))["schema"] == 2
    assert decode_request(encode_request(TIMED)) == TIMED
    written_for_old_replicas = json.loads(encode_request(TIMED, layout=1))
    assert written_for_old_replicas["schema"] == SCHEMA_VERSION == 1
    assert "ended_at_ms" not in written_for_old_replicas
    assert decode_request(encode_request(TIMED, layout=1)) == TIMED.without_times()
    with pytest.raises(ValueError, match="layout must be one of"):
        encode_request(TIMED, layout=3)


def test_retry_of_is_written_only_when_set_and_only_in_layout_two() -> None:
    retried = replace(TIMED, retry_of="request/monorepo/main/1")
    assert json.loads(encode_request(retried))["retry_of"] == "request/monorepo/main/1"
    assert decode_request(encode_request(retried)) == retried
    assert "retry_of" not in json.loads(encode_request(TIMED))  # rows as they were
    assert decode_request(encode_request(retried, layout=1)).retry_of == ""
    layout_one = {**json.loads(encode_request(TIMED, layout=1)), "retry_of": "x"}
    with pytest.raises(NonRetryable, match="unknown field"):
        decode_request(json.dumps(layout_one).encode())
    wrong = {**json.loads(encode_request(retried)), "retry_of": 7}
    with pytest.raises(NonRetryable, match="'retry_of' must be a string"):
        decode_request(json.dumps(wrong).encode())


def test_work_and_uri_entries_round_trip() -> None:
    work = WorkMessage(queue="monorepo/main", request_id="request/monorepo/main/3")
    assert decode_work(encode_work(work)) == work
    assert json.loads(encode_work(work))["request_id"] == work.request_id
    entry = UriEntry(queue="q", uri="ünï://x", request_id="request/q/1")
    assert decode_uri_entry(encode_uri_entry(entry)) == entry


_DROP = object()  # marks a field to leave out


def _request_body(**changes: object) -> bytes:
    body = json.loads(
        encode_request(
            Request(id="request/q/1", queue="q", uri="u", build_strategy=FULL, state="accepted")
        )
    )
    body.update(changes)
    return json.dumps({k: v for k, v in body.items() if v is not _DROP}).encode()


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (None, "empty"),
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (_request_body(schema=3), "schema 3; this release reads 1 or 2"),
        (_request_body(schema=True), "schema True"),
        (_request_body(admitted_at_ms=-1), "'admitted_at_ms' must be an integer >= 0"),
        (_request_body(schema=1), "unknown field(s) admitted_at_ms, ended_at_ms, ingested_at"),
        (_request_body(schema=_DROP), "schema None"),
        (_request_body(kind="queue"), "kind 'queue'"),
        (_request_body(uri=_DROP), "missing field(s) uri"),
        (_request_body(extra=1), "unknown field(s) extra"),
        (_request_body(state=3), "'state' must be a string"),
        (_request_body(version="2"), "'version' must be an integer"),
        (_request_body(version=True), "'version' must be an integer"),
        (_request_body(version=0), "'version' must be an integer >= 1"),
    ],
)
def test_malformed_request_values_are_non_retryable(data: bytes | None, complaint: str) -> None:
    with pytest.raises(NonRetryable, match="request") as caught:
        decode_request(data)
    assert complaint in str(caught.value)


@pytest.mark.parametrize(
    ("holders", "complaint"),
    [("request/q/1", "list of strings"), ([1], "list of strings"), (None, "list of strings")],
)
def test_malformed_slot_holders_are_non_retryable(holders: object, complaint: str) -> None:
    body = json.loads(encode_queue(Queue(name="q")))
    body["slot_holders"] = holders
    with pytest.raises(NonRetryable, match="slot_holders") as caught:
        decode_queue(json.dumps(body).encode())
    assert complaint in str(caught.value)


def test_queue_leases_and_serial_holder_round_trip() -> None:
    queue = Queue(
        name="q", slot_holders=("request/q/2", "request/q/1"), serial_holder="request/q/2"
    )
    queue = replace(queue, leases=(("request/q/1", 9_000), ("request/q/2", 12_000)))
    body = json.loads(encode_queue(queue))
    assert body["leases"] == {"request/q/1": 9_000, "request/q/2": 12_000}
    assert body["serial_holder"] == "request/q/2"
    assert decode_queue(encode_queue(queue)) == queue


def test_a_row_written_before_leases_reads_as_none() -> None:
    old = {
        "schema": SCHEMA_VERSION,
        "kind": "queue",
        "name": "q",
        "last_green_uri": "",
        "last_green_request_id": "",
        "latest_request_id": "request/q/1",
        "slot_holders": ["request/q/1"],
        "version": 3,
    }
    queue = decode_queue(json.dumps(old).encode())
    assert (queue.leases, queue.serial_holder) == ((), "")
    assert queue.expires_at("request/q/1") is None
    assert not queue.is_expired("request/q/1", 10**15)
    # A row without leases is written as before: no new field appears in it.
    assert json.loads(encode_queue(queue)).keys() == old.keys()


def test_a_row_written_before_recent_greens_reads_its_last_green_alone() -> None:
    old = {
        "schema": SCHEMA_VERSION,
        "kind": "queue",
        "name": "q",
        "last_green_uri": "c7",
        "last_green_request_id": "request/q/7",
        "latest_request_id": "request/q/9",
        "slot_holders": [],
        "version": 12,
    }
    queue = decode_queue(json.dumps(old).encode())
    assert queue.recent_greens == ()
    assert queue.greens == (Green("c7", "request/q/7"),)
    # A row without the list is written as before: no new field appears in it.
    assert json.loads(encode_queue(queue)).keys() == old.keys()
    listed = replace(
        queue, recent_greens=(Green("c7", "request/q/7", 5), Green("c3", "request/q/3", 2))
    )
    body = json.loads(encode_queue(listed))
    assert body["recent_greens"] == [
        {"uri": "c7", "request_id": "request/q/7", "at_ms": 5},
        {"uri": "c3", "request_id": "request/q/3", "at_ms": 2},
    ]
    assert decode_queue(encode_queue(listed)) == listed


@pytest.mark.parametrize(
    ("greens", "complaint"),
    [
        ({"uri": "c1"}, "must be a list of at most 64 greens"),
        ([{"uri": "c1", "request_id": "request/q/1", "at_ms": 0}] * 65, "at most 64 greens"),
        ([{"uri": "c1", "request_id": "request/q/1"}], "uri, request_id and at_ms"),
        ([["c1", "request/q/1", 0]], "uri, request_id and at_ms"),
        ([{"uri": 1, "request_id": "request/q/1", "at_ms": 0}], "'uri' must be a string"),
        ([{"uri": "c1", "request_id": "request/q/1", "at_ms": -1}], "'at_ms' must be an integer"),
    ],
)
def test_malformed_recent_greens_are_non_retryable(greens: object, complaint: str) -> None:
    body = json.loads(encode_queue(Queue(name="q")))
    body["recent_greens"] = greens
    with pytest.raises(NonRetryable, match=complaint):
        decode_queue(json.dumps(body).encode())


def test_a_queue_rows_partition_round_trips_and_is_left_out_at_zero() -> None:
    moved = Queue(name="q", latest_request_id="request/q/4", partition=3)
    assert json.loads(encode_queue(moved))["partition"] == 3
    assert decode_queue(encode_queue(moved)) == moved
    # Partition 0 is every row written before partitions existed: no field appears.
    assert "partition" not in json.loads(encode_queue(Queue(name="q")))
    assert decode_queue(encode_queue(Queue(name="q"))).partition == 0


@pytest.mark.parametrize(
    ("field", "value", "complaint"),
    [
        ("leases", ["request/q/1", 5], "'leases' must map"),
        ("partition", -1, "'partition' must be an integer >= 0"),
        ("partition", "1", "'partition' must be an integer >= 0"),
        ("partition", True, "'partition' must be an integer >= 0"),
        ("leases", {"request/q/1": "5"}, "'leases' must map"),
        ("leases", {"request/q/1": True}, "'leases' must map"),
        ("serial_holder", 3, "'serial_holder' must be a string"),
    ],
)
def test_malformed_lease_fields_are_non_retryable(
    field: str, value: object, complaint: str
) -> None:
    body = json.loads(encode_queue(Queue(name="q")))
    body[field] = value
    with pytest.raises(NonRetryable) as caught:
        decode_queue(json.dumps(body).encode())
    assert complaint in str(caught.value)


SEARCH = CulpritSearch(
    queue="monorepo/main",
    state="searching",
    red_request_id="request/monorepo/main/9",
    base_uri="c0",
    blamelist=("c1", "c2", "c3"),
    tallies=(Tally(1, 0), Tally(), Tally(0, 1)),
    probes=(Probe("request/monorepo/main/11", "c2", 1234),),
    probes_started=2,
    started_at_ms=1000,
    version=3,
)


def test_a_search_row_round_trips() -> None:
    assert decode_search(encode_search(SEARCH)) == SEARCH
    assert decode_search(encode_search(CulpritSearch("q/a"))) == CulpritSearch("q/a")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("tallies", [[1, 0]], r"one \[greens, reds\] pair"),
        ("tallies", [[1, 0], [0, -1], [0, 1]], r"one \[greens, reds\] pair"),
        ("blamelist", ["c"] * 1001, "at most 1000 strings"),
        ("probes", [{"request_id": "r", "commit": "c"}], "request_id, commit and started_at_ms"),
        ("probes_started", -1, "integer >= 0"),
    ],
)
def test_a_damaged_search_row_is_refused_naming_the_field(
    field: str, value: object, message: str
) -> None:
    body = json.loads(encode_search(SEARCH))
    body[field] = value
    with pytest.raises(NonRetryable, match=message):
        decode_search(json.dumps(body).encode())

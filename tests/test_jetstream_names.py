"""The queue-name encoding: readable, reversible, injective, always a legal token and key."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.js.kv import _is_key_valid

from stovepipe_fsm.adapters.jetstream.names import (
    MAX_NAME_TOKEN_LENGTH,
    InvalidToken,
    decode_queue_token,
    decode_token,
    encode_name_token,
    encode_queue_token,
    encode_token,
    hashed_key,
    is_kv_key,
    is_subject_token,
    request_key,
    uri_key,
)
from stovepipe_fsm.domain.queue_names import InvalidQueueName, validate_stored_queue_name

_NAME_FORBIDDEN = frozenset(".*> /\\")

# Every character a queue name may hold: no whitespace, no control/format/unassigned
# code points (category C*), no wildcards. Slash rules are left to the filter below.
_queue_chars = st.characters(
    blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"),
    blacklist_characters="*>",
).filter(lambda c: not c.isspace())


def _is_valid(name: str) -> bool:
    try:
        validate_stored_queue_name(name)  # every name the store may hold, old ones too
    except InvalidQueueName:
        return False
    return True


_any_queue_names = st.text(_queue_chars, min_size=1, max_size=200).filter(_is_valid)
_path_like_names = st.lists(
    st.text(st.sampled_from("abcXYZ019-_.=:@%~é主"), min_size=1, max_size=8),
    min_size=1,
    max_size=5,
).map("/".join)
queue_names = st.one_of(_any_queue_names, _path_like_names.filter(_is_valid))


@given(queue_names)
def test_every_valid_queue_name_round_trips(queue: str) -> None:
    token = encode_queue_token(queue)
    assert decode_queue_token(token) == queue
    assert decode_token(token) == queue


@given(queue_names)
def test_every_token_is_a_subject_token_and_a_kv_key(queue: str) -> None:
    token = encode_queue_token(queue)
    assert is_subject_token(token)
    assert is_kv_key(token)
    # The nats client's own key check is the oracle for "valid KV key".
    assert _is_key_valid(token)


@given(queue_names, queue_names)
def test_encoding_is_injective(a: str, b: str) -> None:
    if a != b:
        assert encode_queue_token(a) != encode_queue_token(b)


@given(queue_names, st.text(min_size=1, max_size=1500))
def test_uri_keys_are_valid_kv_keys(queue: str, uri: str) -> None:
    key = uri_key(queue, uri)
    assert _is_key_valid(key)
    queue_part, _, _ = key.partition(".")
    assert decode_queue_token(queue_part) == queue


@given(queue_names)
def test_name_tokens_are_legal_consumer_names(queue: str) -> None:
    name = encode_name_token(queue)
    assert name and len(name) <= MAX_NAME_TOKEN_LENGTH
    assert not any(c in _NAME_FORBIDDEN or c.isspace() for c in name)


@given(queue_names, queue_names)
def test_name_tokens_are_distinct(a: str, b: str) -> None:
    if a != b:
        assert encode_name_token(a) != encode_name_token(b)


@pytest.mark.parametrize(
    ("queue", "token"),
    [
        ("monorepo/main", "monorepo/main"),
        ("org/repo/release/1.2", "org/repo/release/1_2E2"),
        ("under_score", "under_5Fscore"),
        ("a=b-c", "a=b-c"),
        ("ünï/主", "_C3_BCn_C3_AF/_E4_B8_BB"),
    ],
)
def test_common_names_stay_readable(queue: str, token: str) -> None:
    assert encode_queue_token(queue) == token


@pytest.mark.parametrize(
    "token",
    [
        "",  # empty
        "a.b",  # '.' is never in a token
        "a b",  # whitespace
        "_2e",  # lower-case hex is not canonical
        "_41",  # 'A' is safe: escaping it is not canonical
        "_4",  # truncated escape
        "_ZZ",  # not hex
        "_FF",  # not UTF-8
        "_C3",  # truncated UTF-8 sequence
        "a*",  # wildcard
    ],
)
def test_non_canonical_tokens_are_rejected(token: str) -> None:
    with pytest.raises(InvalidToken):
        decode_token(token)


def test_queue_tokens_must_decode_to_valid_queue_names() -> None:
    with pytest.raises(InvalidToken):
        decode_queue_token("a//b")  # decodes, but '//' is an empty segment
    with pytest.raises(InvalidQueueName):
        encode_queue_token("bad queue")


def test_hashed_keys_never_equal_an_encoding() -> None:
    key = hashed_key("x" * 1000)
    assert _is_key_valid(key)
    with pytest.raises(InvalidToken):
        decode_token(key)


def test_request_keys_keep_request_ids_readable() -> None:
    assert request_key("request/monorepo/main/7") == "request/monorepo/main/7"
    with pytest.raises(ValueError):
        encode_token("")


def test_long_uris_are_keyed_by_digest() -> None:
    short, long = uri_key("q", "abc"), uri_key("q", "u" * 1000)
    assert short == "q.abc"
    assert long.startswith("q._H") and len(long) < 100

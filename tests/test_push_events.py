"""Reading push webhooks and limiting their rate: pure functions, no broker."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from test_webhook import SECRET, ZERO, github_push, gitlab_push

from stovepipe_fsm.apps.service.push_events import (
    GITHUB,
    GITLAB,
    BadEvent,
    Unauthenticated,
    check_github_signature,
    check_gitlab_token,
    delivery_id,
    event_name,
    parse_push,
)
from stovepipe_fsm.apps.service.rate_limit import RateLimit

A, B, C = "a" * 40, "b" * 40, "c" * 40


def test_a_github_signature_is_the_hmac_of_the_exact_body() -> None:
    body = json.dumps(github_push(A, B, [B])).encode()
    good = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    check_github_signature(SECRET.encode(), body, {"x-hub-signature-256": good})
    for headers in ({}, {"x-hub-signature-256": good.upper()}, {"x-hub-signature-256": "x"}):
        with pytest.raises(Unauthenticated):
            check_github_signature(SECRET.encode(), body, headers)
    with pytest.raises(Unauthenticated):
        check_github_signature(SECRET.encode(), body + b" ", {"x-hub-signature-256": good})
    check_gitlab_token(b"t", {"x-gitlab-token": "t"})
    with pytest.raises(Unauthenticated):
        check_gitlab_token(b"t", {})


def test_commits_are_read_oldest_first_whichever_order_the_forge_lists() -> None:
    newest_first = gitlab_push(A, C, [C, B], 2)
    oldest_first = gitlab_push(A, C, [B, C], 2)
    for payload in (newest_first, oldest_first):
        push = parse_push(GITLAB, "d", json.dumps(payload).encode())
        assert (push.commits, push.unlisted, push.repository) == ((B, C), 0, "acme/mono")
    truncated = parse_push(GITLAB, "d", json.dumps(gitlab_push(A, C, [B, C], 30)).encode())
    assert truncated.unlisted == 28
    deleted = parse_push(GITHUB, "d", json.dumps(github_push(A, ZERO, [], deleted=True)).encode())
    assert deleted.deleted and not deleted.created and deleted.total is None
    forced = parse_push(GITHUB, "d", json.dumps(github_push(B, A, [], forced=True)).encode())
    assert forced.forced and forced.commits == ()


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        json.dumps({"ref": "refs/heads/main", "before": A}).encode(),
        json.dumps({**github_push(A, B, [B]), "after": "--output=x"}).encode(),
        json.dumps({**github_push(A, B, [B]), "commits": {"id": B}}).encode(),
    ],
)
def test_a_body_that_is_no_push_is_a_bad_event(body: bytes) -> None:
    with pytest.raises(BadEvent):
        parse_push(GITHUB, "d", body)


def test_events_and_delivery_ids_of_both_forges() -> None:
    assert event_name(GITHUB, {"x-github-event": "push"}) == "push"
    assert event_name(GITLAB, {"x-gitlab-event": "Push Hook"}) == "push"
    assert event_name(GITLAB, {"x-gitlab-event": "Tag Push Hook"}) == "Tag Push Hook"
    assert delivery_id(GITHUB, {"x-github-delivery": "g-1"}) == "g-1"
    both = {"x-gitlab-event-uuid": "u-1", "idempotency-key": "k-1"}
    assert delivery_id(GITLAB, both) == "k-1"
    assert delivery_id(GITLAB, {"x-gitlab-event-uuid": "u-1"}) == "u-1"
    for headers in ({}, {"x-github-delivery": "x" * 300}, {"x-github-delivery": "a\x01"}):
        with pytest.raises(BadEvent):
            delivery_id(GITHUB, headers)


def test_a_rate_limit_is_a_burst_then_a_steady_rate_per_client() -> None:
    now = [0.0]
    limit = RateLimit(2.0, 3, max_clients=2, clock=lambda: now[0])
    assert [limit.allow("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limit.allow("a") == pytest.approx(0.5)
    assert limit.allow("b") == 0.0  # another client has its own bucket
    now[0] += 0.5
    assert limit.allow("a") == 0.0 and limit.allow("a") > 0
    with pytest.raises(ValueError):
        RateLimit(0, 1)

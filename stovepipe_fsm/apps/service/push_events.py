"""Push webhooks of GitHub and GitLab: who sent them, and what they say was pushed.

Authentication, per forge:

- GitHub signs the raw body: ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body
  keyed by the webhook's secret>``; ``X-GitHub-Event`` names the event (``push``, and
  ``ping`` when the hook is created), ``X-GitHub-Delivery`` the delivery (the same id
  when it is delivered again).
- GitLab sends the webhook's secret token itself in ``X-Gitlab-Token``;
  ``X-Gitlab-Event: Push Hook`` names the event, ``X-Gitlab-Event-UUID`` the delivery
  (``Idempotency-Key``, where GitLab sends one, is the same across its retries and
  wins).

Both compare in constant time. The payload fields read are the ones both forges
publish for a push: ``ref``, ``before``, ``after``, ``commits[].id``; GitHub's
``deleted`` and ``forced``; GitLab's ``total_commits_count`` (its ``commits`` lists at most
the newest 20) and the project's ``path_with_namespace`` (GitHub: the repository's
``full_name``). A deletion pushes ``after`` = all zeros, a new branch ``before`` = all
zeros. ``commits`` is returned oldest first whichever order the forge listed it in, ending
with ``after``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...adapters.git import is_full_commit_id

GITHUB = "github"
GITLAB = "gitlab"
#: A delivery id longer than this is no forge's.
MAX_DELIVERY_ID = 256


class Unauthenticated(Exception):
    """No valid signature or token: nothing of the request is believed."""


class BadEvent(ValueError):
    """An authenticated request that is not a readable push event."""


@dataclass(frozen=True)
class PushEvent:
    forge: str
    delivery: str
    repository: str
    ref: str
    before: str
    after: str
    #: The commits the payload lists, oldest first, ending with ``after`` (when listed).
    commits: tuple[str, ...]
    forced: bool
    #: How many commits the push holds, where the forge says (GitLab); None: unknown.
    total: int | None

    @property
    def deleted(self) -> bool:
        return _zero(self.after)

    @property
    def created(self) -> bool:
        return _zero(self.before)

    @property
    def unlisted(self) -> int:
        """Commits of the push the payload does not list (as far as the forge says)."""
        if self.total is None:
            return 0
        return max(0, self.total - len(self.commits))


def _zero(sha: str) -> bool:
    return not sha.strip("0")


def check_github_signature(secret: bytes, body: bytes, headers: Mapping[str, str]) -> None:
    signature = headers.get("x-hub-signature-256", "")
    expected = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(signature.encode(), expected.encode()):
        raise Unauthenticated("X-Hub-Signature-256 is missing or wrong")


def check_gitlab_token(secret: bytes, headers: Mapping[str, str]) -> None:
    token = headers.get("x-gitlab-token", "").encode("latin-1")
    if not hmac.compare_digest(token, secret):
        raise Unauthenticated("X-Gitlab-Token is missing or wrong")


def event_name(forge: str, headers: Mapping[str, str]) -> str:
    """``push`` for a push event of either forge; the forge's own name otherwise."""
    if forge == GITHUB:
        return headers.get("x-github-event", "")
    name = headers.get("x-gitlab-event", "")
    return "push" if name == "Push Hook" else name


def delivery_id(forge: str, headers: Mapping[str, str]) -> str:
    if forge == GITHUB:
        delivery = headers.get("x-github-delivery", "")
    else:
        delivery = headers.get("idempotency-key") or headers.get("x-gitlab-event-uuid", "")
    if not delivery or len(delivery) > MAX_DELIVERY_ID or not delivery.isprintable():
        raise BadEvent("the request names no delivery id (X-GitHub-Delivery, X-Gitlab-Event-UUID)")
    return delivery


def parse_push(forge: str, delivery: str, body: bytes) -> PushEvent:
    """The push a verified body describes; :class:`BadEvent` when it is not one."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadEvent(f"the body is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise BadEvent("the body is not a JSON object")
    ref = _text(payload, "ref")
    before, after = _sha(payload, "before"), _sha(payload, "after")
    listed = payload.get("commits") or []
    if not isinstance(listed, list):
        raise BadEvent("commits is not a list")
    ids = [_sha(commit, "id") if isinstance(commit, dict) else "" for commit in listed]
    if forge == GITHUB:
        repository = _text(payload.get("repository") or {}, "full_name", required=False)
        forced = payload.get("forced") is True
        total = None
        if payload.get("deleted") is True:
            after = "0" * len(after)
    else:
        repository = _text(payload.get("project") or {}, "path_with_namespace", required=False)
        forced = False
        count = payload.get("total_commits_count")
        total = count if isinstance(count, int) and count >= 0 else None
    return PushEvent(
        forge=forge,
        delivery=delivery,
        repository=repository,
        ref=ref,
        before=before,
        after=after,
        commits=_oldest_first(ids, after),
        forced=forced,
        total=total,
    )


def _oldest_first(ids: list[str], after: str) -> tuple[str, ...]:
    """The listed commits, oldest first, ``after`` last: a forge that lists the newest
    first (``after`` at the front) is read backwards."""
    if len(ids) > 1 and ids[0] == after and ids[-1] != after:
        ids = ids[::-1]
    return tuple(dict.fromkeys(ids))


def _text(payload: Any, field: str, *, required: bool = True) -> str:
    value = payload.get(field) if isinstance(payload, dict) else None
    if isinstance(value, str) and value and len(value) <= 1024 and value.isprintable():
        return value
    if required:
        raise BadEvent(f"{field} is missing or not a short string")
    return ""


def _sha(payload: dict[str, Any], field: str) -> str:
    value = _text(payload, field)
    if not is_full_commit_id(value):
        raise BadEvent(f"{field} {value[:80]!r} is not a full commit id")
    return value.lower()

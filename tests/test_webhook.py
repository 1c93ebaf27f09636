"""``webhook``: GitHub and GitLab push events over real HTTP, into a real broker.

The payloads follow the forges' published push-event formats (GitHub's ``push`` event:
``ref``, ``before``, ``after``, ``created``, ``deleted``, ``forced``, ``commits[]`` oldest
first, ``head_commit``, ``repository.full_name``; GitLab's ``Push Hook``: ``object_kind``,
``checkout_sha``, ``commits[]`` (at most the newest 20), ``total_commits_count``,
``project.path_with_namespace``), with the commit ids of a real git repository.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_service_cli import CLI, ROOT, cli, status, tag  # noqa: F401
from test_service_poll import commit, git, make_repo

from stovepipe_fsm.adapters.jetstream.server import free_port

SECRET = "It's a Secret to Everybody"
TOKEN = "gitlab-hook-token"
REPO = "acme/mono"
ZERO = "0" * 40


def github_push(
    before: str,
    after: str,
    commits: list[str],
    *,
    ref: str = "refs/heads/main",
    forced: bool = False,
    deleted: bool = False,
) -> dict:
    def entry(sha: str) -> dict:
        person = {"name": "t", "email": "t@example.invalid", "username": "t"}
        return {
            "id": sha,
            "tree_id": "f" * 40,
            "distinct": True,
            "message": f"commit {sha[:7]}",
            "timestamp": "2026-01-01T00:00:00Z",
            "url": f"https://github.com/{REPO}/commit/{sha}",
            "author": person,
            "committer": person,
            "added": [],
            "removed": [],
            "modified": ["README.md"],
        }

    return {
        "ref": ref,
        "before": before,
        "after": after,
        "created": before == ZERO,
        "deleted": deleted,
        "forced": forced,
        "base_ref": None,
        "compare": f"https://github.com/{REPO}/compare/{before[:12]}...{after[:12]}",
        "commits": [entry(sha) for sha in commits],
        "head_commit": entry(after) if not deleted else None,
        "repository": {"id": 1, "name": "mono", "full_name": REPO, "default_branch": "main"},
        "pusher": {"name": "t", "email": "t@example.invalid"},
        "sender": {"login": "t", "id": 1},
    }


def gitlab_push(before: str, after: str, commits: list[str], total: int) -> dict:
    return {
        "object_kind": "push",
        "event_name": "push",
        "before": before,
        "after": after,
        "ref": "refs/heads/main",
        "checkout_sha": after,
        "user_id": 4,
        "user_name": "t",
        "user_username": "t",
        "user_email": "",
        "project_id": 15,
        "project": {"id": 15, "name": "mono", "path_with_namespace": REPO},
        "commits": [
            {
                "id": sha,
                "message": f"commit {sha[:7]}",
                "title": f"commit {sha[:7]}",
                "timestamp": "2026-01-01T00:00:00+00:00",
                "url": f"https://gitlab.example.com/{REPO}/-/commit/{sha}",
                "author": {"name": "t", "email": "t@example.invalid"},
                "added": [],
                "modified": ["README.md"],
                "removed": [],
            }
            for sha in commits
        ],
        "total_commits_count": total,
        "repository": {"name": "mono", "url": f"git@gitlab.example.com:{REPO}.git"},
    }


def post(
    port: int, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, str, dict[str, str]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, body=body, headers=headers)
        reply = connection.getresponse()
        return reply.status, reply.read().decode(), dict(reply.getheaders())
    finally:
        connection.close()


def to_github(
    port: int, payload: dict, *, delivery: str = "", secret: str = SECRET, event: str = "push"
) -> tuple[int, str, dict[str, str]]:
    body = json.dumps(payload).encode()
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": f"sha256={signature}",
        "User-Agent": "GitHub-Hookshot/test",
    }
    return post(port, "/github", body, headers)


def to_gitlab(
    port: int, payload: dict, *, token: str = TOKEN, delivery: str = ""
) -> tuple[int, str, dict[str, str]]:
    headers = {
        "Content-Type": "application/json",
        "X-Gitlab-Event": "Push Hook",
        "X-Gitlab-Event-UUID": delivery or str(uuid.uuid4()),
        "X-Gitlab-Token": token,
    }
    return post(port, "/gitlab", json.dumps(payload).encode(), headers)


class Webhook:
    """``webhook`` processes on one broker and topology, and a git repository."""

    def __init__(self, url: str, tag: str, tmp_path: Path) -> None:  # noqa: F811
        self.url, self.tag, self.tmp_path = url, tag, tmp_path
        self.repo = make_repo(tmp_path)
        self.processes: list[subprocess.Popen[str]] = []

    def latest(self) -> str:
        """The uri of the queue's latest request: the head trunk validation stands at."""
        doc = status(self.url, self.tag)
        latest = doc["queues"][0]["latest_request_id"]
        return next(r["uri"] for r in doc["requests"] if r["id"] == latest)

    def stored(self) -> list[str]:
        """The stored requests' uris, in the order of their ids."""
        done = cli("status", "--json", "--all", "--nats", self.url, "--topology-tag", self.tag)
        assert done.returncode == 0, done.stderr
        requests = json.loads(done.stdout)["requests"]
        ordered = sorted(requests, key=lambda r: int(r["id"].rsplit("/", 1)[1]))
        return [r["uri"] for r in ordered]

    def start(self, *extra: str, queue: str = "mono/main") -> int:
        secret = self.tmp_path / f"github-secret-{len(self.processes)}"
        secret.write_text(SECRET + "\n")
        secret.chmod(0o600)
        port = free_port()
        args = [*CLI, "webhook", "--nats", self.url, "--topology-tag", self.tag]
        args += ["--port", str(port), "--ref", "main", "--queue", queue]
        args += ["--repository", REPO, "--github-secret-file", str(secret), *extra]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "STOVEPIPE_GITLAB_WEBHOOK_TOKEN": TOKEN}
        process = subprocess.Popen(
            args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.processes.append(process)
        line = process.stdout.readline() if process.stdout else ""
        assert line.startswith("webhook endpoint on"), (
            line,
            process.stderr and process.stderr.read(),
        )
        return port

    def stop(self) -> list[str]:
        errors = []
        for process in self.processes:
            process.terminate()
            _, err = process.communicate(timeout=30)
            assert process.returncode == 0, err
            errors.append(err)
        return errors


@pytest.fixture
def webhook(nats_server, tag, tmp_path) -> Iterator[Webhook]:  # noqa: F811
    hook = Webhook(nats_server.url, tag, tmp_path)
    yield hook
    hook.stop()


def test_a_github_push_ingests_every_commit_oldest_first_once(webhook) -> None:
    repo = webhook.repo
    base = commit(repo, "A")
    pushed = [commit(repo, name) for name in "BCD"]
    port = webhook.start()

    code, body, _ = to_github(port, github_push(base, pushed[-1], pushed), delivery="d-1")
    assert code == 200, body
    report = json.loads(body)
    assert [c["uri"] for c in report["ingested"]] == pushed
    assert all(c["created"] for c in report["ingested"]) and report["duplicate"] is False
    assert webhook.stored() == pushed
    doc = status(webhook.url, webhook.tag)
    assert doc["queues"][0]["latest_request_id"] == report["ingested"][-1]["request_id"]

    # The forge delivers it again: nothing more is ingested.
    code, body, _ = to_github(port, github_push(base, pushed[-1], pushed), delivery="d-1")
    assert (code, json.loads(body)["duplicate"]) == (200, True)
    # Another delivery of the same commits (a second hook): the ref is reported there
    # already, so it is stale and nothing is ingested.
    code, body, _ = to_github(port, github_push(base, pushed[-1], pushed), delivery="d-2")
    assert code == 202 and json.loads(body)["stale"] is True
    assert webhook.stored() == pushed


def test_a_forged_or_missing_signature_is_refused_and_ingests_nothing(webhook) -> None:
    repo = webhook.repo
    base, tip = commit(repo, "A"), commit(repo, "B")
    port = webhook.start()
    payload = github_push(base, tip, [tip])

    assert to_github(port, payload, secret="guessed")[0] == 401
    body = json.dumps(payload).encode()
    unsigned = {"X-GitHub-Event": "push", "X-GitHub-Delivery": "x", "Content-Type": "a/json"}
    assert post(port, "/github", body, unsigned)[0] == 401
    assert to_gitlab(port, gitlab_push(base, tip, [tip], 1), token="guessed")[0] == 401
    assert webhook.stored() == []
    # A signed delivery after them is taken: the refusals recorded nothing either.
    assert to_github(port, payload, delivery="x")[0] == 200
    assert webhook.stored() == [tip]


def test_bodies_and_rates_are_bounded_and_deletions_ignored(webhook) -> None:
    repo = webhook.repo
    base, tip = commit(repo, "A"), commit(repo, "B")
    port = webhook.start("--max-body", "4096", "--rate", "0.01", "--burst", "4")

    big = github_push(base, tip, [tip])
    big["padding"] = "x" * 8192
    assert to_github(port, big)[0] == 413
    deleted = to_github(port, github_push(tip, ZERO, [], deleted=True))
    assert deleted[0] == 202 and "deleted" in json.loads(deleted[1])["ignored"]
    tag_push = to_github(port, github_push(base, tip, [tip], ref="refs/tags/v1"))
    assert tag_push[0] == 202 and "not followed" in json.loads(tag_push[1])["ignored"]
    assert webhook.stored() == []
    assert to_github(port, github_push(base, tip, [tip]))[0] == 200  # the 4th of the burst
    code, _, headers = to_github(port, github_push(base, tip, [tip]))
    assert code == 429 and int(headers["Retry-After"]) >= 1
    assert webhook.stored() == [tip]


def test_a_force_push_ingests_its_tip_as_a_return(webhook) -> None:
    """A force-push back to A after B: A is validated again (a new request), the newest."""
    repo = webhook.repo
    first, second = commit(repo, "A"), commit(repo, "B")
    port = webhook.start()
    assert to_github(port, github_push(ZERO, first, [first]))[0] == 200
    assert to_github(port, github_push(first, second, [second]))[0] == 200
    code, body, _ = to_github(port, github_push(second, first, [], forced=True))
    assert code == 200
    report = json.loads(body)
    assert report["forced"] is True and [c["uri"] for c in report["ingested"]] == [first]
    assert report["ingested"][0]["created"] is True
    assert webhook.stored() == [first, second, first]
    assert code == 200 and to_github(port, {}, event="ping")[0] == 200


def test_gitlab_pushes_past_the_listed_twenty_are_read_from_the_clone(webhook) -> None:
    """GitLab lists the newest 20 of 25 commits: with a clone, all 25 are ingested, first
    parents only; without one, the 20 listed, the 5 others reported as unlisted."""
    repo = webhook.repo
    base = commit(repo, "A")
    pushed = [commit(repo, f"C{n}") for n in range(25)]
    git(repo, "checkout", "-q", "-b", "side", pushed[-1])
    side = commit(repo, "S")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "M", "side")
    merge = git(repo, "rev-parse", "HEAD")
    pushed.append(merge)
    listed = [*pushed[-19:-1], side, merge]  # the newest 20 of the 27 commits pushed
    with_clone = webhook.start("--git-repo", str(repo), queue="mono/clone")
    without = webhook.start()

    code, body, _ = to_gitlab(without, gitlab_push(base, merge, listed, 27))
    assert code == 200, body
    report = json.loads(body)
    assert (report["source"], report["unlisted"]) == ("payload", 7)
    assert [c["uri"] for c in report["ingested"]] == listed

    code, body, _ = to_gitlab(with_clone, gitlab_push(base, merge, listed, 27))
    assert code == 200, body
    report = json.loads(body)
    assert (report["source"], report["unlisted"], report["skipped"]) == ("git", 0, 0)
    assert [c["uri"] for c in report["ingested"]] == pushed
    assert set(webhook.stored()) == {*pushed, side}


def test_webhook_refuses_to_start_without_a_readable_secret(
    nats_server,
    tag,  # noqa: F811
) -> None:
    common = ["webhook", "--nats", nats_server.url, "--topology-tag", tag, "--port", "0"]
    env = {k: v for k, v in os.environ.items() if "WEBHOOK" not in k}
    done = subprocess.run(
        [*CLI, *common, "--ref", "main", "--queue", "q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2 and "unauthenticated" in done.stderr, done.stderr
    missing = cli(*common, "--ref", "main", "--queue", "q", "--github-secret-file", "nofile")
    assert missing.returncode == 2 and "--github-secret-file nofile" in missing.stderr


def late_push_sequence(webhook: Webhook, *extra: str) -> tuple[int, list[str]]:
    """A, then B and C pushed one at a time; the push of A is ingested, the push of B
    (delivery d-1) failed before it was recorded, the push of C (d-2) is ingested."""
    repo = webhook.repo
    a, b, c = (commit(repo, name) for name in "ABC")
    port = webhook.start(*extra)
    assert to_github(port, github_push(ZERO, a, [a]), delivery="d-0")[0] == 200
    code, body, _ = to_github(port, github_push(b, c, [c]), delivery="d-2")
    assert code == 200, body
    return port, [a, b, c]


@pytest.mark.parametrize("clone", [True, False], ids=["clone", "no-clone"])
def test_a_late_push_is_stale_and_never_moves_latest_back(webhook, clone) -> None:
    """The push of B arrives after the push of C was ingested: B is not ingested, C
    stays the head trunk validation stands at; a repeat of the late delivery is a
    duplicate."""
    extra = ("--git-repo", str(webhook.repo)) if clone else ()
    port, (a, b, c) = late_push_sequence(webhook, *extra)

    code, body, _ = to_github(port, github_push(a, b, [b]), delivery="d-1")
    assert code == 202, body
    report = json.loads(body)
    assert (report["stale"], report["after"]) == (True, b)
    assert c in report["why"]
    assert webhook.stored() == [a, c]
    assert webhook.latest() == c
    again = to_github(port, github_push(a, b, [b]), delivery="d-1")
    assert (again[0], json.loads(again[1])["duplicate"]) == (200, True)
    (errors,) = webhook.stop()
    assert errors.count("stale") == 1, errors


def test_without_a_clone_a_late_push_no_stored_push_named_is_ingested(webhook) -> None:
    """Without a clone, B's push delivered after C's and D's (C's push lost too) names a
    commit nothing stored knows: ingested (as documented). With a clone it is stale."""
    repo = webhook.repo
    a, b, c, d = (commit(repo, name) for name in "ABCD")
    without = webhook.start()
    with_clone = webhook.start("--git-repo", str(repo), queue="mono/clone")
    for port in (without, with_clone):
        assert to_github(port, github_push(ZERO, a, [a]))[0] == 200
        assert to_github(port, github_push(c, d, [d]))[0] == 200

    late = github_push(a, b, [b])
    code, body, _ = to_github(without, late)
    assert (code, [i["uri"] for i in json.loads(body)["ingested"]]) == (200, [b])
    code, body, _ = to_github(with_clone, late)
    assert (code, json.loads(body)["stale"]) == (202, True)


def test_a_forced_push_onto_an_older_commit_is_a_rollback(webhook) -> None:
    """A force-push from C back to B is not stale: B is validated again, the newest."""
    port, (_, b, c) = late_push_sequence(webhook, "--git-repo", str(webhook.repo))
    code, body, _ = to_github(port, github_push(c, b, [], forced=True))
    assert code == 200, body
    report = json.loads(body)
    assert (report["forced"], [i["uri"] for i in report["ingested"]]) == (True, [b])
    assert webhook.latest() == b
    # Then the ref moves on from B: in order again.
    d = commit(webhook.repo, "D")
    assert to_github(port, github_push(b, d, [d]))[0] == 200
    assert webhook.latest() == d


def test_a_gitlab_rollback_from_the_cursor_is_ingested_without_a_clone(webhook) -> None:
    """GitLab does not say ``forced``: a push that starts at the commit the ref was
    reported at and lands on an older one is a rollback, ingested as a return."""
    repo = webhook.repo
    a, b = commit(repo, "A"), commit(repo, "B")
    port = webhook.start()
    assert to_gitlab(port, gitlab_push(ZERO, a, [a], 1))[0] == 200
    assert to_gitlab(port, gitlab_push(a, b, [b], 1))[0] == 200
    code, body, _ = to_gitlab(port, gitlab_push(b, a, [], 0))
    assert code == 200, body
    assert webhook.latest() == a and webhook.stored() == [a, b, a]


def test_in_order_pushes_are_each_ingested(webhook) -> None:
    repo = webhook.repo
    port = webhook.start("--git-repo", str(repo))
    before, seen = ZERO, []
    for name in "ABCD":
        tip = commit(repo, name)
        code, body, _ = to_github(port, github_push(before, tip, [tip]))
        assert code == 200 and json.loads(body)["ingested"][0]["created"], body
        before = tip
        seen.append(tip)
        assert webhook.latest() == tip
    assert webhook.stored() == seen

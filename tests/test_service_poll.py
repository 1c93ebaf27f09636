"""``poll``: a real git repository, a real broker, the real CLI process."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from test_service_cli import CLI, ROOT, cli, status, tag, wait_until  # noqa: F401

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "PATH": "/usr/bin:/bin",
}


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=GIT_ENV, check=True
    )
    return done.stdout.strip()


def commit(repo: Path, message: str) -> str:
    git(repo, "commit", "--allow-empty", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def stored_uris(url: str, topology_tag: str) -> list[str]:
    """The uris of stored requests; none while the poller has not created the buckets."""
    done = cli("status", "--json", "--nats", url, "--topology-tag", topology_tag)
    if done.returncode != 0:
        return []
    return [r["uri"] for r in json.loads(done.stdout)["requests"]]


def poll_args(url: str, topology_tag: str, repo: Path, *extra: str) -> list[str]:
    """``poll`` against ``repo`` on its own topology; ``extra`` adds or overrides flags."""
    return ["poll", "--nats", url, "--topology-tag", topology_tag, "--git-repo", str(repo), *extra]


def make_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    return repo


def test_poll_once_ingests_the_head_and_dedups_a_repeat(nats_server, tag, tmp_path) -> None:  # noqa: F811
    repo = make_repo(tmp_path)
    first = commit(repo, "A")
    args = poll_args(nats_server.url, tag, repo, "--ref", "main", "--queue", "mono/main", "--once")

    done = cli(*args)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["uri"] == first and report["created"] is True and report["published"] is True

    again = json.loads(cli(*args).stdout)
    assert again["request_id"] == report["request_id"] and again["created"] is False

    second = commit(repo, "B")
    newer = json.loads(cli(*args).stdout)
    assert newer["uri"] == second and newer["created"] is True
    doc = status(nats_server.url, tag)
    assert [r["uri"] for r in doc["requests"]] == [first, second]
    assert doc["queues"][0]["latest_request_id"] == newer["request_id"]


def test_one_poller_follows_many_refs_into_their_queues(nats_server, tag, tmp_path) -> None:  # noqa: F811
    repo = make_repo(tmp_path)
    first = commit(repo, "A")
    git(repo, "branch", "release")
    second = commit(repo, "B")
    refs = ["--ref", "main", "--queue", "mono/main", "--ref", "release", "--queue", "mono/rel"]
    args = poll_args(nats_server.url, tag, repo, *refs, "--once")

    done = cli(*args)
    assert done.returncode == 0, done.stderr
    reports = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["queue"], r["uri"], r["created"]) for r in reports] == [
        ("mono/main", second, True),
        ("mono/rel", first, True),
    ]
    again = [json.loads(line) for line in cli(*args).stdout.splitlines()]
    assert [r["created"] for r in again] == [False, False]
    assert [r["request_id"] for r in again] == [r["request_id"] for r in reports]
    doc = status(nats_server.url, tag)
    assert sorted((q["name"], q["latest_request_id"]) for q in doc["queues"]) == [
        ("mono/main", reports[0]["request_id"]),
        ("mono/rel", reports[1]["request_id"]),
    ]
    unmatched = poll_args(nats_server.url, tag, repo, "--ref", "main", "--ref", "x", "--once")
    assert cli(*[*unmatched, "--queue", "q"]).returncode == 2


def test_a_ref_rolled_back_to_an_earlier_head_validates_it_again(
    nats_server,
    tag,  # noqa: F811
    tmp_path,
) -> None:
    """A force-push back to A after B: the poller ingests A as a new head, the newest."""
    repo = make_repo(tmp_path)
    first = commit(repo, "A")
    args = poll_args(nats_server.url, tag, repo, "--ref", "main", "--queue", "mono/main", "--once")
    assert cli(*args).returncode == 0
    commit(repo, "B")
    assert cli(*args).returncode == 0
    git(repo, "reset", "-q", "--hard", first)

    back = json.loads(cli(*args).stdout)
    assert (back["uri"], back["created"], back["returned"]) == (first, True, True)
    assert back["request_id"] == "request/mono/main/3"
    doc = status(nats_server.url, tag)
    assert doc["queues"][0]["latest_request_id"] == back["request_id"]
    assert [(r["id"][-1], r["uri"]) for r in doc["requests"]][-1] == ("3", first)
    # The same observation again is the same head.
    again = json.loads(cli(*args).stdout)
    assert (again["request_id"], again["created"]) == (back["request_id"], False)
    assert again["returned"] is False


def test_poll_follows_new_heads_until_sigterm(nats_server, tag, tmp_path) -> None:  # noqa: F811
    repo = make_repo(tmp_path)
    first = commit(repo, "A")
    process = subprocess.Popen(
        [
            *CLI,
            *poll_args(
                nats_server.url,
                tag,
                repo,
                "--ref",
                "main",
                "--queue",
                "mono/main",
                "--interval",
                "0.2",
            ),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: stored_uris(nats_server.url, tag) == [first], "the first head")
        second = commit(repo, "B")
        wait_until(lambda: stored_uris(nats_server.url, tag) == [first, second], "the next head")
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    uris = [json.loads(line)["uri"] for line in out.splitlines()]
    assert uris == [first, second]


def test_poll_reports_bad_input(nats_server, tag, tmp_path) -> None:  # noqa: F811
    repo = make_repo(tmp_path)
    commit(repo, "A")
    common = poll_args(nats_server.url, tag, repo, "--once")
    missing_ref = cli(*common, "--ref", "no-such-branch", "--queue", "mono/main")
    assert missing_ref.returncode == 2
    assert "no-such-branch" in missing_ref.stderr and "Traceback" not in missing_ref.stderr
    bad_queue = cli(*common, "--ref", "main", "--queue", "bad queue")
    assert bad_queue.returncode == 2
    assert "whitespace" in bad_queue.stderr and "Traceback" not in bad_queue.stderr


def poll_main(url: str, topology_tag: str, repo: Path, *extra: str) -> dict:
    """One ``poll --once`` round of ``main`` into ``mono/main``; its report."""
    args = poll_args(url, topology_tag, repo, "--ref", "main", "--queue", "mono/main", "--once")
    done = cli(*args, *extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_commit_pushed_between_two_rounds_is_ingested_oldest_first(
    nats_server,
    tag,  # noqa: F811
    tmp_path,
) -> None:
    """B and C land between two rounds: both are ingested, B before C, in one round;
    a merge brings in only its first-parent commit (the side branch's are no trunk heads)."""
    repo = make_repo(tmp_path)
    first = commit(repo, "A")
    assert poll_main(nats_server.url, tag, repo)["uri"] == first
    second, third = commit(repo, "B"), commit(repo, "C")
    git(repo, "checkout", "-q", "-b", "side", first)
    side = commit(repo, "S")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "M", "side")
    merge = git(repo, "rev-parse", "HEAD")

    report = poll_main(nats_server.url, tag, repo)
    assert report["uri"] == merge and report["since"] == first
    assert [c["uri"] for c in report["earlier"]] == [second, third]
    assert report["commits"] == 3 and report["pending"] == 0 and report["rewritten"] is False
    doc = status(nats_server.url, tag)
    stored = [(int(r["id"].rsplit("/", 1)[1]), r["uri"]) for r in doc["requests"]]
    assert [uri for _, uri in sorted(stored)] == [first, second, third, merge]
    assert side not in [uri for _, uri in stored]
    assert doc["queues"][0]["latest_request_id"] == report["request_id"]

    again = poll_main(nats_server.url, tag, repo)  # nothing new: nothing ingested twice
    assert (again["uri"], again["created"], again["earlier"]) == (merge, False, [])
    assert len(status(nats_server.url, tag)["requests"]) == 4


def test_the_first_round_ingests_the_tip_only(nats_server, tag, tmp_path) -> None:  # noqa: F811
    repo = make_repo(tmp_path)
    commit(repo, "A")
    commit(repo, "B")
    tip = commit(repo, "C")
    report = poll_main(nats_server.url, tag, repo)
    assert (report["uri"], report["since"], report["earlier"]) == (tip, "", [])
    assert [r["uri"] for r in status(nats_server.url, tag)["requests"]] == [tip]


def test_a_rewritten_ref_ingests_its_new_tip_only(nats_server, tag, tmp_path) -> None:  # noqa: F811
    """The commit reported last is no longer an ancestor: only the new tip is a head."""
    repo = make_repo(tmp_path)
    first = commit(repo, "A")
    commit(repo, "B")
    poll_main(nats_server.url, tag, repo)
    git(repo, "reset", "-q", "--hard", first)
    commit(repo, "B2")
    tip = commit(repo, "C2")

    report = poll_main(nats_server.url, tag, repo)
    assert (report["uri"], report["rewritten"], report["earlier"]) == (tip, True, [])
    assert report["created"] is True
    assert len(status(nats_server.url, tag)["requests"]) == 2
    # The rewritten ref is followed from its new tip on.
    newer = commit(repo, "D2")
    follow = poll_main(nats_server.url, tag, repo)
    assert (follow["uri"], follow["since"], follow["rewritten"]) == (newer, tip, False)


def test_a_round_ingests_at_most_max_commits_and_the_next_one_goes_on(
    nats_server,
    tag,  # noqa: F811
    tmp_path,
) -> None:
    repo = make_repo(tmp_path)
    commit(repo, "A")
    poll_main(nats_server.url, tag, repo)
    pushed = [commit(repo, name) for name in "BCDE"]

    bounded = poll_main(nats_server.url, tag, repo, "--max-commits", "3")
    assert [c["uri"] for c in bounded["earlier"]] + [bounded["uri"]] == pushed[:3]
    assert bounded["pending"] == 1
    rest = poll_main(nats_server.url, tag, repo, "--max-commits", "3")
    assert (rest["uri"], rest["since"], rest["earlier"], rest["pending"]) == (
        pushed[3],
        pushed[2],
        [],
        0,
    )
    doc = status(nats_server.url, tag)
    ordered = sorted(doc["requests"], key=lambda r: int(r["id"].rsplit("/", 1)[1]))
    assert [r["uri"] for r in ordered][1:] == pushed
    zero = poll_args(nats_server.url, tag, repo, "--ref", "main", "--queue", "q", "--once")
    assert cli(*zero, "--max-commits", "0").returncode == 2


async def test_a_round_cut_short_before_its_cursor_moved_is_redone_creating_nothing(
    js_env,
    tmp_path,
) -> None:
    """The poller dies between ingesting a range and moving the cursor: the next poller
    reads the same range again, finds every head ingested, and moves the cursor."""
    from stovepipe_fsm.adapters.jetstream import open_cell
    from stovepipe_fsm.adapters.jetstream.ref_cursors import KvRefCursors, RefCursor
    from stovepipe_fsm.apps.options import DEFAULT_MACHINES
    from stovepipe_fsm.apps.service.operators import ingest_on
    from stovepipe_fsm.apps.service.poll import Poller, PollTarget, poll_round

    class DiesBeforeTheCursor(KvRefCursors):
        async def advance(self, read: RefCursor, commit: str, **_: object) -> bool:
            raise SystemExit("killed")

    repo = make_repo(tmp_path)
    commit(repo, "A")
    ingest = await ingest_on(js_env.js, js_env.topology, DEFAULT_MACHINES)
    cell = await open_cell(js_env.js, js_env.topology.service_bucket)
    target = [PollTarget(repo, "main", "mono/main")]
    await poll_round(Poller(ingest, KvRefCursors(cell)), target)
    pushed = [commit(repo, name) for name in "BC"]
    with pytest.raises(SystemExit):
        await poll_round(Poller(ingest, DiesBeforeTheCursor(cell)), target)

    (again,) = await poll_round(Poller(ingest, KvRefCursors(cell)), target)
    assert [c["uri"] for c in again["earlier"]] + [again["uri"]] == pushed
    assert [c["created"] for c in again["earlier"]] + [again["created"]] == [False, False]
    assert (await KvRefCursors(cell).read("mono/main", "main")).commit == pushed[-1]


def publish_like_git_sync(origin: Path, root: Path, link: str) -> str:
    """One sync as git-sync v4 lays it out (what deploy/ relies on): ``root`` a repository
    fetching the branch, a worktree per synced commit under ``root/.worktrees``, checked out
    detached, and ``root/link`` a symlink to it, swapped atomically; the old worktree goes."""
    if not (root / ".git").exists():
        root.mkdir(parents=True)
        git(root, "init", "-q")
    git(root, "fetch", "-q", str(origin), "main")
    head = git(root, "rev-parse", "FETCH_HEAD")
    git(root, "worktree", "add", "-q", "--detach", f".worktrees/{head}", head)
    published = root / link
    old = published.resolve() if published.is_symlink() else None
    (root / f"{link}.new").symlink_to(f".worktrees/{head}")
    (root / f"{link}.new").replace(published)
    if old is not None:
        git(root, "worktree", "remove", "--force", str(old))
    return head


def test_poll_follows_the_head_git_sync_publishes(nats_server, tag, tmp_path) -> None:  # noqa: F811
    """The kit's poller: ``--git-repo`` the link git-sync publishes, ``--ref HEAD``."""
    origin = make_repo(tmp_path)
    commit(origin, "A")
    root = tmp_path / "git" / "main"
    first = publish_like_git_sync(origin, root, "monorepo")
    args = poll_args(
        nats_server.url, tag, root / "monorepo", "--ref", "HEAD", "--queue", "mono/main", "--once"
    )
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["uri"] == first
    commit(origin, "B")
    second = publish_like_git_sync(origin, root, "monorepo")
    assert second != first
    newer = cli(*args)
    assert newer.returncode == 0, newer.stderr
    assert json.loads(newer.stdout)["uri"] == second
    assert stored_uris(nats_server.url, tag) == [first, second]



async def polled_once(js_env, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A repository at A, a poller of its ``main`` into ``mono/main`` that ran one round,
    its ingest and the ref cursors, on the broker."""
    from stovepipe_fsm.adapters.jetstream import open_cell
    from stovepipe_fsm.adapters.jetstream.ref_cursors import KvRefCursors
    from stovepipe_fsm.apps.options import DEFAULT_MACHINES
    from stovepipe_fsm.apps.service.operators import ingest_on
    from stovepipe_fsm.apps.service.poll import Poller, PollTarget, poll_round

    repo = make_repo(tmp_path)
    first = commit(repo, "A")
    ingest = await ingest_on(js_env.js, js_env.topology, DEFAULT_MACHINES)
    cursors = KvRefCursors(await open_cell(js_env.js, js_env.topology.service_bucket))
    poller, targets = Poller(ingest, cursors), [PollTarget(repo, "main", "mono/main")]

    async def round_() -> list[dict[str, object]]:
        return await poll_round(poller, targets)

    await round_()
    return repo, first, ingest, cursors, round_


async def test_a_clone_behind_a_pushed_cursor_ingests_nothing(js_env, tmp_path) -> None:
    """A push moved the ref's cursor past what this clone holds: the poller waits for
    its clone (``behind``) instead of taking its tip as a rewrite and a return."""
    from stovepipe_fsm.adapters.jetstream.ref_cursors import WEBHOOK

    _, first, ingest, cursors, round_ = await polled_once(js_env, tmp_path)
    pushed = "d" * 40  # a commit the forge reported that this clone has not fetched
    await ingest.ingest("mono/main", pushed)
    read = await cursors.read("mono/main", "refs/heads/main")
    assert await cursors.advance(read, pushed, reporter=WEBHOOK, older=[first])

    (report,) = await round_()
    assert (report["behind"], report["commits"], report["since"]) == (True, 0, pushed)
    assert (await cursors.read("mono/main", "main")).commit == pushed
    row = await ingest.queues.get("mono/main")
    assert row.latest_request_id == await ingest.uri_index.get("mono/main", pushed)


async def test_a_clone_not_fetched_since_a_pushed_rollback_does_not_undo_it(
    js_env, tmp_path
) -> None:
    """The clone is at B; a forced push back to A was reported by the webhook (A
    validated again, the cursor at A). The poller's round finds B descending from A:
    B is not taken as a return, A stays the head trunk validation stands at."""
    from stovepipe_fsm.adapters.jetstream.ref_cursors import WEBHOOK

    repo, first, ingest, cursors, round_ = await polled_once(js_env, tmp_path)
    second = commit(repo, "B")
    await round_()
    back = await ingest.ingest("mono/main", first, at_head=True)  # the forced push
    assert back.returned
    read = await cursors.read("mono/main", "main")
    assert await cursors.advance(read, first, reporter=WEBHOOK, continues=False)

    (report,) = await round_()
    assert (report["uri"], report["created"], report["returned"]) == (second, False, False)
    row = await ingest.queues.get("mono/main")
    assert row.latest_request_id == back.request_id

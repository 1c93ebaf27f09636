"""The git adapter against real repositories built in the test's temporary directory."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from contracts import CommitGraph, GraphBuilder, SourceControlContract

from stovepipe_fsm.adapters.git import (
    AncestryCache,
    GitResult,
    GitSourceControl,
    GitSourceControlProvider,
    check_commitish,
    git_environment,
    is_full_commit_id,
    rev_parse,
    subprocess_runner,
)
from stovepipe_fsm.domain.entities import Green
from stovepipe_fsm.domain.errors import EnvironmentFailure, NotFound, Retryable
from stovepipe_fsm.domain.settle import Attempt, SettleKind, settle
from stovepipe_fsm.process.greens import newest_green_ancestor

_IDENTITY = {
    "GIT_AUTHOR_NAME": "Trunk Bot",
    "GIT_AUTHOR_EMAIL": "trunk@example.com",
    "GIT_COMMITTER_NAME": "Trunk Bot",
    "GIT_COMMITTER_EMAIL": "trunk@example.com",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str, stdin: str = "") -> str:
    """Run git in ``repo`` for test setup; fail loudly on any error."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(_IDENTITY)
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return done.stdout.strip()


def init_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    return path


def commit_file(repo: Path, name: str, content: str) -> str:
    (repo / name).write_text(content)
    git(repo, "add", name)
    git(repo, "commit", "-q", "-m", f"{name}: {content}")
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def history(tmp_path: Path) -> dict[str, str]:
    """A trunk c1..c4 and a rewritten trunk r3, r4 forked from c2 (a force-push).

    Also a tree id, an annotated tag on c3, and the repository path under ``"repo"``.
    """
    repo = init_repo(tmp_path / "repo")
    ids = {f"c{n}": commit_file(repo, "trunk.txt", f"v{n}") for n in range(1, 5)}
    git(repo, "tag", "-a", "-m", "release", "v3", ids["c3"])
    git(repo, "checkout", "-q", "-b", "rewritten", ids["c2"])
    ids["r3"] = commit_file(repo, "trunk.txt", "v3-rewritten")
    ids["r4"] = commit_file(repo, "trunk.txt", "v4-rewritten")
    ids["tree"] = git(repo, "rev-parse", "HEAD^{tree}")
    ids["repo"] = str(repo)
    return ids


class CountingRunner:
    """Wraps the real subprocess runner and counts git launches."""

    def __init__(self, repo: str) -> None:
        self._run = subprocess_runner(git_environment(repo))
        self.argvs: list[list[str]] = []

    async def __call__(self, argv: Sequence[str], timeout_s: float) -> GitResult:
        self.argvs.append(list(argv))
        return await self._run(argv, timeout_s)

    @property
    def launches(self) -> int:
        return len(self.argvs)


def fake_git(tmp_path: Path, script: str) -> str:
    path = tmp_path / "fake-git"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


# -- the shared contract, on a real repository ---------------------------------------


class TestGitSourceControlContract(SourceControlContract):
    @pytest.fixture
    def build_graph(self, tmp_path: Path) -> GraphBuilder:
        async def build(parents: Mapping[str, Sequence[str]]) -> CommitGraph:
            repo = init_repo(tmp_path / "graph")
            tree = git(repo, "mktree")
            ids: dict[str, str] = {}
            for name, names in parents.items():
                parent_args = [arg for p in names for arg in ("-p", ids[p])]
                ids[name] = git(repo, "commit-tree", tree, *parent_args, "-m", name)
                git(repo, "update-ref", f"refs/heads/{name}", ids[name])
            return CommitGraph(GitSourceControl(repo), ids, missing="0" * 39 + "1")

        return build


# -- answers -------------------------------------------------------------------------


async def test_fast_forward_rewrite_and_equal(history: dict[str, str]) -> None:
    sc = GitSourceControl(history["repo"])
    assert await sc.is_ancestor(history["c1"], history["c4"]) is True
    assert await sc.is_ancestor(history["c4"], history["c1"]) is False
    assert await sc.is_ancestor(history["c3"], history["c3"]) is True
    # The last green on the old trunk is not a baseline for the rewritten trunk.
    assert await sc.is_ancestor(history["c4"], history["r4"]) is False
    assert await sc.is_ancestor(history["c3"], history["r3"]) is False
    assert await sc.is_ancestor(history["c2"], history["r4"]) is True


async def test_symbolic_and_abbreviated_names_work(history: dict[str, str]) -> None:
    sc = GitSourceControl(history["repo"])
    assert await sc.is_ancestor("main~3", "main") is True
    assert await sc.is_ancestor(history["c2"][:10], "rewritten") is True
    assert await sc.is_ancestor("v3", "main") is True
    assert await sc.is_ancestor(history["c1"].upper(), history["c2"]) is True


@pytest.mark.parametrize(
    "unknown",
    ["0" * 40, "a" * 64, "no-such-branch", "main~99", "main..rewritten"],
)
async def test_unknown_commit_is_not_found(history: dict[str, str], unknown: str) -> None:
    sc = GitSourceControl(history["repo"])
    with pytest.raises(NotFound, match="commit not found"):
        await sc.is_ancestor(unknown, history["c4"])
    with pytest.raises(NotFound):
        await sc.is_ancestor(history["c1"], unknown)


async def test_a_tree_is_not_a_commit(history: dict[str, str]) -> None:
    sc = GitSourceControl(history["repo"])
    with pytest.raises(NotFound):
        await sc.is_ancestor(history["tree"], history["c4"])


UNRESOLVABLE = ["HEAD@{upstream}", "main@{u}", "HEAD@{99}", "main@{push}"]


@pytest.mark.parametrize("name", UNRESOLVABLE)
async def test_revisions_git_cannot_resolve_are_unknown_ancestry(
    history: dict[str, str], name: str
) -> None:
    """Names whose failure git words in its own way (no upstream, a reflog entry that is
    not there) are not found, like any unknown name: a full build, never a retry."""
    sc = GitSourceControl(history["repo"])
    with pytest.raises(NotFound, match="does not resolve to a commit"):
        await sc.is_ancestor(history["c1"], name)
    with pytest.raises(NotFound):
        await sc.is_ancestor(name, history["c4"])
    with pytest.raises(NotFound):
        await sc.changed_paths(history["c1"], name)
    with pytest.raises(NotFound):
        await rev_parse(history["repo"], name)


async def test_an_unresolvable_name_in_a_broken_repository_stays_retryable(
    history: dict[str, str], tmp_path: Path
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(Retryable, match="not a git repository"):
        await GitSourceControl(plain).is_ancestor("HEAD@{upstream}", history["c2"])


# -- failures that are not about the commits -----------------------------------------


async def test_missing_repository_is_retryable_with_git_message(
    history: dict[str, str], tmp_path: Path
) -> None:
    sc = GitSourceControl(tmp_path / "gone")
    with pytest.raises(Retryable, match="cannot change to") as info:
        await sc.is_ancestor(history["c1"], history["c2"])
    assert "exit 128" in str(info.value)


async def test_plain_directory_is_retryable(history: dict[str, str], tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(Retryable, match="not a git repository"):
        await GitSourceControl(plain).is_ancestor(history["c1"], history["c2"])


async def test_directory_inside_a_repository_does_not_borrow_it(
    history: dict[str, str],
) -> None:
    inner = Path(history["repo"]) / "subdir"
    inner.mkdir()
    with pytest.raises(Retryable, match="not a git repository"):
        await GitSourceControl(inner).is_ancestor(history["c1"], history["c2"])


async def test_git_environment_of_the_caller_cannot_redirect_queries(
    history: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = init_repo(tmp_path / "other")
    commit_file(other, "x.txt", "x")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    sc = GitSourceControl(history["repo"])
    assert await sc.is_ancestor(history["c1"], history["c4"]) is True
    with pytest.raises(NotFound):
        await sc.is_ancestor("0" * 40, history["c4"])


async def test_missing_git_binary_is_retryable(history: dict[str, str], tmp_path: Path) -> None:
    sc = GitSourceControl(history["repo"], git=str(tmp_path / "no-git-here"))
    with pytest.raises(Retryable, match="not found"):
        await sc.is_ancestor(history["c1"], history["c2"])


async def test_timeout_is_retryable(history: dict[str, str], tmp_path: Path) -> None:
    sc = GitSourceControl(history["repo"], git=fake_git(tmp_path, "exec sleep 5"), timeout_s=0.2)
    with pytest.raises(Retryable, match="timed out"):
        await sc.is_ancestor(history["c1"], history["c2"])


async def test_unexpected_exit_is_retryable_with_stderr(
    history: dict[str, str], tmp_path: Path
) -> None:
    broken = fake_git(tmp_path, "echo 'fatal: bad object HEAD' >&2; exit 128")
    sc = GitSourceControl(history["repo"], git=broken)
    with pytest.raises(Retryable, match="fatal: bad object HEAD"):
        await sc.is_ancestor(history["c1"], history["c2"])
    usage = fake_git(tmp_path, "echo 'usage: git merge-base' >&2; exit 129")
    with pytest.raises(Retryable, match=r"exit 129.*usage"):
        await GitSourceControl(history["repo"], git=usage).is_ancestor("a", "b")


def test_timeout_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        GitSourceControl(tmp_path, timeout_s=0)


# -- option injection ----------------------------------------------------------------


@pytest.mark.parametrize(
    "hostile",
    ["-h", "--output=pwned", "--all", "main\n--all", "a b", "main\x00", "", "\tmain", "a\x7f"],
)
async def test_option_injection_is_rejected_before_git_runs(
    history: dict[str, str], tmp_path: Path, hostile: str
) -> None:
    runner = CountingRunner(history["repo"])
    sc = GitSourceControl(history["repo"], runner=runner)
    with pytest.raises(NotFound, match="not a revision name"):
        await sc.is_ancestor(hostile, history["c4"])
    with pytest.raises(NotFound, match="not a revision name"):
        await sc.is_ancestor(history["c1"], hostile)
    with pytest.raises(NotFound, match="not a revision name"):
        await rev_parse(history["repo"], hostile, runner=runner)
    assert runner.launches == 0
    assert not (tmp_path / "pwned").exists()


def test_commitish_rules() -> None:
    assert check_commitish("main~2") == "main~2"
    assert check_commitish("refs/heads/a-b") == "refs/heads/a-b"
    with pytest.raises(NotFound):
        check_commitish(None)
    assert is_full_commit_id("ab" * 20)
    assert is_full_commit_id("AB" * 32)
    assert not is_full_commit_id("ab" * 19)
    assert not is_full_commit_id("g" * 40)
    assert not is_full_commit_id("main")


# -- cache ---------------------------------------------------------------------------


async def test_repeated_definitive_answer_is_served_without_git(
    history: dict[str, str],
) -> None:
    runner = CountingRunner(history["repo"])
    sc = GitSourceControl(history["repo"], runner=runner)
    assert await sc.is_ancestor(history["c1"], history["c4"]) is True
    assert await sc.is_ancestor(history["c4"], history["r4"]) is False
    assert runner.launches == 2
    assert await sc.is_ancestor(history["c1"], history["c4"]) is True
    assert await sc.is_ancestor(history["c4"], history["r4"]) is False
    assert await sc.is_ancestor(history["c1"].upper(), history["c4"]) is True
    assert runner.launches == 2
    assert sc.cache.hits == 3


async def test_sha256_repository_ids_are_full_ids_too(tmp_path: Path) -> None:
    repo = tmp_path / "sha256"
    repo.mkdir()
    git(repo, "init", "-q", "--object-format=sha256", "-b", "main")
    first = commit_file(repo, "f.txt", "1")
    second = commit_file(repo, "f.txt", "2")
    assert len(first) == 64
    runner = CountingRunner(str(repo))
    sc = GitSourceControl(repo, runner=runner)
    assert await sc.is_ancestor(first, second) is True
    assert await sc.is_ancestor(second, first) is False
    assert await sc.is_ancestor(first, second) is True
    assert runner.launches == 2
    with pytest.raises(NotFound):
        await sc.is_ancestor("0" * 40, second)


async def test_cache_survives_the_repository_going_away(history: dict[str, str]) -> None:
    sc = GitSourceControl(history["repo"])
    assert await sc.is_ancestor(history["c2"], history["c3"]) is True
    shutil.rmtree(history["repo"])
    assert await sc.is_ancestor(history["c2"], history["c3"]) is True
    with pytest.raises(Retryable):
        await sc.is_ancestor(history["c1"], history["c3"])


async def test_errors_and_movable_names_are_never_cached(history: dict[str, str]) -> None:
    runner = CountingRunner(history["repo"])
    sc = GitSourceControl(history["repo"], runner=runner)
    for _ in range(2):
        with pytest.raises(NotFound):
            await sc.is_ancestor("0" * 40, history["c4"])
    assert runner.launches == 2
    for _ in range(2):
        assert await sc.is_ancestor(history["c1"], "main") is True
        assert await sc.is_ancestor(history["c1"][:12], history["c4"]) is True
    assert runner.launches == 6
    assert len(sc.cache) == 0


async def test_branch_moving_changes_the_answer(history: dict[str, str]) -> None:
    # Why names are not cached: "main" below means another commit after a force-push.
    repo = Path(history["repo"])
    sc = GitSourceControl(repo)
    assert await sc.is_ancestor(history["c4"], "main") is True
    git(repo, "update-ref", "refs/heads/main", history["r4"])
    assert await sc.is_ancestor(history["c4"], "main") is False


async def test_cache_is_bounded_lru(history: dict[str, str]) -> None:
    runner = CountingRunner(history["repo"])
    sc = GitSourceControl(history["repo"], runner=runner, cache_size=2)
    c1, c2, c3, c4 = (history[f"c{n}"] for n in range(1, 5))
    await sc.is_ancestor(c1, c2)
    await sc.is_ancestor(c1, c3)
    await sc.is_ancestor(c1, c2)  # hit: (c1, c2) is now the most recent
    await sc.is_ancestor(c1, c4)  # evicts (c1, c3)
    assert runner.launches == 3
    await sc.is_ancestor(c1, c2)
    assert runner.launches == 3
    await sc.is_ancestor(c1, c3)
    assert runner.launches == 4
    assert len(sc.cache) == 2


async def test_cache_size_zero_disables_caching(history: dict[str, str]) -> None:
    runner = CountingRunner(history["repo"])
    sc = GitSourceControl(history["repo"], runner=runner, cache_size=0)
    for _ in range(3):
        assert await sc.is_ancestor(history["c1"], history["c2"]) is True
    assert runner.launches == 3


def test_ancestry_cache_rejects_negative_capacity() -> None:
    with pytest.raises(ValueError, match="capacity"):
        AncestryCache(-1)


# -- rev-parse -----------------------------------------------------------------------


async def test_rev_parse_resolves_commits(history: dict[str, str]) -> None:
    repo = history["repo"]
    assert await rev_parse(repo, "main") == history["c4"]
    assert await rev_parse(Path(repo), "rewritten") == history["r4"]
    assert await rev_parse(repo, "v3") == history["c3"]  # annotated tag → its commit
    assert await rev_parse(repo, history["c1"][:8]) == history["c1"]
    assert await GitSourceControl(repo).rev_parse("main~1") == history["c3"]


@pytest.mark.parametrize("ref", ["nope", "0" * 40, "main~99"])
async def test_rev_parse_unknown_is_not_found(history: dict[str, str], ref: str) -> None:
    with pytest.raises(NotFound, match="does not name a commit"):
        await rev_parse(history["repo"], ref)


async def test_rev_parse_of_a_tree_is_not_found(history: dict[str, str]) -> None:
    with pytest.raises(NotFound):
        await rev_parse(history["repo"], history["tree"])


async def test_rev_parse_missing_repository_is_retryable(tmp_path: Path) -> None:
    with pytest.raises(Retryable, match="cannot change to"):
        await rev_parse(tmp_path / "gone", "main")


# -- provider ------------------------------------------------------------------------


async def test_provider_maps_queues_and_shares_one_adapter_per_repository(
    history: dict[str, str], tmp_path: Path
) -> None:
    other = init_repo(tmp_path / "other")
    provider = GitSourceControlProvider(
        {"mono/main": history["repo"], "mono/release": Path(history["repo"]), "tools": other}
    )
    main, release, tools = (provider.for_queue(q) for q in ("mono/main", "mono/release", "tools"))
    assert main is not None
    assert main is release
    assert tools is not None
    assert tools is not main
    assert provider.for_queue("unknown") is None
    assert await main.is_ancestor(history["c1"], history["c2"]) is True
    with pytest.raises(NotFound):
        await tools.is_ancestor(history["c1"], history["c2"])


async def test_provider_default_and_resolver(history: dict[str, str], tmp_path: Path) -> None:
    runner = CountingRunner(history["repo"])
    with_default = GitSourceControlProvider({}, default=history["repo"], runner=runner)
    sc = with_default.for_queue("any/queue")
    assert sc is not None
    assert sc is with_default.for_queue("another")
    assert await sc.is_ancestor(history["c1"], history["c2"]) is True
    assert runner.launches == 1

    def resolve(queue: str) -> str | None:
        return history["repo"] if queue.startswith("mono/") else None

    resolved = GitSourceControlProvider(resolve, cache_size=0, timeout_s=3.0)
    found = resolved.for_queue("mono/main")
    assert found is not None
    assert found.repo_path == os.path.abspath(history["repo"])
    assert found.cache.capacity == 0
    assert resolved.for_queue("elsewhere") is None


# -- git cannot be started -----------------------------------------------------------


async def test_git_that_cannot_start_is_an_environment_failure_held_never_counted(
    history: dict[str, str],
) -> None:
    async def out_of_descriptors(argv: Sequence[str], timeout_s: float) -> GitResult:
        raise OSError(errno.EMFILE, "Too many open files")

    sc = GitSourceControl(history["repo"], runner=out_of_descriptors)
    with pytest.raises(EnvironmentFailure, match="Too many open files") as info:
        await sc.is_ancestor(history["c1"], history["c4"])
    attempt = Attempt.raised(info.value)
    # However often it happens, the head is held, never retried into a dead letter.
    for failures in (0, 2, 9):
        decision = settle(attempt, failures=failures, max_attempts=3)
        assert decision.kind is SettleKind.HOLD
        assert decision.failures == failures
        assert "Too many open files" in decision.reason


async def test_first_parents_since_lists_new_commits_oldest_first_in_slices(history) -> None:
    repo = GitSourceControl(history["repo"])
    c1, c2, c3, c4 = (history[f"c{n}"] for n in range(1, 5))
    whole = await repo.first_parents_since(c1, c4, limit=10)
    assert whole is not None and (whole.commits, whole.pending) == ((c2, c3, c4), 0)
    sliced = await repo.first_parents_since(c1, c4, limit=2)
    assert sliced is not None and (sliced.commits, sliced.pending) == ((c2, c3), 1)
    assert await repo.first_parents_since(c4, c4, limit=1) == type(whole)((), 0)
    # Rewritten (not an ancestor) or unknown here: no range.
    assert await repo.first_parents_since(history["r3"], c4, limit=10) is None
    assert await repo.first_parents_since("f" * 40, c4, limit=10) is None
    with pytest.raises(ValueError):
        await repo.first_parents_since(c1, c4, limit=0)


async def test_the_newest_green_ancestor_asks_git_once_per_green_until_an_ancestor(
    history: dict[str, str],
) -> None:
    """After the force-push to r4, greens c4, c3, c2, c1 (newest first): git is asked
    about c4, c3 and c2 - one launch each - and never about c1; a green git does not
    know is passed over."""
    runner = CountingRunner(history["repo"])
    sc = GitSourceControl(history["repo"], runner=runner)
    greens = tuple(Green(history[f"c{n}"], f"request/q/{n}") for n in (4, 3, 2, 1))
    choice = await newest_green_ancestor(sc, greens, history["r4"])
    assert choice.green == greens[2] and choice.passed == greens[:2]
    assert runner.launches == 3
    assert [argv[-2] for argv in runner.argvs] == [history["c4"], history["c3"], history["c2"]]
    gone = Green("0" * 40, "request/q/5")
    again = await newest_green_ancestor(sc, (gone, *greens), history["r4"])
    assert again.green == greens[2] and again.unknown == (gone,)
    assert (await newest_green_ancestor(sc, greens, history["c4"])).asked == 1

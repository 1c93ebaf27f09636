"""Paths changed between two commits: the port operation behind ``full_build_paths``.

The git adapter runs against real repositories (built with the helpers of
``test_git_source_control``); the in-memory source control answers from the changes a
timeline lists per commit. Both classify an unknown commit as ``NotFound`` (the caller
builds in full) and a broken repository or outage as ``Retryable``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_git_source_control import commit_file, git, init_repo

from stovepipe_fsm.adapters.git import GitSourceControl
from stovepipe_fsm.adapters.memory import MemorySourceControl
from stovepipe_fsm.domain.errors import NotFound, Retryable
from stovepipe_fsm.domain.path_globs import first_match, path_matches


@pytest.fixture
def repo(tmp_path: Path) -> dict[str, str]:
    """c1 adds src/app.py; c2 changes WORKSPACE and tools/defs.bzl; c3 renames a file;
    r2 rewrites from c1 touching only docs (a force-push)."""
    path = init_repo(tmp_path / "repo")
    commit_file(path, "README", "hello")
    (path / "src").mkdir()
    ids = {"c1": commit_file(path, "src/app.py", "print(1)")}
    commit_file(path, "WORKSPACE", "ws")
    (path / "tools").mkdir()
    ids["c2"] = commit_file(path, "tools/defs.bzl", "def x(): pass")
    git(path, "mv", "src/app.py", "src/main.py")
    git(path, "commit", "-q", "-m", "rename")
    ids["c3"] = git(path, "rev-parse", "HEAD")
    git(path, "checkout", "-q", "-b", "rewritten", ids["c1"])
    (path / "docs").mkdir()
    ids["r2"] = commit_file(path, "docs/guide.md", "read me")
    ids["tree"] = git(path, "rev-parse", "HEAD^{tree}")
    ids["repo"] = str(path)
    return ids


async def test_git_lists_every_path_changed_since_the_base(repo: dict[str, str]) -> None:
    sc = GitSourceControl(repo["repo"])
    assert await sc.changed_paths(repo["c1"], repo["c2"]) == {"WORKSPACE", "tools/defs.bzl"}
    assert await sc.changed_paths(repo["c2"], repo["c2"]) == frozenset()
    # A rename is the old path and the new one: a glob on either sees it.
    assert await sc.changed_paths(repo["c2"], repo["c3"]) == {"src/app.py", "src/main.py"}
    # Across a force-push the trees are compared: what either side changed since c1.
    changed = await sc.changed_paths(repo["c2"], repo["r2"])
    assert changed == {"WORKSPACE", "tools/defs.bzl", "docs/guide.md"}


@pytest.mark.parametrize("unknown", ["0" * 40, "no-such-branch", "-p", "main..rewritten"])
async def test_git_an_unknown_commit_is_not_found(repo: dict[str, str], unknown: str) -> None:
    sc = GitSourceControl(repo["repo"])
    with pytest.raises(NotFound):
        await sc.changed_paths(unknown, repo["c2"])
    with pytest.raises(NotFound):
        await sc.changed_paths(repo["c1"], unknown)


async def test_git_a_tree_is_not_a_commit(repo: dict[str, str]) -> None:
    with pytest.raises(NotFound, match="commit not found"):
        await GitSourceControl(repo["repo"]).changed_paths(repo["tree"], repo["c2"])


async def test_git_a_missing_repository_is_retryable(repo: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(Retryable, match="diff --name-only failed") as info:
        await GitSourceControl(tmp_path / "gone").changed_paths(repo["c1"], repo["c2"])
    assert "exit 128" in str(info.value)


async def test_memory_changes_follow_the_graph() -> None:
    graph = MemorySourceControl(
        {"A": [], "B": ["A"], "C": ["B"], "R": ["A"]},
        {"B": ["WORKSPACE"], "C": ["src/app.py"], "R": ["docs/guide.md"]},
    )
    assert await graph.changed_paths("A", "C") == {"WORKSPACE", "src/app.py"}
    assert await graph.changed_paths("B", "C") == {"src/app.py"}
    assert await graph.changed_paths("C", "C") == frozenset()
    assert await graph.changed_paths("C", "R") == {"WORKSPACE", "src/app.py", "docs/guide.md"}
    with pytest.raises(NotFound):
        await graph.changed_paths("A", "Z")
    twin = graph.clone()
    graph.set_available(False)
    with pytest.raises(Retryable):
        await graph.changed_paths("A", "B")
    assert await twin.changed_paths("A", "B") == {"WORKSPACE"}  # a fork keeps the changes


def test_memory_changes_must_name_commits_of_the_graph() -> None:
    with pytest.raises(ValueError, match="changes of 'Z': no such commit"):
        MemorySourceControl({"A": []}, {"Z": ["x"]})


@pytest.mark.parametrize(
    ("path", "glob", "matches"),
    [
        ("WORKSPACE", "WORKSPACE", True),
        ("third_party/WORKSPACE", "WORKSPACE", False),
        ("MODULE.bazel", "MODULE.bazel", True),
        ("defs.bzl", "**/*.bzl", True),
        ("tools/build/defs.bzl", "**/*.bzl", True),
        ("tools/defs.bzl.txt", "**/*.bzl", False),
        ("tools/defs.bzl", "*.bzl", False),
        ("tools/BUILD", "tools/*", True),
        ("tools/x/BUILD", "tools/*", False),
        ("tools/x/BUILD", "tools/**", True),
        ("a.bzl", "?.bzl", True),
    ],
)
def test_path_globs(path: str, glob: str, matches: bool) -> None:
    assert path_matches(path, glob) is matches


def test_first_match_is_in_path_order() -> None:
    changed = {"src/z.bzl", "WORKSPACE", "src/app.py"}
    assert first_match(changed, ["**/*.bzl", "WORKSPACE"]) == ("WORKSPACE", "WORKSPACE")
    assert first_match({"src/app.py"}, ["WORKSPACE"]) is None

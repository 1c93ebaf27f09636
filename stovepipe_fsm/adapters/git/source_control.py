"""``SourceControl`` answered by a local git repository.

``is_ancestor(a, b)`` runs ``git -C <repo> merge-base --is-ancestor a b``, whose exit
status is the answer: 0 yes, 1 no. ``changed_paths(a, b)`` runs ``git diff --name-only
a b`` (trees compared, renames as a deletion plus an addition). For either, exit 128
is either "this name is not a commit here"
(``NotFound``: the caller falls back to a full build, which is always a valid superset)
or a problem with the repository itself, which is reported as ``Retryable`` with git's
own message so an operator can see what broke (missing clone, permissions, ownership).

git's message says which it is only for the common cases. Any other exit 128 is settled
by asking git again (:func:`_unresolvable`): when the repository answers
``rev-parse --git-dir`` and one of the names does not resolve to a commit, the name is
the problem (``HEAD@{upstream}`` without an upstream, a reflog entry that does not
exist, a malformed revision) and the answer is ``NotFound``: unknown ancestry, a full
build, never a retry that can only fail the same way.

Definitive answers about two *full* commit ids are cached: ancestry between immutable
commits never changes, and the strategy decision asks the same question on every
redelivery of a held head. The cache assumes a complete history; a shallow clone can
answer ``False`` for commits beyond its depth, with or without the cache.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from ...domain.errors import NotFound, Retryable
from .cache import AncestryCache
from .commits import check_commitish, is_full_commit_id
from .runner import (
    GitResult,
    GitRunner,
    git_environment,
    spawn_failures_classified,
    subprocess_runner,
)

StrPath = str | os.PathLike[str]

# Fragments of git's (forced-English) messages that mean "no such commit here".
_UNKNOWN_COMMIT_MESSAGES = ("Not a valid commit name", "Not a valid object name")
_UNKNOWN_REVISION_MESSAGES = ("bad revision", "bad object", "unknown revision")


def _revision_names(*names: str) -> None:
    """Each of ``names`` may name one commit: a name with ``..`` is a range, never one
    commit (no ref name may contain it), and git would read it as two: not found."""
    for name in names:
        check_commitish(name)
        if ".." in name:
            raise NotFound(f"commit {name!r} is not a revision name (a range)")


def _failure(what: str, repo_path: str, result: GitResult) -> Retryable:
    detail = result.stderr or "(no output)"
    return Retryable(f"git {what} failed in {repo_path!r} (exit {result.returncode}): {detail}")


@dataclass(frozen=True)
class NewCommits:
    """First-parent commits after a commit up to a tip, oldest first, at most the limit
    asked for; ``pending``: how many newer ones were left for a later read."""

    commits: tuple[str, ...]
    pending: int


class GitSourceControl:
    """Ancestry queries against the repository at ``repo_path``.

    ``runner`` replaces the subprocess launcher (tests count launches with it);
    ``cache_size=0`` disables the cache.
    """

    def __init__(
        self,
        repo_path: StrPath,
        *,
        git: str = "git",
        timeout_s: float = 10.0,
        cache_size: int = 4096,
        runner: GitRunner | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._repo_path = os.fspath(repo_path)
        self._git = git
        self._timeout_s = timeout_s
        if runner is None:
            self._run = subprocess_runner(git_environment(self._repo_path))
        else:
            self._run = spawn_failures_classified(runner)
        self._cache = AncestryCache(cache_size)

    @property
    def repo_path(self) -> str:
        return self._repo_path

    @property
    def cache(self) -> AncestryCache:
        return self._cache

    async def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        check_commitish(ancestor)
        check_commitish(descendant)
        cacheable = is_full_commit_id(ancestor) and is_full_commit_id(descendant)
        if cacheable:
            cached = self._cache.get(ancestor, descendant)
            if cached is not None:
                return cached
        result = await self._git_run("merge-base", "--is-ancestor", ancestor, descendant)
        if result.returncode in (0, 1):
            answer = result.returncode == 0
            if cacheable:
                self._cache.put(ancestor, descendant, answer)
            return answer
        raise await self._refusal(
            result,
            "merge-base --is-ancestor",
            f"{ancestor!r} → {descendant!r}",
            (ancestor, descendant),
            _UNKNOWN_COMMIT_MESSAGES,
        )

    async def changed_paths(self, base: str, head: str) -> frozenset[str]:
        """Paths whose content differs between commits ``base`` and ``head``.

        A name with ``..`` is a range, never one commit (no ref name may contain it), and
        ``git diff`` would read it as two: it is not found, as ``is_ancestor`` says too.
        """
        _revision_names(base, head)
        span = [f"{base}^{{commit}}", f"{head}^{{commit}}", "--"]
        result = await self._git_run("diff", "--name-only", "-z", "--no-renames", *span)
        if result.returncode == 0:
            return frozenset(path for path in result.stdout.split("\0") if path)
        raise await self._refusal(
            result, "diff --name-only", f"the diff {base!r} → {head!r}", (base, head)
        )

    async def first_parent(self, commit: str) -> str:
        """The first parent of ``commit`` (``""`` for a root commit)."""
        _revision_names(commit)
        span = ["-n", "1", f"{commit}^{{commit}}", "--"]
        result = await self._git_run("rev-list", "--parents", *span)
        if result.returncode == 0:
            ids = result.stdout.split()
            return ids[1] if len(ids) > 1 else ""
        raise await self._refusal(
            result, "rev-list --parents", f"the parent of {commit!r}", (commit,)
        )

    async def first_parents_after(self, base: str, head: str, limit: int) -> tuple[str, ...]:
        """``head``'s first-parent line down to what ``base`` reaches, oldest first, the
        newest ``limit`` at most (one ``rev-list``)."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        _revision_names(base, head)
        span = [f"--max-count={limit}", f"^{base}^{{commit}}", f"{head}^{{commit}}", "--"]
        result = await self._git_run("rev-list", "--first-parent", *span)
        if result.returncode == 0:
            return tuple(reversed(result.stdout.split()))
        raise await self._refusal(
            result,
            "rev-list --first-parent",
            f"the first parents of {head!r} after {base!r}",
            (base, head),
        )

    async def first_parents_since(
        self, since: str, tip: str, *, limit: int, newest: bool = False
    ) -> NewCommits | None:
        """The first-parent commits of ``tip`` not reachable from ``since``, oldest first.

        Trunk heads are the commits a branch named one after the other, its first-parent
        chain: a commit a merge brought in was never one. At most ``limit`` are read: the
        oldest, so a huge push is taken in slices (``pending``: the newer ones left), or
        with ``newest`` the newest (``pending``: the older ones left out). ``None`` when
        ``since`` is not an ancestor of ``tip`` or is unknown here (the branch was
        rewritten): there is no range of new commits then, only the tip.
        """
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        try:
            if not await self.is_ancestor(since, tip):
                return None
        except NotFound:
            return None
        span = [f"^{since}", tip, "--"]
        total = int((await self._rev_list("--first-parent", "--count", *span)).strip() or "0")
        skip = 0 if newest else max(0, total - limit)
        newest_first = await self._rev_list(
            "--first-parent", f"--skip={skip}", f"--max-count={limit}", *span
        )
        commits = tuple(reversed(newest_first.split()))
        return NewCommits(commits, pending=total - len(commits))

    async def _git_run(self, *arguments: str) -> GitResult:
        """``git <arguments>`` in this repository."""
        return await self._run([self._git, "-C", self._repo_path, *arguments], self._timeout_s)

    async def _rev_list(self, *arguments: str) -> str:
        result = await self._git_run("rev-list", *arguments)
        if result.returncode != 0:
            raise _failure("rev-list", self._repo_path, result)
        return result.stdout

    async def _refusal(
        self,
        result: GitResult,
        what: str,
        asked: str,
        names: tuple[str, ...],
        unknown: tuple[str, ...] = _UNKNOWN_REVISION_MESSAGES,
    ) -> NotFound | Retryable:
        """What a failed git command ``what`` (about ``names``, ``asked`` in words) means:
        ``NotFound`` when git says a commit is unknown (its ``unknown`` messages) or one of
        ``names`` does not resolve in a healthy repository, else ``Retryable``."""
        if result.returncode == 128:
            if any(m in result.stderr for m in unknown):
                return NotFound(
                    f"commit not found in {self._repo_path!r} (asked {asked}): {result.stderr}"
                )
            missing = await self._unresolvable(names)
            if missing is not None:
                return missing
        return _failure(what, self._repo_path, result)

    async def _unresolvable(self, names: tuple[str, ...]) -> NotFound | None:
        """``NotFound`` for the first of ``names`` that does not resolve to a commit in a
        repository that is itself fine; ``None`` when the repository is the problem or every
        name resolves (then the failure was about something else)."""
        health = await self._git_run("rev-parse", "--git-dir")
        if health.returncode != 0:
            return None
        for name in names:
            result = await self._git_run("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
            if result.returncode != 0:
                detail = result.stderr or "does not name a commit"
                where = self._repo_path
                return NotFound(f"{name!r} does not resolve to a commit in {where!r}: {detail}")
        return None

    async def rev_parse(self, ref: str) -> str:
        """Resolve ``ref`` to the full id of a commit; ``NotFound`` when it names none.

        ``^{commit}`` makes a tag resolve to its commit and a tree or blob id count as
        not found, so the result is always something ``is_ancestor`` can be asked about.
        """
        check_commitish(ref)
        result = await self._git_run("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        if result.returncode == 0:
            return result.stdout.strip()
        if result.returncode == 1:
            raise NotFound(f"{ref!r} does not name a commit in {self._repo_path!r}")
        raise await self._refusal(result, "rev-parse", "", (ref,), unknown=())


async def rev_parse(
    repo_path: StrPath,
    ref: str,
    *,
    git: str = "git",
    timeout_s: float = 10.0,
    runner: GitRunner | None = None,
) -> str:
    """:meth:`GitSourceControl.rev_parse` of the repository at ``repo_path``."""
    repo = GitSourceControl(repo_path, git=git, timeout_s=timeout_s, cache_size=0, runner=runner)
    return await repo.rev_parse(ref)


class GitSourceControlProvider:
    """``SourceControlProvider`` mapping queues to local repositories.

    ``repos`` is a queue → path mapping, or a function returning a queue's path (or
    ``None``), e.g. one reading ``QueueConfig.repository``. ``default`` serves queues
    with no path of their own. Queues that share a repository share one
    :class:`GitSourceControl`, and so one cache.
    """

    def __init__(
        self,
        repos: Mapping[str, StrPath] | Callable[[str], StrPath | None],
        *,
        default: StrPath | None = None,
        git: str = "git",
        timeout_s: float = 10.0,
        cache_size: int = 4096,
        runner: GitRunner | None = None,
    ) -> None:
        if callable(repos):
            self._resolve: Callable[[str], StrPath | None] = repos
        else:
            table = {queue: os.fspath(path) for queue, path in repos.items()}
            self._resolve = table.get
        self._default = None if default is None else os.fspath(default)
        self._open = partial(
            GitSourceControl, git=git, timeout_s=timeout_s, cache_size=cache_size, runner=runner
        )
        self._by_path: dict[str, GitSourceControl] = {}

    def for_queue(self, queue: str) -> GitSourceControl | None:
        path = self._resolve(queue)
        if path is None:
            path = self._default
        if path is None:
            return None
        key = os.path.abspath(os.fspath(path))
        if key not in self._by_path:
            self._by_path[key] = self._open(key)
        return self._by_path[key]

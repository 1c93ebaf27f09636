"""In-memory source control: a commit graph given as ``commit → parents``.

It answers ``is_ancestor`` and ``changed_paths`` with the same outcomes as the git
adapter (an answer, ``NotFound`` for an unknown commit, ``Retryable`` while
"unavailable"), so the build strategy decision can be driven through every branch
without a repository: a fast-forward is a new commit whose parents reach the last
green, a force-push is a new root (or a commit on a branch that does not contain it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ...domain.errors import NotFound, Retryable
from ...ports.source_control import SourceControl

UNAVAILABLE_MESSAGE = "source control unavailable"


class SourceControlOutage(Retryable):
    """The outage a simulation set (a timeline's ``source_control: down``, or one the
    model checker injects): a fault of the world, not of the policy under test."""


def parents_first(
    graph: Mapping[str, Sequence[str]],
) -> tuple[list[str], dict[str, Sequence[str]]]:
    """``graph``'s commits with every commit after its parents, and those that cannot be
    placed (a parent the graph does not define, a parent cycle, or a descendant of one).

    Linear in commits and parent links whatever the mapping's order: ``git rev-list
    --parents`` lists a history newest-first, children before the parents they need.
    """
    waiting: dict[str, int] = {}
    children: dict[str, list[str]] = {}
    ready: list[str] = []
    for commit, commit_parents in graph.items():
        distinct = set(commit_parents)
        waiting[commit] = len(distinct)
        for parent in distinct:
            children.setdefault(parent, []).append(commit)
        if not distinct:
            ready.append(commit)
    order: list[str] = []
    while ready:
        commit = ready.pop()
        order.append(commit)
        for child in children.get(commit, ()):
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    placed = set(order)
    return order, {c: ps for c, ps in graph.items() if c not in placed}


class MemorySourceControl:
    """``SourceControl`` over an immutable-per-commit graph.

    Commits are immutable, as in git: a commit's parents are fixed when it is added and
    every parent must already be known. That makes ancestry answers stable, and turns a
    typo in a test graph into an immediate ``ValueError`` rather than a silent ``False``.
    """

    def __init__(
        self,
        parents: Mapping[str, Sequence[str]] | None = None,
        changes: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        self._parents: dict[str, tuple[str, ...]] = {}
        self._changes: dict[str, frozenset[str]] = {}
        #: What each changed path holds after the commit (a content id, "" when the
        #: commit deleted it), for commits given as ``{path: id}``: with these, changed
        #: paths are the diff of the two trees (:meth:`changed_paths`).
        self._contents: dict[str, Mapping[str, str]] = {}
        #: False: every call of the port fails as in an outage (:meth:`set_available`).
        self.available = True
        self.calls = 0
        graph = dict(parents or {})
        for commit, commit_parents in graph.items():
            if isinstance(commit_parents, str):
                raise TypeError(f"parents of {commit!r} must be a sequence of ids, not a string")
        # Accept the mapping in any order: add a commit once all its parents are in.
        order, pending = parents_first(graph)
        for commit in order:
            self.add_commit(commit, graph[commit])
        if pending:
            missing = sorted(
                {p for ps in pending.values() for p in ps if p not in self._parents} - set(pending)
            )
            detail = f"unknown parents {missing}" if missing else "a parent cycle"
            raise ValueError(f"commit graph has {detail}: {sorted(pending)}")
        for sha, paths in (changes or {}).items():
            self._changes[sha] = self._changed(sha, paths)
            if isinstance(paths, Mapping):
                self._contents[sha] = dict(paths)

    def set_available(self, value: bool) -> None:
        """Switch transient failure on (``False``) or off; every call obeys it."""
        self.available = bool(value)

    def add_commit(self, sha: str, parents: Iterable[str] = ()) -> None:
        """Add ``sha`` with ``parents``; re-adding it with the same parents is a no-op."""
        if isinstance(parents, str):
            raise TypeError(f"parents of {sha!r} must be a sequence of ids, not a string")
        parent_ids = tuple(parents)
        unknown = [p for p in parent_ids if p not in self._parents]
        if unknown:
            raise ValueError(f"commit {sha!r} has unknown parents {unknown}")
        existing = self._parents.get(sha)
        if existing is not None and existing != parent_ids:
            raise ValueError(
                f"commit {sha!r} already exists with parents {list(existing)}; "
                "commits are immutable"
            )
        self._parents[sha] = parent_ids

    def commits(self) -> tuple[str, ...]:
        return tuple(sorted(self._parents))

    def set_changes(self, sha: str, paths: Iterable[str]) -> None:
        """Say which paths ``sha`` changed (replacing what it had). Clones share the
        changes until one of them sets some: this one then gets its own."""
        self._changes = {**self._changes, sha: self._changed(sha, paths)}
        if sha in self._contents:
            self._contents = {k: v for k, v in self._contents.items() if k != sha}

    def _changed(self, sha: str, paths: Iterable[str]) -> frozenset[str]:
        if sha not in self._parents:
            raise ValueError(f"changes of {sha!r}: no such commit in the graph")
        if isinstance(paths, str):
            raise TypeError(f"changes of {sha!r} must be a sequence of paths, not a string")
        return frozenset(paths)

    def changes(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Every commit given changes, with its paths, sorted: a hashable value."""
        if not self._changes:
            return ()
        return tuple(sorted((sha, tuple(sorted(p))) for sha, p in self._changes.items() if p))

    def parents_of(self, sha: str) -> tuple[str, ...]:
        try:
            return self._parents[sha]
        except KeyError:
            raise NotFound(f"commit {sha!r} not found") from None

    async def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        self._called()
        return self.reaches(descendant, ancestor)

    def reaches(self, descendant: str, ancestor: str) -> bool:
        """Whether ``descendant`` is ``ancestor`` or descends from it (``NotFound`` for
        a commit the graph does not have); a plain question of the graph, not a call
        of the port (not counted, answered in an outage too)."""
        for sha in (ancestor, descendant):
            self.parents_of(sha)  # NotFound for a commit the graph does not have
        seen: set[str] = set()
        frontier = [descendant]
        while frontier:
            sha = frontier.pop()
            if sha == ancestor:
                return True
            if sha in seen:
                continue
            seen.add(sha)
            frontier.extend(self._parents[sha])
        return False

    async def first_parent(self, commit: str) -> str:
        """The first parent the graph lists for ``commit`` (``""``: a root commit)."""
        self._called()
        parents = self.parents_of(commit)
        return parents[0] if parents else ""

    async def first_parents_after(self, base: str, head: str, limit: int) -> tuple[str, ...]:
        """``head``'s first-parent line down to what ``base`` reaches, oldest first, the
        newest ``limit`` at most."""
        self._called()
        for sha in (base, head):
            self.parents_of(sha)  # NotFound for a commit the graph does not have
        reached = self._reachable(base)
        line: list[str] = []
        commit = head
        while commit and commit not in reached and len(line) < limit:
            line.append(commit)
            parents = self._parents[commit]
            commit = parents[0] if parents else ""
        return tuple(reversed(line))

    async def changed_paths(self, base: str, head: str) -> frozenset[str]:
        """Paths changed by the commits one side reaches and the other does not.

        A commit's own changes are what it was given (none by default); on a linear
        history this is exactly the diff of the two trees, and across a rewrite it is
        every path either side touched since they parted (a superset, never less).
        Where commits were given what their changed paths hold (``{path: content id}``
        against their first parent, as ``export`` writes them), it is the diff of the
        two trees, as ``git diff --name-only base head`` gives it, merges included: a
        path is changed when the two commits hold different content there.
        """
        self._called()
        for sha in (base, head):
            self.parents_of(sha)  # NotFound for a commit the graph does not have
        if self._contents:
            return self._tree_diff(base, head)
        only = self._reachable(head) ^ self._reachable(base)
        return frozenset(path for sha in only for path in self._changes.get(sha, ()))

    def _tree_diff(self, base: str, head: str) -> frozenset[str]:
        """The paths whose content differs between the trees of ``base`` and ``head``.

        A commit's tree holds at a path what the commit changed it to, else what its
        first parent holds there, and a root what it was given (nothing, else). A path a
        commit changed without a content id is a content of its own. Every path a commit
        either side reaches changed is a candidate.
        """
        touched = self._reachable(head) | self._reachable(base)
        candidates = {path for sha in touched for path in self._changes.get(sha, ())}
        return frozenset(p for p in candidates if self._content(base, p) != self._content(head, p))

    def _content(self, sha: str, path: str) -> str:
        """What ``path`` holds in ``sha``'s tree; ``""``: nothing any commit wrote."""
        commit: str | None = sha
        while commit is not None:
            if path in self._changes.get(commit, ()):
                contents = self._contents.get(commit)
                return contents[path] if contents is not None else f"@{commit}"
            parents = self._parents[commit]
            commit = parents[0] if parents else None
        return ""

    def _reachable(self, sha: str) -> set[str]:
        seen: set[str] = set()
        frontier = [sha]
        while frontier:
            commit = frontier.pop()
            if commit not in seen:
                seen.add(commit)
                frontier.extend(self._parents[commit])
        return seen

    def _called(self) -> None:
        """Count a call of the port; in an outage, fail it."""
        self.calls += 1
        if not self.available:
            raise SourceControlOutage(UNAVAILABLE_MESSAGE)

    def clone(self) -> MemorySourceControl:
        """An independent copy: the graph and the availability switch are forked."""
        twin = object.__new__(MemorySourceControl)  # nothing to check: a copy of a valid graph
        twin._parents = self._parents.copy()
        twin._changes = self._changes
        twin._contents = self._contents
        twin.available = self.available
        twin.calls = self.calls
        return twin


class MemorySourceControlProvider:
    """``SourceControlProvider`` from a queue → source-control mapping.

    ``default`` answers for every queue the mapping does not name; without it such a
    queue has no source control (``None``), which the caller treats as "no ancestry
    information" exactly like an unconfigured repository.
    """

    def __init__(
        self,
        by_queue: Mapping[str, SourceControl] | None = None,
        *,
        default: SourceControl | None = None,
    ) -> None:
        self._by_queue: dict[str, SourceControl] = dict(by_queue or {})
        self._default = default

    def for_queue(self, queue: str) -> SourceControl | None:
        return self._by_queue.get(queue, self._default)

    def register(self, queue: str, source_control: SourceControl) -> None:
        self._by_queue[queue] = source_control

    def clone(self) -> MemorySourceControlProvider:
        """Clone every member that can be cloned, keeping shared members shared."""
        memo: dict[int, SourceControl] = {}

        def fork(member: SourceControl) -> SourceControl:
            if id(member) not in memo:
                clone = getattr(member, "clone", None)
                memo[id(member)] = clone() if callable(clone) else member
            return memo[id(member)]

        return MemorySourceControlProvider(
            {queue: fork(member) for queue, member in self._by_queue.items()},
            default=None if self._default is None else fork(self._default),
        )

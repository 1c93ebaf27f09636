"""The commit graph around a set of heads, read from a git repository (for ``export``).

:func:`read_history` gives, for heads a deployment ingested, what a replay needs to
answer ancestry and changed paths as git does:

- the graph: every commit the heads reach that their common ancestor (``git merge-base
  --octopus``, the *floor*) does not, with its real parents (those outside the graph
  dropped), and the floor itself as a root: the ancestry of any two commits of the graph
  is then git's;
- per commit, what it changed against its first parent, as ``{path: content}`` (the
  new mode and object id, ``""`` for a deletion; merges against their first parent,
  renames as a deletion and an addition): with these, the in-memory source control's
  changed paths between two commits are ``git diff --name-only`` of their trees. A
  commit whose first parent is outside the graph is diffed against the floor instead,
  so every first-parent chain ends at the floor, whose content at each path any commit
  changed is given too.

Heads are named as they were ingested: a head whose name is not its full commit id (a
tag, a short id) is that name in the graph; other commits are their full ids. A head git
does not know (never pushed, garbage-collected) is listed in ``unknown`` and left out.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from ...domain.errors import NotFound, Retryable
from .commits import check_commitish
from .runner import GitResult, GitRunner, git_environment, subprocess_runner

#: The most commits one history may hold (a window of a busy monorepo is thousands).
MAX_COMMITS = 200_000
#: Commits per ``git log`` call (its argument list stays far below the system's limit).
CHUNK = 2_000
TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RecordedHistory:
    parents: dict[str, list[str]] = field(default_factory=dict)
    changes: dict[str, dict[str, str]] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()


async def read_history(
    repo: str, heads: Sequence[str], *, git: str = "git", runner: GitRunner | None = None
) -> RecordedHistory:
    """The graph and the changes around ``heads`` in ``repo`` (module docstring).
    ``Retryable`` with git's message when the repository cannot be read."""
    run = runner or subprocess_runner(git_environment(repo))

    async def git_ok(*args: str) -> GitResult:
        result = await run([git, "-C", repo, *args], TIMEOUT_S)
        if result.returncode != 0:
            raise Retryable(f"git {args[0]} failed in {repo!r}: {result.stderr}")
        return result

    names: dict[str, str] = {}  # full id -> the name a head was ingested under
    unknown: list[str] = []
    for head in dict.fromkeys(heads):
        try:
            check_commitish(head)
        except NotFound:
            unknown.append(head)
            continue
        found = await run(
            [git, "-C", repo, "rev-parse", "--verify", "--quiet", f"{head}^{{commit}}"],
            TIMEOUT_S,
        )
        if found.returncode != 0:
            unknown.append(head)
            continue
        names.setdefault(found.stdout.strip(), head)
    if not names:
        return RecordedHistory(unknown=tuple(unknown))
    shas = sorted(names)
    if len(shas) > 1:
        base = await run([git, "-C", repo, "merge-base", "--octopus", *shas], TIMEOUT_S)
        floor = base.stdout.strip() if base.returncode == 0 else ""
    else:
        floor = shas[0]
    listed = await git_ok("rev-list", "--parents", *shas, *([f"^{floor}"] if floor else []))
    graph: dict[str, list[str]] = {}
    for line in listed.stdout.splitlines():
        commit, *parents = line.split()
        graph[commit] = parents
        if len(graph) > MAX_COMMITS:
            raise Retryable(f"more than {MAX_COMMITS} commits between the heads in {repo!r}")
    if floor:
        graph[floor] = []
    changes = await _changes(git_ok, graph, floor)
    name = names.get
    return RecordedHistory(
        parents={name(c, c): [name(p, p) for p in ps if p in graph] for c, ps in graph.items()},
        changes={name(c, c): paths for c, paths in changes.items()},
        unknown=tuple(unknown),
    )


async def _changes(
    git_ok: Callable[..., Awaitable[GitResult]], graph: dict[str, list[str]], floor: str
) -> dict[str, dict[str, str]]:
    """Each commit's changes against its first parent (against the floor when that
    parent is outside the graph); none for the floor."""
    inside = [c for c, ps in graph.items() if c != floor and (not ps or ps[0] in graph)]
    outside = [c for c, ps in graph.items() if c != floor and ps and ps[0] not in graph]
    changes: dict[str, dict[str, str]] = {}
    for at in range(0, len(inside), CHUNK):
        chunk = inside[at : at + CHUNK]
        result = await git_ok(
            "log",
            "--no-walk=unsorted",
            "--diff-merges=first-parent",
            "--root",
            "--raw",
            "--no-abbrev",
            "--no-renames",
            "-z",
            "--format=@%H",
            *chunk,
        )
        changes.update(parse_raw_log(result.stdout))
    if floor:
        # The floor's own tree at every path a commit changed, so that a path is
        # compared by content from the floor on ("" where the floor has none).
        touched = {path for paths in changes.values() for path in paths}
        tree = await git_ok("ls-tree", "-r", "-z", "--full-tree", floor)
        changes[floor] = {}
        for entry in tree.stdout.split("\0"):
            meta, _, path = entry.partition("\t")
            if path in touched:
                mode, _kind, object_id = meta.split(" ")
                changes[floor][path] = f"{mode} {object_id}"
    for commit in outside:
        result = await git_ok(
            "diff-tree", "-r", "--raw", "--no-abbrev", "--no-renames", "-z", floor, commit
        )
        changes[commit] = parse_raw_log(f"@{commit}\0" + result.stdout).get(commit, {})
    return changes


def parse_raw_log(text: str) -> dict[str, dict[str, str]]:
    """``git log --raw -z --format=@%H`` output: commit -> {path: "mode id" or ""}."""
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    tokens = text.split("\0")
    i = 0
    while i < len(tokens):
        token = tokens[i].lstrip("\n")
        i += 1
        if token.startswith("@"):
            current = out.setdefault(token[1:], {})
        elif token.startswith(":") and current is not None and i < len(tokens):
            path = tokens[i]
            i += 1
            _old_mode, new_mode, _old_id, new_id, status = token[1:].split(" ")
            current[path] = "" if status.startswith("D") else f"{new_mode} {new_id}"
    return out

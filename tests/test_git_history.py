"""What ``export`` reads from a repository (``adapters/git/history.py``): real parents
and per-commit changes, with which the in-memory source control's changed paths agree
with ``git diff --name-only`` on a merge-based history."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from git_histories import merge_based_history

from stovepipe_fsm.adapters.git.history import read_history
from stovepipe_fsm.adapters.memory import MemorySourceControl


def test_changed_paths_agree_with_git_diff_on_a_merge_based_history(tmp_path: Path) -> None:
    repo = merge_based_history(tmp_path / "repo")
    history = asyncio.run(read_history(str(repo.path), [*repo.heads, "no-such-commit"]))
    assert history.unknown == ("no-such-commit",)
    for head in repo.heads:  # real parents: a merge has two
        parents = repo.git("rev-list", "--parents", "-n", "1", head).split()[1:]
        assert history.parents[head] == [p for p in parents if p in history.parents]
    assert len(history.parents[repo.heads[1]]) == 2
    graph = MemorySourceControl(history.parents, history.changes)
    pairs = 0
    for base, head in itertools.permutations(dict.fromkeys(repo.heads), 2):
        diff = repo.git("diff", "--name-only", base, head)
        expected = frozenset(diff.splitlines())
        assert asyncio.run(graph.changed_paths(base, head)) == expected, (base, head)
        ancestor = repo.status("merge-base", "--is-ancestor", base, head) == 0
        assert asyncio.run(graph.is_ancestor(base, head)) == ancestor
        pairs += 1
    assert pairs >= 30
    # The path changed and changed back on a feature branch is not a change of trunk.
    merged = repo.heads[2]
    assert "src/app.py" not in asyncio.run(graph.changed_paths(repo.heads[1], merged))

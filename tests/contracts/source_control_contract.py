"""Contract of the source-control port (``stovepipe_fsm.ports.source_control``).

Fixture a subclass provides:

- ``build_graph``: an async callable taking ``{name: [parent names]}`` (parents listed
  before children) and returning a :class:`CommitGraph`: the source control under test,
  the backend id of every named commit, and one id the backend does not know.

The memory adapter maps names to themselves; the git adapter builds a real repository
with those commits. The graph below covers the three answers the build-strategy
decision branches on: fast-forward (``True``), history rewrite (``False``) and
ancestry uncertainty (``NotFound``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import pytest

from stovepipe_fsm.domain.entities import Green
from stovepipe_fsm.domain.errors import NotFound
from stovepipe_fsm.ports import SourceControl
from stovepipe_fsm.process.greens import NO_GREEN_ANCESTOR, newest_green_ancestor

# root ─ a ─ b ─ c ─────── m      (trunk; m merges the side branch)
#         └─ x ─ y ───────┘
# r1 ─ r2                          (a rewritten history sharing nothing with trunk)
GRAPH: Mapping[str, Sequence[str]] = {
    "root": [],
    "a": ["root"],
    "b": ["a"],
    "c": ["b"],
    "x": ["a"],
    "y": ["x"],
    "m": ["c", "y"],
    "r1": [],
    "r2": ["r1"],
}


@dataclass(frozen=True)
class CommitGraph:
    source_control: SourceControl
    ids: Mapping[str, str]
    missing: str

    async def ancestor(self, a: str, b: str) -> bool:
        return await self.source_control.is_ancestor(self.ids[a], self.ids[b])


GraphBuilder = Callable[[Mapping[str, Sequence[str]]], Awaitable[CommitGraph]]


class Counted:
    """A source control that counts the ancestry questions it is asked."""

    def __init__(self, inner: SourceControl) -> None:
        self.inner = inner
        self.asked: list[str] = []

    async def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        self.asked.append(ancestor)
        return await self.inner.is_ancestor(ancestor, descendant)


class SourceControlContract:
    """Contract tests for ``SourceControl.is_ancestor`` and ``first_parents_after``."""

    @pytest.mark.parametrize(
        ("base", "head", "limit", "expected"),
        [
            ("a", "m", 10, ("b", "c", "m")),  # the merged side branch is not listed
            ("x", "m", 10, ("b", "c", "m")),  # base off the line: what it reaches is not
            ("y", "m", 10, ("b", "c", "m")),
            ("a", "m", 2, ("c", "m")),  # the newest ``limit``
            ("c", "c", 10, ()),
            ("root", "b", 1, ("b",)),
        ],
    )
    async def test_first_parents_after_lists_the_line_the_base_does_not_reach(
        self,
        build_graph: GraphBuilder,
        base: str,
        head: str,
        limit: int,
        expected: tuple[str, ...],
    ) -> None:
        graph = await build_graph(GRAPH)
        ids = graph.ids
        found = await graph.source_control.first_parents_after(ids[base], ids[head], limit)
        assert found == tuple(ids[name] for name in expected)

    async def test_first_parents_after_an_unknown_commit_is_not_found(
        self, build_graph: GraphBuilder
    ) -> None:
        graph = await build_graph(GRAPH)
        with pytest.raises(NotFound):
            await graph.source_control.first_parents_after(graph.missing, graph.ids["m"], 5)
        with pytest.raises(NotFound):
            await graph.source_control.first_parents_after(graph.ids["a"], graph.missing, 5)

    @pytest.mark.parametrize(
        ("a", "b"),
        [("root", "c"), ("a", "b"), ("b", "c"), ("a", "y"), ("c", "m"), ("y", "m"), ("r1", "r2")],
    )
    async def test_ancestor_of_descendant_is_true(
        self, build_graph: GraphBuilder, a: str, b: str
    ) -> None:
        graph = await build_graph(GRAPH)
        assert await graph.ancestor(a, b) is True

    @pytest.mark.parametrize(
        ("a", "b"),
        [("c", "root"), ("b", "a"), ("m", "c"), ("b", "x"), ("x", "c"), ("r1", "c"), ("c", "r2")],
    )
    async def test_non_ancestor_is_false(self, build_graph: GraphBuilder, a: str, b: str) -> None:
        graph = await build_graph(GRAPH)
        assert await graph.ancestor(a, b) is False

    @pytest.mark.parametrize("name", ["root", "c", "m", "r2"])
    async def test_commit_is_its_own_ancestor(self, build_graph: GraphBuilder, name: str) -> None:
        graph = await build_graph(GRAPH)
        assert await graph.ancestor(name, name) is True

    async def test_unknown_ancestor_raises_not_found(self, build_graph: GraphBuilder) -> None:
        graph = await build_graph(GRAPH)
        with pytest.raises(NotFound):
            await graph.source_control.is_ancestor(graph.missing, graph.ids["c"])

    async def test_unknown_descendant_raises_not_found(self, build_graph: GraphBuilder) -> None:
        graph = await build_graph(GRAPH)
        with pytest.raises(NotFound):
            await graph.source_control.is_ancestor(graph.ids["root"], graph.missing)

    async def test_unknown_commit_equal_to_itself_raises_not_found(
        self, build_graph: GraphBuilder
    ) -> None:
        graph = await build_graph(GRAPH)
        with pytest.raises(NotFound):
            await graph.source_control.is_ancestor(graph.missing, graph.missing)

    @pytest.mark.parametrize(
        ("commit", "parent"), [("a", "root"), ("c", "b"), ("y", "x"), ("m", "c"), ("r2", "r1")]
    )
    async def test_first_parent_is_the_first_listed(
        self, build_graph: GraphBuilder, commit: str, parent: str
    ) -> None:
        graph = await build_graph(GRAPH)
        assert await graph.source_control.first_parent(graph.ids[commit]) == graph.ids[parent]

    @pytest.mark.parametrize("root", ["root", "r1"])
    async def test_a_root_commit_has_no_first_parent(
        self, build_graph: GraphBuilder, root: str
    ) -> None:
        graph = await build_graph(GRAPH)
        assert await graph.source_control.first_parent(graph.ids[root]) == ""

    async def test_first_parent_of_an_unknown_commit_raises_not_found(
        self, build_graph: GraphBuilder
    ) -> None:
        graph = await build_graph(GRAPH)
        with pytest.raises(NotFound):
            await graph.source_control.first_parent(graph.missing)

    async def test_answers_are_stable_when_asked_again(self, build_graph: GraphBuilder) -> None:
        graph = await build_graph(GRAPH)
        pairs = [("a", "m"), ("m", "a"), ("r1", "c")]
        first = [await graph.ancestor(a, b) for a, b in pairs]
        second = [await graph.ancestor(a, b) for a, b in pairs]
        assert first == second == [True, False, False]

    async def test_the_newest_green_ancestor_is_asked_for_newest_first(
        self, build_graph: GraphBuilder
    ) -> None:
        """Greens c, b, x, a (newest first) for the side branch's y: c and b are not
        ancestors, x is, and a is never asked about; a green the backend does not know
        is passed over; with no green an ancestor there is no base."""
        graph = await build_graph(GRAPH)
        greens = [
            Green(graph.ids[n], f"request/q/{i}")
            for i, n in ((4, "c"), (3, "b"), (2, "x"), (1, "a"))
        ]
        counted = Counted(graph.source_control)
        choice = await newest_green_ancestor(counted, greens, graph.ids["y"])
        assert choice.green == greens[2] and choice.passed == tuple(greens[:2])
        assert counted.asked == [graph.ids[n] for n in ("c", "b", "x")]
        gone = Green(graph.missing, "request/q/9")
        again = await newest_green_ancestor(graph.source_control, [gone, *greens], graph.ids["m"])
        assert again.green == greens[0] and again.unknown == (gone,)
        none = await newest_green_ancestor(graph.source_control, greens, graph.ids["r2"])
        assert none.green is None and none.full_cause == NO_GREEN_ANCESTOR

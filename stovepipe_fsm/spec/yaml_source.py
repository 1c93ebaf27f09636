"""YAML loading that remembers where every value came from.

PyYAML's composer gives each node a start mark; we build plain Python data from the
node tree ourselves so that (a) every mapping key and value keeps its 1-based
``line:column`` and (b) duplicate keys are an error instead of a silent overwrite.
Schema and lint errors then point at the exact spot the user typed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .errors import Location, SpecError, SpecIssue

JsonPath = tuple[str | int, ...]


@dataclass(frozen=True)
class SourceDocument:
    """Parsed YAML data plus the location of every value and mapping key in it."""

    file: str
    data: Any
    value_locations: dict[JsonPath, Location] = field(repr=False)
    key_locations: dict[JsonPath, Location] = field(repr=False)

    def locate(self, path: JsonPath, *, key: bool = False) -> Location:
        """Location of the value (or, with ``key``, the key) at ``path``.

        Falls back to the nearest enclosing value that has a location, so an error about a
        missing property points at the mapping that lacks it.
        """
        if key and path in self.key_locations:
            return self.key_locations[path]
        probe = tuple(path)
        while probe not in self.value_locations and probe:
            probe = probe[:-1]
        return self.value_locations.get(probe, Location(self.file, 1, 1))


class _Builder:
    """Turns a composed node tree into plain data and location maps."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.values: dict[JsonPath, Location] = {}
        self.keys: dict[JsonPath, Location] = {}
        self.issues: list[SpecIssue] = []
        self._scalars = SafeConstructor()
        # Collections being built right now: an alias back to one of them is a cycle
        # (``a: &x [*x]``), which would otherwise recurse until RecursionError.
        self._open: set[int] = set()

    def loc(self, node: Node) -> Location:
        return Location(self.file, node.start_mark.line + 1, node.start_mark.column + 1)

    def build(self, node: Node, path: JsonPath) -> Any:
        self.values[path] = self.loc(node)
        if isinstance(node, ScalarNode):
            return self._scalars.construct_object(node, deep=True)
        if id(node) in self._open:
            self._issue(node, "recursive alias: a value cannot contain itself")
            return None
        self._open.add(id(node))
        try:
            if isinstance(node, MappingNode):
                return self._mapping(node, path)
            assert isinstance(node, SequenceNode)
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        finally:
            self._open.discard(id(node))

    def _issue(self, node: Node, message: str) -> None:
        self.issues.append(SpecIssue(self.loc(node), message, "syntax"))

    def _mapping(self, node: MappingNode, path: JsonPath) -> dict[str, Any]:
        self._scalars.flatten_mapping(node)  # resolves YAML merge keys (<<)
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                self.issues.append(
                    SpecIssue(self.loc(key_node), "mapping keys must be plain scalars", "syntax")
                )
                continue
            key = self._scalars.construct_object(key_node)
            if not isinstance(key, str):
                key = str(key)
            child = (*path, key)
            if key in result:
                first = self.keys[child]
                self.issues.append(
                    SpecIssue(
                        self.loc(key_node),
                        f"duplicate key {key!r} (first defined at line {first.line}); "
                        "remove one of them",
                        "syntax",
                    )
                )
                continue
            self.keys[child] = self.loc(key_node)
            result[key] = self.build(value_node, child)
        return result


def parse_yaml(text: str, file: str) -> SourceDocument:
    """Parse one YAML document, raising :class:`SpecError` with locations on any defect."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = Location(file, mark.line + 1, mark.column + 1) if mark else Location(file, 1, 1)
        problem = exc.problem or exc.context or "invalid YAML"
        raise SpecError([SpecIssue(where, f"YAML syntax error: {problem}", "syntax")]) from None
    except yaml.YAMLError as exc:  # composer errors without marks (e.g. several documents)
        raise SpecError([SpecIssue(Location(file, 1, 1), f"YAML error: {exc}", "syntax")]) from None
    if node is None:
        raise SpecError(
            [SpecIssue(Location(file, 1, 1), "file is empty; expected a YAML mapping", "syntax")]
        )
    builder = _Builder(file)
    try:
        data = builder.build(node, ())
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        where = Location(file, mark.line + 1, mark.column + 1) if mark else Location(file, 1, 1)
        raise SpecError([SpecIssue(where, f"YAML error: {exc.problem}", "syntax")]) from None
    if builder.issues:
        # An alias builds its node once per use: report each defect once.
        raise SpecError(dict.fromkeys(builder.issues))
    return SourceDocument(file, data, builder.values, builder.keys)


def read_yaml(path: str | Path, *, display_name: str | None = None) -> SourceDocument:
    """Read and parse a YAML file; unreadable or non-UTF-8 files become located errors."""
    name = display_name or str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([SpecIssue(Location(name, 1, 1), "file not found", "io")]) from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            [SpecIssue(Location(name, 1, 1), f"file is not valid UTF-8: {exc.reason}", "io")]
        ) from None
    except OSError as exc:
        raise SpecError(
            [SpecIssue(Location(name, 1, 1), f"cannot read: {exc.strerror}", "io")]
        ) from None
    return parse_yaml(text, name)

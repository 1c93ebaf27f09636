"""YAML loading that remembers where every value came from.

PyYAML's composer gives each node a start mark; we build plain Python data from the
node tree ourselves so that (a) every mapping key and value keeps its 1-based
``line:column`` and (b) duplicate keys are an error instead of a silent overwrite.
Schema and lint errors then point at the exact spot the user typed.

Policy files are edited by hand and hot-reloaded by a running service, so reading one is
bounded whatever it holds: at most :data:`MAX_FILE_BYTES` bytes, at most
:data:`MAX_VALUES` values once aliases are expanded (an alias repeats what it points at,
so a few hundred bytes of nested aliases can stand for billions of values), and at most
:data:`MAX_DEPTH` levels of nesting. A file past a bound is refused with a located error,
like any other defect, after work proportional to the bound, not to the expansion.
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

#: The largest policy file read; machine and config files are a few KiB.
MAX_FILE_BYTES = 2 * 1024 * 1024
#: The most values (scalars, mappings, lists, merged keys) a document may expand to.
MAX_VALUES = 100_000
#: The deepest nesting of mappings and lists.
MAX_DEPTH = 64


class _TooLarge(Exception):
    """The document passed a bound; ``issue`` says which and where."""

    def __init__(self, issue: SpecIssue) -> None:
        super().__init__(issue.message)
        self.issue = issue


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


MERGE_TAG = "tag:yaml.org,2002:merge"
NULL_TAG = "tag:yaml.org,2002:null"
MAP_TAG = "tag:yaml.org,2002:map"
SEQ_TAG = "tag:yaml.org,2002:seq"
Pair = tuple[Node, Node]


class _Builder:
    """Turns a composed node tree into plain data and location maps."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.values: dict[JsonPath, Location] = {}
        self.keys: dict[JsonPath, Location] = {}
        self.issues: list[SpecIssue] = []
        self._scalars = SafeConstructor()
        self._values = 0
        self._locations: dict[int, Location] = {}
        # Collections being built right now: an alias back to one of them is a cycle
        # (``a: &x [*x]``), which would otherwise recurse until RecursionError.
        self._open: set[int] = set()

    def loc(self, node: Node) -> Location:
        # An aliased node is built once per use: make its location once.
        where = self._locations.get(id(node))
        if where is None:
            mark = node.start_mark
            where = self._locations[id(node)] = Location(self.file, mark.line + 1, mark.column + 1)
        return where

    def _count(self, node: Node, path: JsonPath, values: int = 1) -> None:
        """Charge ``values`` to the document's budget; :class:`_TooLarge` past a bound."""
        self._values += values
        if self._values > MAX_VALUES:
            # An aliased node's own mark is its anchor's: point at the top-level key whose
            # value was being expanded instead, the entry that grew past the bound.
            where = self.keys.get(path[:1]) if path else None
            raise _TooLarge(
                SpecIssue(
                    where or self.loc(node),
                    f"the document expands to more than {MAX_VALUES} values (an alias "
                    "repeats everything it points at); write the values out or use fewer "
                    "nested aliases",
                    "syntax",
                )
            )
        if len(path) > MAX_DEPTH:
            raise _TooLarge(
                SpecIssue(self.loc(node), f"nested more than {MAX_DEPTH} levels deep", "syntax")
            )

    def build(self, node: Node, path: JsonPath) -> Any:
        self._count(node, path)
        self.values[path] = self.loc(node)
        if isinstance(node, ScalarNode):
            return self._scalars.construct_object(node, deep=True)
        if id(node) in self._open:
            self._issue(node, "recursive alias: a value cannot contain itself")
            return None
        if node.tag not in (MAP_TAG, SEQ_TAG):
            # Scalars with an unknown tag already fail in the constructor; a tagged
            # collection (``!include {...}``, ``!!python/object/apply:f []``) would
            # otherwise be read as if the tag were not there.
            self._issue(node, f"unsupported tag {node.tag!r}: use plain mappings and lists")
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

    def _key(self, key_node: Node) -> str | None:
        if not isinstance(key_node, ScalarNode):
            self._issue(key_node, "mapping keys must be plain scalars")
            return None
        key = self._scalars.construct_object(key_node)
        return key if isinstance(key, str) else str(key)

    def _mapping(self, node: MappingNode, path: JsonPath) -> dict[str, Any]:
        """Build a mapping; a key written twice is an error, a key merged in (<<) is not.

        YAML merge keys give the mapping's own keys precedence over merged ones, and the
        first listed merge source precedence over later ones, so overriding a merged key
        is the point of a merge, not a duplicate.
        """
        merged, own = self._expand(node, frozenset({id(node)}))
        own_keys: dict[str, Location] = {}
        entries: dict[str, Pair] = {}
        for key_node, value_node in own:
            key = self._key(key_node)
            if key is None:
                continue
            if key in own_keys:
                first = own_keys[key]
                self._issue(
                    key_node,
                    f"duplicate key {key!r} (first defined at line {first.line}); "
                    "remove one of them",
                )
                continue
            own_keys[key] = self.loc(key_node)
            entries[key] = (key_node, value_node)
        inherited: dict[str, Pair] = {}
        for key_node, value_node in merged:  # lowest precedence first: later ones win
            key = self._key(key_node)
            if key is not None and key not in own_keys:
                inherited[key] = (key_node, value_node)
        result: dict[str, Any] = {}
        for key, (key_node, value_node) in (*inherited.items(), *entries.items()):
            child = (*path, key)
            self.keys[child] = self.loc(key_node)
            result[key] = self.build(value_node, child)
        return result

    def _expand(self, node: MappingNode, visiting: frozenset[int]) -> tuple[list[Pair], list[Pair]]:
        """``(merged, own)`` key/value pairs of a mapping; merged ones lowest precedence first."""
        merged: list[Pair] = []
        own: list[Pair] = []
        for key_node, value_node in node.value:
            if key_node.tag != MERGE_TAG:
                own.append((key_node, value_node))
                continue
            sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
            for source in reversed(sources):  # the first listed source takes precedence
                if not isinstance(source, MappingNode):
                    self._issue(source, "a merge key (<<) takes a mapping or a list of mappings")
                    continue
                if id(source) in visiting:
                    self._issue(source, "recursive alias: a mapping cannot merge itself")
                    continue
                inner_merged, inner_own = self._expand(source, visiting | {id(source)})
                self._count(source, (), len(inner_merged) + len(inner_own))
                merged += inner_merged + inner_own
        return merged, own


def parse_yaml(text: str, file: str) -> SourceDocument:
    """Parse one YAML document, raising :class:`SpecError` with locations on any defect."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        raise SpecError(
            [SpecIssue(Location(file, 1, 1), "nested too deeply to read", "syntax")]
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = Location(file, mark.line + 1, mark.column + 1) if mark else Location(file, 1, 1)
        problem = exc.problem or exc.context or "invalid YAML"
        raise SpecError(
            [SpecIssue(where, f"YAML syntax error: {problem}{_context(exc)}", "syntax")]
        ) from None
    except yaml.YAMLError as exc:  # composer errors without marks (e.g. several documents)
        raise SpecError([SpecIssue(Location(file, 1, 1), f"YAML error: {exc}", "syntax")]) from None
    if node is None or (node.tag == NULL_TAG and node.value == ""):  # nothing, or a bare ---
        raise SpecError(
            [SpecIssue(Location(file, 1, 1), "file is empty; expected a YAML mapping", "syntax")]
        )
    builder = _Builder(file)
    try:
        data = builder.build(node, ())
    except _TooLarge as exc:
        raise SpecError([exc.issue]) from None
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        where = Location(file, mark.line + 1, mark.column + 1) if mark else Location(file, 1, 1)
        raise SpecError([SpecIssue(where, f"YAML error: {exc.problem}", "syntax")]) from None
    if builder.issues:
        # An alias builds its node once per use: report each defect once.
        raise SpecError(dict.fromkeys(builder.issues))
    return SourceDocument(file, data, builder.values, builder.keys)


def _context(exc: yaml.MarkedYAMLError) -> str:
    """Where the construct the parser was in began, when that is elsewhere.

    An unclosed ``[`` is only noticed lines later, at the next ``key:``; the problem mark
    points there, and without the context mark the user has no pointer to the bracket.
    """
    mark, start = exc.problem_mark, exc.context_mark
    if not (exc.problem and exc.context and start):
        return ""
    if mark is not None and (mark.line, mark.column) == (start.line, start.column):
        return ""
    return f" ({exc.context} at line {start.line + 1}, column {start.column + 1})"


def read_yaml(path: str | Path, *, display_name: str | None = None) -> SourceDocument:
    """Read and parse a YAML file; unreadable or non-UTF-8 files become located errors."""
    name = display_name or str(path)
    try:
        with Path(path).open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SpecError([SpecIssue(Location(name, 1, 1), "file not found", "io")]) from None
    except OSError as exc:
        raise SpecError(
            [SpecIssue(Location(name, 1, 1), f"cannot read: {exc.strerror}", "io")]
        ) from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(
            [
                SpecIssue(
                    Location(name, 1, 1),
                    f"file is larger than {MAX_FILE_BYTES} bytes; a policy file is a few KiB",
                    "io",
                )
            ]
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([_undecodable(raw, exc, name)]) from None
    return parse_yaml(text, name)


def _undecodable(raw: bytes, exc: UnicodeDecodeError, name: str) -> SpecIssue:
    """Locate the first byte that is not UTF-8 (typically a Latin-1 accent pasted in)."""
    line_start = raw.rfind(b"\n", 0, exc.start) + 1
    line = raw.count(b"\n", 0, exc.start) + 1
    column = len(raw[line_start : exc.start].decode("utf-8")) + 1
    return SpecIssue(
        Location(name, line, column),
        f"file is not valid UTF-8 (byte 0x{raw[exc.start]:02x}: {exc.reason}); save it as UTF-8",
        "io",
    )

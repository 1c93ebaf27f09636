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

import re
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
    #: The text the document was parsed from.
    text: str = field(default="", repr=False, compare=False)

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

    def __init__(self, file: str, max_values: int = MAX_VALUES) -> None:
        self.file = file
        self.max_values = max_values
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
            where = self._locations[id(node)] = _at(self.file, node.start_mark)
        return where

    def _count(self, node: Node, path: JsonPath, values: int = 1) -> None:
        """Charge ``values`` to the document's budget; :class:`_TooLarge` past a bound."""
        self._values += values
        if self._values > self.max_values:
            # An aliased node's own mark is its anchor's: point at the top-level key whose
            # value was being expanded instead, the entry that grew past the bound.
            where = self.keys.get(path[:1]) if path else None
            raise _TooLarge(
                SpecIssue(
                    where or self.loc(node),
                    f"the document expands to more than {self.max_values} values (an alias "
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
        entries: dict[str, Pair] = {}
        for key_node, value_node in own:
            key = self._key(key_node)
            if key is None:
                continue
            if key in entries:
                first = self.loc(entries[key][0])
                self._issue(
                    key_node,
                    f"duplicate key {key!r} (first defined at line {first.line}); "
                    "remove one of them",
                )
                continue
            entries[key] = (key_node, value_node)
        inherited: dict[str, Pair] = {}
        for key_node, value_node in merged:  # lowest precedence first: later ones win
            key = self._key(key_node)
            if key is not None and key not in entries:
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


def parse_yaml(text: str, file: str, *, max_values: int = MAX_VALUES) -> SourceDocument:
    """Parse one YAML document, raising :class:`SpecError` with locations on any defect.

    ``max_values`` bounds what the document may expand to (see :data:`MAX_VALUES`).
    """
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        raise _refused(Location(file, 1, 1), "nested too deeply to read") from None
    except yaml.MarkedYAMLError as exc:
        where = _at(file, exc.problem_mark or exc.context_mark)
        problem = exc.problem or exc.context or "invalid YAML"
        raise _refused(where, f"YAML syntax error: {problem}{_context(exc)}") from None
    except yaml.YAMLError as exc:  # composer errors without marks (e.g. several documents)
        raise _refused(Location(file, 1, 1), f"YAML error: {exc}") from None
    if node is None or (node.tag == NULL_TAG and node.value == ""):  # nothing, or a bare ---
        raise _refused(Location(file, 1, 1), "file is empty; expected a YAML mapping")
    builder = _Builder(file, max_values)
    try:
        data = builder.build(node, ())
    except _TooLarge as exc:
        raise SpecError([exc.issue]) from None
    except yaml.constructor.ConstructorError as exc:
        raise _refused(_at(file, exc.problem_mark), f"YAML error: {exc.problem}") from None
    if builder.issues:
        # An alias builds its node once per use: report each defect once.
        raise SpecError(dict.fromkeys(builder.issues))
    return SourceDocument(file, data, builder.values, builder.keys, text)


def _refused(where: Location, message: str, rule: str = "syntax") -> SpecError:
    """The error of a document that cannot be read at all: one issue."""
    return SpecError([SpecIssue(where, message, rule)])


def _at(file: str, mark: yaml.Mark | None) -> Location:
    """Where ``mark`` points (1-based), or the start of ``file`` without one."""
    return Location(file, mark.line + 1, mark.column + 1) if mark else Location(file, 1, 1)


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


def read_yaml(
    path: str | Path,
    *,
    display_name: str | None = None,
    max_bytes: int = MAX_FILE_BYTES,
    max_values: int = MAX_VALUES,
) -> SourceDocument:
    """Read and parse a YAML file; unreadable or non-UTF-8 files become located errors.

    The bounds default to a policy file's; a caller reading larger files by design (a
    timeline of recorded history) passes its own.
    """
    name = display_name or str(path)
    text = read_text(path, name, max_bytes=max_bytes)
    return parse_yaml(text, name, max_values=max_values)


def read_text(path: str | Path, name: str, *, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a file of at most ``max_bytes``; located errors otherwise."""
    try:
        with Path(path).open("rb") as handle:
            raw = handle.read(max_bytes + 1)
    except FileNotFoundError:
        raise _refused(Location(name, 1, 1), "file not found", "io") from None
    except OSError as exc:
        raise _refused(Location(name, 1, 1), f"cannot read: {exc.strerror}", "io") from None
    if len(raw) > max_bytes:
        hint = "; a policy file is a few KiB" if max_bytes == MAX_FILE_BYTES else ""
        raise _refused(Location(name, 1, 1), f"file is larger than {max_bytes} bytes{hint}", "io")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([_undecodable(raw, exc, name)]) from None


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


# --- the fast path -----------------------------------------------------------------------

#: What the fast path leaves to :func:`parse_yaml`: anchors and aliases (``&`` ``*``), tags
#: (``!``) and merge keys (``<<``), whose bounds and checks only the located builder has.
#: It may also match inside a quoted value; that costs speed, never correctness.
_NOT_PLAIN = re.compile(r"[&*!]|<<")


@dataclass(frozen=True)
class FastDocument:
    """Data read by PyYAML's C parser, with the few locations a large file needs up front.

    ``top`` locates the value of each top-level key, ``items`` each item of the top-level
    list ``items_of`` (a timeline's steps, which a run reports errors at). Everything else
    is located by reading the file again with :func:`parse_yaml`, on the rare path where
    something is wrong.
    """

    file: str
    data: dict[str, Any]
    top: dict[str, Location]
    items: tuple[Location, ...]


class _NotFast(Exception):
    """The document needs the located builder (a duplicate or non-scalar key)."""


if yaml.__with_libyaml__:

    class _FastLoader(yaml.CSafeLoader):
        """The C parser and the safe constructor; a mapping is built as the located builder
        builds it (keys as strings), and a duplicate key sends the document back to it."""

        def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
            mapping: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, ScalarNode):
                    raise _NotFast
                key = self.construct_object(key_node)
                key = key if isinstance(key, str) else str(key)
                if key in mapping:
                    raise _NotFast
                mapping[key] = self.construct_object(value_node, deep=deep)
            return mapping


def parse_yaml_fast(text: str, file: str, items_of: str) -> FastDocument | None:
    """``text`` read with PyYAML's libyaml-backed loader, or ``None`` when the fast path
    does not apply: libyaml missing, a construct it leaves to :func:`parse_yaml` (see
    :data:`_NOT_PLAIN`), or any defect at all. ``None`` means "read it with
    :func:`parse_yaml`", which reports every defect at its ``file:line:column``.

    A document the fast path returns is the same data :func:`parse_yaml` builds.
    """
    if not yaml.__with_libyaml__ or _NOT_PLAIN.search(text):
        return None
    loader = _FastLoader(text)
    try:
        node = loader.get_single_node()
        if not isinstance(node, MappingNode):
            return None
        top: dict[str, Location] = {}
        items: tuple[Location, ...] = ()
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                return None
            top[key_node.value] = _at(file, value_node.start_mark)
            if key_node.value == items_of and isinstance(value_node, SequenceNode):
                items = tuple(_at(file, item.start_mark) for item in value_node.value)
        data = loader.construct_document(node)
    except (yaml.YAMLError, _NotFast, RecursionError, ValueError, TypeError):
        return None
    finally:
        loader.dispose()
    if not isinstance(data, dict) or set(top) != set(data):
        return None
    return FastDocument(file, data, top, items)

"""Located YAML loading: every defect a hand edit can cause is a SpecError at its spot.

The loader is the first thing a user meets after editing a machine file, so each bad
input here must come back as ``file:line:column: message`` (never a traceback), and a
good input must keep the location of every key and value for the later stages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stovepipe_fsm.located import yaml_source
from stovepipe_fsm.located.errors import Location, SpecError, SpecIssue
from stovepipe_fsm.located.yaml_source import parse_yaml, read_yaml
from stovepipe_fsm.machine.loader import load_machine

NAME = "machines/m.yaml"


def write(tmp_path: Path, content: str | bytes, name: str = "m.yaml") -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def only_issue(path: Path) -> SpecIssue:
    """The single issue reading ``path`` raises, shown under a stable display name."""
    with pytest.raises(SpecError) as caught:
        read_yaml(path, display_name=NAME)
    [issue] = caught.value.issues
    assert str(issue).startswith(f"{issue.location}: ")
    return issue


def at(issue: SpecIssue) -> tuple[int, int]:
    assert issue.location.file == NAME
    return issue.location.line, issue.location.column


# --- syntax --------------------------------------------------------------------------


def test_unclosed_flow_sequence_points_at_failure_and_names_the_bracket(tmp_path: Path) -> None:
    text = "name: m\nstates: [a, b\ninitial: a\n"
    issue = only_issue(write(tmp_path, text))
    # PyYAML notices the problem at the ':' of the next key...
    assert at(issue) == (3, len("initial") + 1)
    assert issue.rule == "syntax"
    assert issue.message.startswith("YAML syntax error: expected ',' or ']'")
    # ...and the message points back at the '[' that was never closed.
    bracket_column = text.splitlines()[1].index("[") + 1
    assert f"while parsing a flow sequence at line 2, column {bracket_column}" in issue.message


def test_bad_indentation_is_located(tmp_path: Path) -> None:
    issue = only_issue(write(tmp_path, "name: m\n  kind: flow\n"))
    assert at(issue) == (2, len("  kind") + 1)
    assert "mapping values are not allowed here" in issue.message


def test_tab_indentation_is_located(tmp_path: Path) -> None:
    issue = only_issue(write(tmp_path, "name: m\n\tkind: flow\n"))
    assert at(issue) == (2, 1)
    assert "'\\t'" in issue.message


def test_unterminated_quote_names_where_it_started(tmp_path: Path) -> None:
    issue = only_issue(write(tmp_path, "name: m\ndescription: 'never closed\n"))
    assert issue.location.line == 3  # end of stream
    assert "quoted scalar at line 2, column 14" in issue.message


def test_several_documents_are_refused(tmp_path: Path) -> None:
    issue = only_issue(write(tmp_path, "name: a\n---\nname: b\n"))
    assert at(issue) == (2, 1)
    assert "single document" in issue.message


def test_undefined_alias_is_located(tmp_path: Path) -> None:
    issue = only_issue(write(tmp_path, "name: m\ninitial: *start\n"))
    assert at(issue) == (2, len("initial: ") + 1)
    assert "undefined alias 'start'" in issue.message


def test_python_tag_on_a_scalar_is_refused_not_constructed(tmp_path: Path) -> None:
    issue = only_issue(write(tmp_path, "name: m\ninitial: !!python/name:os.getcwd ''\n"))
    assert at(issue) == (2, len("initial: ") + 1)
    assert "could not determine a constructor" in issue.message


@pytest.mark.parametrize(
    "value", ["!!python/object/apply:os.getcwd []", "!include {file: other.yaml}", "!!set {a}"]
)
def test_tag_on_a_collection_is_refused_not_ignored(tmp_path: Path, value: str) -> None:
    issue = only_issue(write(tmp_path, f"name: m\nstates: {value}\n"))
    assert at(issue) == (2, len("states: ") + 1)
    assert issue.message.startswith("unsupported tag ")


def test_explicit_standard_tags_are_accepted() -> None:
    doc = parse_yaml("a: !!map {x: !!str 1}\nb: !!seq [!!int '2']\n", NAME)
    assert doc.data == {"a": {"x": "1"}, "b": [2]}


def test_non_scalar_key_is_located(tmp_path: Path) -> None:
    issue = only_issue(write(tmp_path, "name: m\n? [a, b]\n: 1\n"))
    assert at(issue) == (2, 3)
    assert issue.message == "mapping keys must be plain scalars"


# --- duplicate keys ------------------------------------------------------------------


def test_duplicate_top_level_key_names_both_locations(tmp_path: Path) -> None:
    issue = only_issue(write(tmp_path, "name: request\nkind: lifecycle\nname: other\n"))
    assert at(issue) == (3, 1)  # the second one: the one to delete
    assert "duplicate key 'name'" in issue.message
    assert "first defined at line 1" in issue.message
    assert str(issue).startswith(f"{NAME}:3:1: duplicate key 'name' (first defined at line 1)")


def test_duplicate_key_inside_a_flow_mapping_is_located_at_the_second(tmp_path: Path) -> None:
    text = "transitions:\n  - {trigger: a, source: x,\n     trigger: b}\n"
    issue = only_issue(write(tmp_path, text))
    assert at(issue) == (3, 6)
    assert "duplicate key 'trigger' (first defined at line 2)" in issue.message


def test_every_duplicate_is_reported_in_one_run(tmp_path: Path) -> None:
    text = "a: 1\nb: 2\na: 3\nnested:\n  x: 1\n  x: 2\nb: 4\n"
    with pytest.raises(SpecError) as caught:
        read_yaml(write(tmp_path, text), display_name=NAME)
    found = [(i.location.line, i.message.split(" (")[0]) for i in caught.value.issues]
    assert found == [
        (3, "duplicate key 'a'"),
        (6, "duplicate key 'x'"),
        (7, "duplicate key 'b'"),
    ]


def test_overriding_a_merged_key_is_not_a_duplicate() -> None:
    text = "base: &base {x: 1, y: 2}\nother:\n  <<: *base\n  x: 3\n"
    doc = parse_yaml(text, NAME)
    assert doc.data["other"] == {"x": 3, "y": 2}
    assert doc.locate(("other", "x")) == Location(NAME, 4, 6)  # the override, not the anchor
    assert doc.locate(("other", "y")) == Location(NAME, 1, 23)  # inherited from the anchor


def test_first_merge_source_takes_precedence() -> None:
    doc = parse_yaml("a: &a {x: 1}\nb: &b {x: 2, y: 2}\nc:\n  <<: [*a, *b]\n", NAME)
    assert doc.data["c"] == {"x": 1, "y": 2}


def test_key_written_twice_next_to_a_merge_is_still_a_duplicate() -> None:
    text = "base: &base {x: 1}\nother:\n  <<: *base\n  x: 2\n  x: 3\n"
    with pytest.raises(SpecError) as caught:
        parse_yaml(text, NAME)
    [issue] = caught.value.issues
    assert (issue.location.line, issue.location.column) == (5, 3)
    assert "duplicate key 'x' (first defined at line 4)" in issue.message


def test_merging_a_scalar_is_located() -> None:
    with pytest.raises(SpecError) as caught:
        parse_yaml("a:\n  <<: 3\n", NAME)
    [issue] = caught.value.issues
    assert issue.location == Location(NAME, 2, 7)
    assert "merge key (<<) takes a mapping" in issue.message


@pytest.mark.parametrize("text", ["a: &x [*x]\n", "a: &x {b: *x}\n", "a: &x\n  <<: *x\n"])
def test_recursive_alias_is_an_error_not_a_recursion_error(text: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_yaml(text, NAME)
    [issue] = caught.value.issues
    assert issue.location.line == 1
    assert "recursive alias" in issue.message


# --- empty, wrong type, encoding, missing --------------------------------------------


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n# and another\n", "---\n"])
def test_empty_or_comment_only_file_is_an_error(tmp_path: Path, text: str) -> None:
    issue = only_issue(write(tmp_path, text))
    assert at(issue) == (1, 1)
    assert issue.message == "file is empty; expected a YAML mapping"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("- name: m\n- initial: a\n", "document: [{'name': 'm'}, {'initial': 'a'}] is not of "),
        ("just a string\n", "document: 'just a string' is not of type 'object'"),
        ("42\n", "document: 42 is not of type 'object'"),
    ],
)
def test_document_of_the_wrong_type_is_a_located_schema_error(
    tmp_path: Path, text: str, fragment: str
) -> None:
    with pytest.raises(SpecError) as caught:
        load_machine(write(tmp_path, text), display_name=NAME)
    [issue] = caught.value.issues
    assert at(issue) == (1, 1)
    assert fragment in issue.message


def test_values_of_the_wrong_type_are_each_located_at_the_value(tmp_path: Path) -> None:
    text = (
        "name: 7\n"
        "initial: [a]\n"
        "states:\n"
        "  - name: a\n"
        "    terminal: 'yes'\n"
        "transitions: {trigger: t}\n"
    )
    with pytest.raises(SpecError) as caught:
        load_machine(write(tmp_path, text), display_name=NAME)
    got = {(i.location.line, i.location.column): i.message for i in caught.value.issues}
    assert got == {
        (1, 7): "name: 7 is not of type 'string'",
        (2, 10): "initial: ['a'] is not of type 'string'",
        (5, 15): "states[0].terminal: 'yes' is not of type 'boolean'",
        (6, 14): "transitions: {'trigger': 't'} is not of type 'array'",
    }


def test_non_utf8_file_is_located_at_the_first_bad_byte(tmp_path: Path) -> None:
    # Line 2 holds a Latin-1 "é" (0xe9) followed by a valid UTF-8 one.
    content = b"name: m\ndescription: ol\xe9 \xc3\xa9\n"
    issue = only_issue(write(tmp_path, content))
    assert at(issue) == (2, len("description: ol") + 1)
    assert issue.rule == "io"
    assert "not valid UTF-8" in issue.message and "0xe9" in issue.message


def test_non_utf8_column_counts_characters_not_bytes(tmp_path: Path) -> None:
    # Two valid two-byte characters before the bad byte: column 3, not 5.
    issue = only_issue(write(tmp_path, "\u00e9\u00e9".encode() + b"\xff: 1\n"))
    assert at(issue) == (1, 3)


def test_missing_file_is_an_io_issue(tmp_path: Path) -> None:
    issue = only_issue(tmp_path / "nope.yaml")
    assert at(issue) == (1, 1)
    assert (issue.rule, issue.message) == ("io", "file not found")


def test_directory_is_an_io_issue(tmp_path: Path) -> None:
    issue = only_issue(tmp_path)
    assert issue.rule == "io"
    assert issue.message.startswith("cannot read: ")


def test_display_name_defaults_to_the_path(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    with pytest.raises(SpecError) as caught:
        read_yaml(path)
    assert caught.value.issues[0].location.file == str(path)


# --- locations of good input ---------------------------------------------------------


def test_every_key_and_value_keeps_its_location() -> None:
    text = (
        "# leading comment\n"
        "name: m\n"
        "states:\n"
        "  - a\n"
        "  - name: b\n"
        "    terminal: true\n"
        "transitions:\n"
        "  - {trigger: go, source: [a], dest: b}\n"
    )
    doc = parse_yaml(text, NAME)
    last = text.splitlines()[7]
    assert doc.data["states"] == ["a", {"name": "b", "terminal": True}]
    assert doc.locate(()) == Location(NAME, 2, 1)
    assert doc.locate(("name",)) == Location(NAME, 2, 7)
    assert doc.locate(("name",), key=True) == Location(NAME, 2, 1)
    assert doc.locate(("states", 0)) == Location(NAME, 4, 5)
    assert doc.locate(("states", 1, "terminal")) == Location(NAME, 6, 15)
    assert doc.locate(("states", 1, "terminal"), key=True) == Location(NAME, 6, 5)
    assert doc.locate(("transitions", 0, "source", 0)) == Location(NAME, 8, last.index("a]") + 1)
    assert doc.locate(("transitions", 0, "dest")) == Location(NAME, 8, last.index("b}") + 1)
    assert doc.locate(("transitions", 0, "dest"), key=True) == Location(
        NAME, 8, last.index("dest") + 1
    )


def test_locate_falls_back_to_the_nearest_enclosing_value() -> None:
    doc = parse_yaml("name: m\nstates:\n  - name: a\n", NAME)
    # A missing property is reported at the mapping that lacks it.
    assert doc.locate(("states", 0, "terminal")) == Location(NAME, 3, 5)
    assert doc.locate(("states", 0, "terminal"), key=True) == Location(NAME, 3, 5)
    assert doc.locate(("nothing", "here")) == doc.locate(())


def test_windows_line_endings_and_bom_keep_locations(tmp_path: Path) -> None:
    path = write(tmp_path, "\ufeffname: m\r\ninitial: a\r\n")
    doc = read_yaml(path, display_name=NAME)
    assert doc.data == {"name": "m", "initial": "a"}
    assert doc.locate(("initial",)) == Location(NAME, 2, 10)


def test_issues_sort_by_location_then_message() -> None:
    issues = [
        SpecIssue(Location("b.yaml", 1, 1), "z"),
        SpecIssue(Location("a.yaml", 9, 1), "y"),
        SpecIssue(Location("a.yaml", 2, 5), "x"),
    ]
    error = SpecError(issues)
    assert [str(i) for i in error] == ["a.yaml:2:5: x", "a.yaml:9:1: y", "b.yaml:1:1: z"]
    assert str(error) == "a.yaml:2:5: x\na.yaml:9:1: y\nb.yaml:1:1: z"


# -- bounded work on hostile files -----------------------------------------------------

ALIAS_BOMB = "\n".join(
    [
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(
            f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]"
            for p, n in zip("abcdefgh", "bcdefghi", strict=True)
        ),
    ]
)
MERGE_BOMB = "\n".join(
    [
        "a: &a {" + ", ".join(f"k{i}: {i}" for i in range(9)) + "}",
        *(
            f"{n}: &{n} " + "[" + ", ".join(f"{{<<: *{p}, x{i}: 1}}" for i in range(9)) + "]"
            for p, n in zip("abcdefgh", "bcdefghi", strict=True)
        ),
    ]
)


def counted_values(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, every value a YAML read builds appends 1 to the list returned: the
    work a read does, counted, whatever the machine's speed."""
    built: list[int] = []
    build = yaml_source._Builder.build

    def counted(self: Any, node: Any, path: Any) -> Any:
        built.append(1)
        return build(self, node, path)

    monkeypatch.setattr(yaml_source._Builder, "build", counted)
    return built


def test_an_alias_bomb_is_refused_after_bounded_work_and_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tracemalloc

    assert len(ALIAS_BOMB) < 400  # a billion values in a few hundred bytes
    path = write(tmp_path, ALIAS_BOMB)
    with monkeypatch.context() as patched:
        built = counted_values(patched)
        with pytest.raises(SpecError) as info:
            read_yaml(path)
    # It stopped at the bound: one value past it, never the billion the aliases repeat.
    assert len(built) == yaml_source.MAX_VALUES + 1
    tracemalloc.start()  # measured apart: tracing slows the parse several times over
    try:
        with pytest.raises(SpecError):
            read_yaml(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 * 1024
    [issue] = info.value.issues
    # Located at the entry whose expansion passed the bound: 9**6 values under 'f'.
    assert (issue.location.line, issue.location.column) == (6, 1)
    assert "expands to more than 100000 values" in issue.message
    assert str(issue).startswith(f"{path}:6:1: ")


def test_merge_keys_count_against_the_same_bound() -> None:
    with pytest.raises(SpecError, match="expands to more than"):
        parse_yaml(MERGE_BOMB, NAME)


def test_deep_nesting_is_refused_with_a_location() -> None:
    deep = "k: " + "[" * 70 + "]" * 70
    with pytest.raises(SpecError, match="nested more than 64 levels deep"):
        parse_yaml(deep, NAME)
    with pytest.raises(SpecError, match="nested too deeply"):
        parse_yaml("k: " + "[" * 5000 + "]" * 5000, NAME)


def test_an_oversized_file_is_refused_before_parsing(tmp_path: Path) -> None:
    path = write(tmp_path, "k: " + "x" * (3 * 1024 * 1024))
    issue = only_issue(path)
    assert (issue.location.line, issue.location.column) == (1, 1)
    assert "larger than 2097152 bytes" in issue.message

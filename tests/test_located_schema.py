"""JSON Schema of machine files: shipped files pass, every violation located at its spot.

Also keeps ``docs/schemas`` (what editors and CI tools are pointed at) byte-identical
to the schemas the loader actually uses inside the package.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixture_policy import GATE_YAML
from jsonschema import Draft202012Validator

from stovepipe_fsm.located.errors import SpecError, SpecIssue
from stovepipe_fsm.located.schema import SCHEMA_NAMES, load_schema, schema_issues
from stovepipe_fsm.located.yaml_source import parse_yaml, read_yaml
from stovepipe_fsm.machine.loader import parse_machine

ROOT = Path(__file__).resolve().parents[1]
PACKAGED = ROOT / "stovepipe_fsm" / "located" / "schemas"
PUBLISHED = ROOT / "docs" / "schemas"
MACHINES = ROOT / "machines"
NAME = "m.yaml"

MINIMAL = """\
name: m
initial: a
states:
  - a
  - name: b
    terminal: true
transitions:
  - trigger: go
    source: a
    dest: b
"""


def issues(text: str) -> list[SpecIssue]:
    return schema_issues(parse_yaml(text, NAME), "machine")


def located(text: str) -> list[tuple[int, int, str]]:
    return sorted((i.location.line, i.location.column, i.message) for i in issues(text))


def column(text: str, line: int, needle: str) -> int:
    """1-based column of ``needle`` on 1-based ``line`` of ``text``."""
    found = text.splitlines()[line - 1].index(needle)
    return found + 1


# --- published copies ----------------------------------------------------------------


def test_published_schemas_are_byte_identical_to_the_packaged_ones() -> None:
    packaged = sorted(p.name for p in PACKAGED.glob("*.json"))
    published = sorted(p.name for p in PUBLISHED.glob("*.json"))
    assert packaged == [
        "machine.schema.json",
        "queues.schema.json",
        "timeline-lines.schema.json",
        "timeline.schema.json",
    ]
    assert packaged == published, "copy stovepipe_fsm/located/schemas/*.json to docs/schemas/"
    for name in packaged:
        assert (PUBLISHED / name).read_bytes() == (PACKAGED / name).read_bytes(), name


@pytest.mark.parametrize("path", sorted(PACKAGED.glob("*.json")), ids=lambda p: p.name)
def test_each_schema_is_valid_draft_2020_12_with_a_matching_id(path: Path) -> None:
    schema = json.loads(path.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].endswith("/" + path.name)
    assert schema.get("title") and schema.get("description")


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_loader_uses_the_packaged_schema(name: str) -> None:
    on_disk = json.loads((PACKAGED / f"{name}.schema.json").read_text(encoding="utf-8"))
    assert load_schema(name) == on_disk


def test_machine_schema_documents_every_property() -> None:
    schema = load_schema("machine")
    top = schema["properties"]
    state = schema["properties"]["states"]["items"]["oneOf"][1]["properties"]
    transition = schema["properties"]["transitions"]["items"]["properties"]
    assert set(top) == {
        *("name", "kind", "description", "initial", "roles", "outcomes", "parameters"),
        *("plugins", "invariants", "states", "transitions"),
    }
    assert set(state) == {"name", "terminal", "holds_slot", "description"}
    assert set(transition) == {
        *("trigger", "source", "dest", "conditions", "unless", "before", "after"),
        "description",
    }
    for key in (
        *("kind", "initial", "roles", "outcomes", "parameters", "plugins", "invariants"),
        *("states", "transitions"),
    ):
        assert top[key].get("description"), key


# --- shipped machines ----------------------------------------------------------------


@pytest.mark.parametrize("filename", ["request.yaml", "queue_gate.yaml"])
def test_shipped_machines_pass_the_schema(filename: str) -> None:
    doc = read_yaml(MACHINES / filename)
    assert schema_issues(doc, "machine") == []
    # And what an editor sees after a YAML -> JSON round trip passes too.
    data = json.loads(json.dumps(doc.data))
    assert list(Draft202012Validator(load_schema("machine")).iter_errors(data)) == []


def test_minimal_machine_passes() -> None:
    assert issues(MINIMAL) == []


# --- unknown keys: located at the key ------------------------------------------------


def test_unknown_top_level_key_is_located_at_the_key() -> None:
    text = MINIMAL + "initail: b\n"
    [(line, col, message)] = located(text)
    assert (line, col) == (11, 1)
    assert message.startswith("unknown key 'initail' in document; allowed: description, ")


def test_unknown_key_in_a_state_mapping_is_located_at_the_key() -> None:
    text = MINIMAL.replace("    terminal: true\n", "    terminal: true\n    final: true\n")
    [(line, col, message)] = located(text)
    assert (line, col) == (7, 5)
    assert message == (
        "unknown key 'final' in states[1]; allowed: description, holds_slot, name, terminal"
    )


def test_unknown_key_in_a_transition_is_located_at_the_key() -> None:
    text = MINIMAL + "    on_enter: log\n"
    [(line, col, message)] = located(text)
    assert (line, col) == (11, 5)
    assert message.startswith("unknown key 'on_enter' in transitions[0]; allowed: after, ")


def test_unknown_key_in_a_flow_style_transition_is_located_at_the_key() -> None:
    text = MINIMAL + "  - {trigger: go, source: b, dest: a, prepare: x}\n"
    [(line, col, message)] = located(text)
    assert (line, col) == (11, column(text, 11, "prepare"))
    assert "unknown key 'prepare' in transitions[1]" in message


def test_transitions_library_keys_we_do_not_accept_are_unknown() -> None:
    # pytransitions would take these; our schema does not, so nothing is silently ignored.
    text = MINIMAL + "auto_transitions: true\nqueued: true\n"
    found = [m.split(";")[0] for _, _, m in located(text)]
    assert found == [
        "unknown key 'auto_transitions' in document",
        "unknown key 'queued' in document",
    ]


# --- wrong values: located at the value ----------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "line", "needle", "fragment"),
    [
        ("    terminal: true\n", "    terminal: yes please\n", 6, "yes", "not of type 'boolean'"),
        ("    dest: b\n", "    dest: 3\n", 10, "3", "dest: 3 is not of type 'string'"),
        ("    dest: b\n", "    dest: B\n", 10, "B", "does not match '^[a-z][a-z0-9_]*$'"),
        ("name: m\n", "name: m\nkind: graph\n", 2, "graph", "'graph' is not one of"),
        ("  - a\n", "  - Accepted\n", 4, "Accepted", "states[0]: 'Accepted' does not match"),
        ("    source: a\n", "    source: []\n", 9, "[]", "source: [] should be non-empty"),
        ("    source: a\n", "    source: '**'\n", 9, "'**'", "source: '**' does not match"),
        ("    source: a\n", "    source: [a, 7]\n", 9, "7", "source[1]: 7 is not of type"),
        ("    dest: b\n", "    dest: b\n    after: 5\n", 11, "5", "is not valid under any"),
        ("    dest: b\n", "    dest: b\n    unless: [Ok]\n", 11, "Ok", "unless[0]: 'Ok' does not"),
    ],
)
def test_wrong_value_is_located_at_the_value(
    old: str, new: str, line: int, needle: str, fragment: str
) -> None:
    assert old in MINIMAL
    text = MINIMAL.replace(old, new)
    [(got_line, got_col, message)] = located(text)
    assert (got_line, got_col) == (line, column(text, line, needle))
    assert fragment in message


def test_missing_required_key_is_located_at_the_mapping_that_lacks_it() -> None:
    text = MINIMAL.replace("    dest: b\n", "")
    [(line, col, message)] = located(text)
    assert (line, col) == (8, 5)
    assert message == "transitions[0]: 'dest' is a required property"


def test_state_mapping_without_a_name_says_so() -> None:
    text = MINIMAL.replace("  - name: b\n    terminal: true\n", "  - terminal: true\n")
    [(line, col, message)] = located(text)
    assert (line, col) == (5, 5)
    assert message == "states[1]: 'name' is a required property"


def test_state_mapping_with_an_unknown_key_and_a_bad_value_reports_both() -> None:
    text = MINIMAL.replace("    terminal: true\n", "    terminal: 'yes'\n    slot: true\n")
    assert located(text) == [
        (6, column(text, 6, "'yes'"), "states[1].terminal: 'yes' is not of type 'boolean'"),
        (7, 5, "unknown key 'slot' in states[1]; allowed: description, holds_slot, name, terminal"),
    ]


# --- every error in one run ----------------------------------------------------------


def test_three_defects_give_three_issues_in_one_run() -> None:
    text = (
        "name: m\n"
        "initial: a\n"
        "colour: red\n"  # unknown top-level key
        "states:\n"
        "  - name: a\n"
        "    holds_slot: 1\n"  # wrong type
        "transitions:\n"
        "  - trigger: go\n"
        "    source: a\n"
        "    dest: a\n"
        "    guard: ok\n"  # unknown transition key
    )
    with pytest.raises(SpecError) as caught:
        parse_machine(parse_yaml(text, NAME))
    assert [(i.location.line, i.location.column, i.rule) for i in caught.value.issues] == [
        (3, 1, "schema"),
        (6, 17, "schema"),
        (11, 5, "schema"),
    ]
    assert str(caught.value).splitlines() == [str(i) for i in caught.value.issues]
    assert all(str(i).startswith(f"{NAME}:") for i in caught.value.issues)


def test_defects_in_a_copy_of_a_real_machine_are_all_reported() -> None:
    text = GATE_YAML.read_text(encoding="utf-8")  # the tests' copy: edited by exact text
    text = text.replace("    terminal: true\n", "    terminal: True!\n", 1)
    text = text.replace(
        "    dest: loaded\n    after: load_request\n",
        "    dest: loaded\n    after: load_request\n    when: x\n",
    )
    text = text.replace("kind: flow\n", "kind: flow\nversion: 2\n")
    found = located(text)
    assert len(found) == 3
    lines = text.splitlines()
    assert [lines[line - 1].strip() for line, _, _ in found] == [
        "version: 2",
        "terminal: True!",
        "when: x",
    ]

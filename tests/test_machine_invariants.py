"""The invariants catalogue and the ``invariants:`` block of a machine file.

What is declared is read with the location of every name and parameter; lint holds each
entry to the catalogue, whose registration API (what a plugin calls) refuses what could
only be a mistake; and a policy declares each invariant once across its machine files.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.located.errors import SpecError
from stovepipe_fsm.located.yaml_source import parse_yaml
from stovepipe_fsm.machine.invariants import (
    BUILT_IN,
    INVARIANTS,
    STATE,
    TRANSITION,
    InvariantCatalog,
    InvariantInfo,
    policy_invariants,
)
from stovepipe_fsm.machine.lint import lint_machine
from stovepipe_fsm.machine.loader import load_machine_dir, parse_machine
from stovepipe_fsm.process.catalog import REGISTRIES

ROOT = Path(__file__).resolve().parents[1]
MACHINES = ROOT / "machines"
NAME = "m.yaml"

TOY = """\
name: toy
initial: open
states:
  - open
  - name: closed
    terminal: true
transitions:
  - {trigger: close, source: open, dest: closed}
"""


def toy_catalog() -> InvariantCatalog:
    """The shipped catalogue plus one invariant with a required and an optional parameter."""
    catalog = INVARIANTS.copy()

    @catalog.state(
        parameters={
            "limit": {"type": "integer", "minimum": 0, "description": "how many at most"},
            "strategy": {"enum": ["full", "incremental_since_green"], "default": "full"},
        }
    )
    def few_builds(obs: Any, rules: Any, params: Any) -> Iterator[str]:
        """At most ``limit`` builds of one strategy.

        Only the first paragraph is the summary.
        """
        yield from ()

    return catalog


def lint_text(text: str, catalog: InvariantCatalog = INVARIANTS) -> list[tuple[str, int, int, str]]:
    spec = parse_machine(parse_yaml(text, NAME))
    issues = lint_machine(spec, None, invariants=catalog)
    return [(i.rule, i.location.line, i.location.column, i.message) for i in issues]


# --- reading the block ----------------------------------------------------------------


def test_names_and_parameters_keep_their_locations() -> None:
    text = TOY + "invariants:\n  - progress\n  - {name: few_builds, limit: 2}\n"
    spec = parse_machine(parse_yaml(text, NAME))
    bare, mapped = spec.invariants
    assert (bare.name, bare.location.line, bare.location.column, bare.parameters) == (
        "progress",
        10,
        5,
        (),
    )
    line = text.splitlines()[10]
    assert (mapped.name, mapped.location.line, mapped.location.column) == (
        "few_builds",
        11,
        line.index("few_builds") + 1,
    )
    (limit,) = mapped.parameters
    assert (limit.name, limit.value) == ("limit", 2)
    assert (limit.location.line, limit.location.column) == (11, line.index("limit") + 1)
    assert (limit.value_location.line, limit.value_location.column) == (11, line.index("2") + 1)
    assert mapped.values == {"limit": 2}
    assert spec.invariants_location is not None and spec.invariants_location.line == 9


def test_a_machine_without_the_block_declares_nothing() -> None:
    spec = parse_machine(parse_yaml(TOY, NAME))
    assert spec.invariants == () and spec.invariants_location is None


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("- 5", "invariants[0]: 5 is not valid under any of the given schemas"),
        ("- {limit: 2}", "invariants[0]: 'name' is a required property"),
        ("- Progress", "invariants[0]: 'Progress' does not match '^[a-z][a-z0-9_]*$'"),
    ],
)
def test_the_schema_refuses_what_is_not_a_name_or_a_named_mapping(
    entry: str, message: str
) -> None:
    with pytest.raises(SpecError) as caught:
        parse_machine(parse_yaml(TOY + f"invariants:\n  {entry}\n", NAME))
    assert [str(i) for i in caught.value.issues] == [f"{NAME}:10:5: {message}"]


# --- lint -----------------------------------------------------------------------------


def test_the_shipped_catalogue_accepts_every_built_in_name() -> None:
    text = TOY + "invariants:\n" + "".join(f"  - {n}\n" for n in INVARIANTS.names())
    assert lint_text(text) == []


def test_parameters_are_checked_against_the_invariants_schema() -> None:
    catalog = toy_catalog()
    text = TOY + (
        "invariants:\n"
        "  - {name: few_builds, limit: -1, strategy: partial, colour: red}\n"
        "  - few_builds_too\n"
    )
    assert lint_text(text, catalog) == [
        ("invariant-parameter", 10, 31, "invariant 'few_builds', parameter 'limit': -1 is "
         "less than the minimum of 0"),
        ("invariant-parameter", 10, 45, "invariant 'few_builds', parameter 'strategy': "
         "'partial' is not one of ['full', 'incremental_since_green']"),
        ("invariant-parameter", 10, 54, "invariant 'few_builds' has no parameter 'colour'; "
         "its parameters: limit, strategy"),
        ("unknown-invariant", 11, 5, "no invariant named 'few_builds_too' in the catalogue; "
         "invariants: " + ", ".join(sorted(catalog.names()))),
    ]


def test_a_parameter_without_a_default_is_required_and_reported_at_the_name() -> None:
    catalog = toy_catalog()
    text = TOY + "invariants:\n  - few_builds\n"
    assert lint_text(text, catalog) == [
        ("invariant-parameter", 10, 5, "invariant 'few_builds' needs parameter 'limit' "
         "(how many at most)"),
    ]
    info = catalog.get("few_builds")
    assert info is not None
    ok = TOY + "invariants:\n  - {name: few_builds, limit: 3}\n"
    assert lint_text(ok, catalog) == []
    (ref,) = parse_machine(parse_yaml(ok, NAME)).invariants
    assert info.values(ref) == {"limit": 3, "strategy": "full"}


def test_a_plugin_invariant_is_unknown_to_a_catalogue_it_did_not_register_in() -> None:
    text = TOY + "invariants:\n  - {name: few_builds, limit: 3}\n"
    assert [rule for rule, *_ in lint_text(text)] == ["unknown-invariant"]
    assert "few_builds" not in INVARIANTS


# --- registration ---------------------------------------------------------------------


def test_registration_records_scope_summary_and_function() -> None:
    catalog = toy_catalog()
    info = catalog.get("few_builds")
    assert info is not None
    assert info.scope == STATE and info.check is not None
    assert info.summary == "At most ``limit`` builds of one strategy."

    @catalog.transition(name="calm", summary="nothing moves")
    def _calm(pre: Any, post: Any, rules: Any, params: Any) -> Iterator[str]:
        yield from ()

    calm = catalog.get("calm")
    assert calm is not None and calm.scope == TRANSITION and calm.check is _calm
    assert catalog.names()[-2:] == ("few_builds", "calm")
    assert "calm" not in INVARIANTS  # a copy is extended, never the catalogue it came from


@pytest.mark.parametrize(
    ("info", "error"),
    [
        (InvariantInfo("progress", "again"), "invariant 'progress' is registered twice"),
        (InvariantInfo("Max", "caps"), "invariant name 'Max' must match"),
        (InvariantInfo("odd", "x", scope="graph"), "unknown scope 'graph'"),
        (InvariantInfo("odd", "x", scope=STATE), "a state invariant needs a check function"),
        (
            InvariantInfo("odd", "x", scope=BUILT_IN, check=lambda *a: iter(())),
            "a built-in invariant takes no function",
        ),
        (
            InvariantInfo("odd", "x", parameters={"name": {"type": "string"}}),
            "bad parameter name 'name'",
        ),
    ],
)
def test_registration_refuses_mistakes(info: InvariantInfo, error: str) -> None:
    catalog = INVARIANTS.copy()
    with pytest.raises(ValueError, match=error):
        catalog.add(info)


def test_a_parameter_schema_must_be_a_schema() -> None:
    from jsonschema.exceptions import SchemaError

    with pytest.raises(SchemaError):
        INVARIANTS.copy().built_in("odd", "x", parameters={"limit": {"type": "integr"}})


def test_catalogue_entries_cannot_be_changed_after_registration() -> None:
    catalog = toy_catalog()
    info = catalog.get("few_builds")
    assert info is not None
    with pytest.raises(TypeError):
        info.parameters["limit"]["minimum"] = 5  # type: ignore[index]


# --- one declaration per policy -------------------------------------------------------


def copy_machines(tmp_path: Path) -> Path:
    target = tmp_path / "machines"
    shutil.copytree(MACHINES, target)
    return target


def declare_in_request(directory: Path, name: str) -> int:
    """Append ``name`` to request.yaml's invariants: block; return its line."""
    path = directory / "request.yaml"
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n") and "\ninvariants:\n" in text
    path.write_text(text + f"  - {name}\n", encoding="utf-8")
    return len(text.splitlines()) + 1


def line_in_gate(directory: Path, name: str) -> int:
    lines = (directory / "queue_gate.yaml").read_text(encoding="utf-8").splitlines()
    (line,) = [n for n, text in enumerate(lines, 1) if text.startswith(f"  - {name} ")]
    return line


def test_the_shipped_policy_declares_every_name_once() -> None:
    """Every name but that of the optional preempt role, which it does not declare."""
    specs = load_machine_dir(MACHINES, REGISTRIES)
    declared = [ref.name for spec in specs.values() for ref in spec.invariants]
    assert sorted(declared) == sorted(set(INVARIANTS.names()) - {"preempts_only_older"})
    assert [r.name for r in policy_invariants(specs.values())] == declared


def test_a_name_both_files_declare_is_reported_at_the_later_file(tmp_path: Path) -> None:
    directory = copy_machines(tmp_path)
    first = declare_in_request(directory, "progress")
    again = line_in_gate(directory, "progress")
    with pytest.raises(SpecError) as caught:
        load_machine_dir(directory, REGISTRIES)
    (issue,) = caught.value.issues
    assert (issue.rule, issue.location.file, issue.location.line) == (
        "duplicate-invariant",
        str(directory / "queue_gate.yaml"),
        again,
    )
    assert issue.message == (
        f"invariant 'progress' is already declared at {directory / 'request.yaml'}:{first}:5; "
        "a policy declares each invariant once"
    )
    # Loading without lint (the checker's mutation tests) keeps the first declaration.
    specs = load_machine_dir(directory, REGISTRIES, lint=False)
    (progress,) = [r for r in policy_invariants(specs.values()) if r.name == "progress"]
    assert progress.location.file.endswith("request.yaml")


def test_validate_reports_a_name_both_files_declare_at_the_later_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = copy_machines(tmp_path)
    request, gate = directory / "request.yaml", directory / "queue_gate.yaml"
    in_request = declare_in_request(directory, "max_concurrent")
    in_gate = line_in_gate(directory, "max_concurrent")
    capsys.readouterr()
    assert main(["validate", str(request), str(gate)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{gate}:{in_gate}:5: invariant 'max_concurrent' is already declared at "
        f"{request}:{in_request}:5; a policy declares each invariant once"
    ]
    # A directory is read in name order: queue_gate.yaml first.
    assert main(["validate", str(directory)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{request}:{in_request}:5: invariant 'max_concurrent' is already declared at "
        f"{gate}:{in_gate}:5; a policy declares each invariant once"
    ]

"""Diagrams drawn from the machine files: content, markers, row ids, determinism, drift,
the opt-in SVG layout and the ``diagram`` command.

Content, ids and edits are checked on the tests' own machines (``tests/fixtures``,
which began as the shipped ones). The tests of the committed ``docs/diagrams`` are the
ones CI relies on: they must be exactly what the shipped machines render to now,
whether or not Graphviz is installed.
"""

from __future__ import annotations

import difflib
import re
import shutil
import stat
import sys
from pathlib import Path

import pytest
from fixture_policy import MACHINES

from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.apps.diagram_files import (
    DiagramError,
    diagram_files,
    stale_diagrams,
    write_diagrams,
)
from stovepipe_fsm.located.errors import Location
from stovepipe_fsm.machine.diagrams import (
    dot_string,
    markdown_cell,
    mermaid_diagram,
    mermaid_id,
    mermaid_text,
    render_diagrams,
    render_dot,
    render_mermaid,
    transition_ids,
)
from stovepipe_fsm.machine.loader import load_machine_dir
from stovepipe_fsm.machine.model import MachineSpec, NameRef, StateSpec, TransitionSpec
from stovepipe_fsm.process.catalog import REGISTRIES

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "machines"
COMMITTED = ROOT / "docs" / "diagrams"
REQUIRED_NAMES = ["queue_gate.dot", "queue_gate.md", "request.dot", "request.md"]
#: What the command writes: the diagrams and the policy card beside them.
COMMAND_NAMES = sorted([*REQUIRED_NAMES, "policy_card.md"])
SVG_NAMES = ["queue_gate.svg", "request.svg"]


@pytest.fixture
def specs() -> dict[str, MachineSpec]:
    return load_machine_dir(MACHINES, REGISTRIES)


@pytest.fixture
def shipped_specs() -> dict[str, MachineSpec]:
    return load_machine_dir(SHIPPED, REGISTRIES)


@pytest.fixture
def no_dot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Graphviz absent, whatever this machine has: ``PATH`` is one empty directory."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


@pytest.fixture
def machines_copy(tmp_path: Path) -> Path:
    target = tmp_path / "machines"
    shutil.copytree(MACHINES, target)
    return target


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")


def mermaid_block(markdown: str) -> list[str]:
    match = re.search(r"```mermaid\n(.*?)\n```", markdown, re.DOTALL)
    assert match, "no mermaid block"
    return [line.strip() for line in match.group(1).splitlines()]


def expected_label(t: TransitionSpec) -> str:
    """The documented label format, spelled out independently of the renderer."""
    guards = [c.name for c in t.conditions] + ["!" + u.name for u in t.unless]
    text = t.trigger
    if guards:
        text += " [" + ", ".join(guards) + "]"
    if t.before or t.after:
        text += " / " + ", ".join(a.name for a in (*t.before, *t.after))
    return text


# --- content of the machines -----------------------------------------------------------


def test_mermaid_has_every_state_and_every_edge(specs: dict[str, MachineSpec]) -> None:
    for spec in specs.values():
        lines = mermaid_block(render_mermaid(spec, REGISTRIES[spec.name]))
        assert lines[0] == "stateDiagram-v2"
        assert f"[*] --> {spec.initial.name}" in lines
        for state in spec.states:
            assert any(line.startswith('state "' + state.name) for line in lines), state.name
            if state.description:
                assert f"{state.name} : {mermaid_text(state.description)}" in lines
        edges = [line for line in lines if " --> " in line and "[*]" not in line]
        expected = [
            f"{source} --> {t.dest.name} : {expected_label(t)}"
            for t in spec.transitions
            for source in t.source_names
        ]
        assert edges == expected  # one per (source, transition), in YAML order


def test_edge_labels_carry_conditions_unless_and_actions_in_order(
    specs: dict[str, MachineSpec],
) -> None:
    gate = mermaid_block(render_mermaid(specs["queue_gate"], REGISTRIES["queue_gate"]))
    assert (
        "slot_claimed --> acked : admit [!slot_conflict] / "
        "mark_processing, release_lost_claim, announce, publish_build, ack"
    ) in gate
    reannounce = "dispatch [request_is_processing, !request_is_terminal] / announce"
    assert f"loaded --> reannounced : {reannounce}" in gate
    latest = "coalesce [!paused, !newer_head_exists, !latest_not_stamped]"
    assert f"queue_loaded --> latest : {latest}" in gate
    request = mermaid_block(render_mermaid(specs["request"]))
    # a transition listing two sources is drawn once from each of them
    assert "accepted --> failed : fail_closed" in request
    assert "processing --> failed : fail_closed" in request


def test_terminal_and_slot_states_are_marked(specs: dict[str, MachineSpec]) -> None:
    request = mermaid_block(render_mermaid(specs["request"]))
    assert 'state "processing (holds slot)" as processing' in request
    assert 'state "accepted" as accepted' in request
    assert "class processing slot" in request
    assert "class cancelled,failed,succeeded,superseded terminal" in request
    assert any(line.startswith("classDef slot ") for line in request)
    assert any(line.startswith("classDef terminal ") for line in request)
    ends = sorted(line.split(" --> ")[0] for line in request if line.endswith("--> [*]"))
    assert ends == ["cancelled", "failed", "succeeded", "superseded"]

    gate = mermaid_block(render_mermaid(specs["queue_gate"]))
    assert "class acked,held terminal" in gate
    assert not any(line.startswith("class ") and line.endswith(" slot") for line in gate)


def test_markdown_page_header_description_and_tables(specs: dict[str, MachineSpec]) -> None:
    page = render_mermaid(specs["request"], REGISTRIES["request"])
    first, heading = page.splitlines()[:2]
    assert first == (
        "<!-- generated by stovepipe-fsm diagram from machines/request.yaml; do not edit -->"
    )
    assert heading == "# `request` state machine"
    assert "One trunk head of one queue, from ingest to a terminal outcome." in page
    assert "| `processing` | holds slot | admitted; strategy recorded; build in flight |" in page
    assert "| `accepted` | initial | ingested, waiting for process |" in page
    assert (
        "| `fail_closed:accepted,processing->failed` | `fail_closed` | `accepted`, `processing` "
        "| `failed` |"
    ) in page
    # slot effects are derived from the state declarations and spelled out per transition
    assert (
        "| `admit:accepted->processing` | `admit` | `accepted` | `processing` |  |  "
        "| takes a slot |"
    ) in page
    assert "|  |  | releases its slot, if held | record - build outcome green |" in page
    assert "| Slot |" not in render_mermaid(specs["queue_gate"])
    assert "No transition of this machine names a condition or an action." in page
    assert page.endswith("\n") and not page.endswith("\n\n")


def test_legend_explains_every_condition_and_action_from_the_registry(
    specs: dict[str, MachineSpec],
) -> None:
    spec, registry = specs["queue_gate"], REGISTRIES["queue_gate"]
    page = render_mermaid(spec, registry)
    legend = page.split("## Conditions and actions", 1)[1].split("\n## ", 1)[0]
    used_conditions = {r.name for t in spec.transitions for r in t.conditions + t.unless}
    used_actions = {r.name for t in spec.transitions for r in t.actions}
    rows = {line.split("|")[1].strip(" `"): line for line in legend.splitlines() if "| `" in line}
    assert set(rows) == used_conditions | used_actions
    for name in used_conditions:
        assert "| condition |" in rows[name]
        assert registry.conditions[name].doc in rows[name]
    for name in used_actions:
        assert registry.actions[name].doc in rows[name]
    assert "action, finishes the delivery" in rows["hold"]
    assert "requires `slot_held`, `strategy_derived`" in rows["mark_processing"]
    assert "provides when false `slot_held`" in rows["slot_conflict"]
    # legend rows are sorted (conditions, then actions) so a YAML reorder leaves them alone
    names = list(rows)
    conditions = [n for n in names if n in used_conditions]
    assert names == sorted(conditions) + sorted(n for n in names if n not in used_conditions)


def test_legend_without_registry_still_lists_every_name(specs: dict[str, MachineSpec]) -> None:
    page = render_mermaid(specs["queue_gate"])
    legend = page.split("## Conditions and actions", 1)[1]
    assert "| `gate_closed` | condition | `gate` |  |  |" in legend
    assert "| `ack` | action | `dispatch`, `republish`, `coalesce`, `admit` |  |  |" in legend


def test_dot_has_states_markers_and_labelled_edges(specs: dict[str, MachineSpec]) -> None:
    dot = render_dot(specs["request"])
    assert dot.splitlines()[0] == (
        "// generated by stovepipe-fsm diagram from machines/request.yaml; do not edit"
    )
    assert dot.splitlines()[1] == 'digraph "request" {'
    nodes = {
        m.group(1): m.group(2)
        for m in re.finditer(r'^  "(\w+)" \[(label=.*)\];$', dot, re.MULTILINE)
    }
    assert set(nodes) == set(specs["request"].state_names)
    for name in ("superseded", "succeeded", "failed", "cancelled"):
        assert "shape=doublecircle" in nodes[name] and "style=bold" in nodes[name]
    assert "filled" in nodes["processing"] and "fillcolor=" in nodes["processing"]
    assert 'label="processing (holds slot)\\n' in nodes["processing"]
    for name in ("accepted", "processing"):
        assert "doublecircle" not in nodes[name]
    assert '"__start__" -> "accepted";' in dot
    assert '"accepted" -> "failed" [label="fail_closed"];' in dot
    assert '"processing" -> "failed" [label="fail_closed"];' in dot

    gate = render_dot(specs["queue_gate"])
    edges = re.findall(r'^  "(\w+)" -> "(\w+)" \[label="(.*)"\];$', gate, re.MULTILINE)
    expected = [
        (source, t.dest.name) for t in specs["queue_gate"].transitions for source in t.sources
    ]
    assert [(s, d) for s, d, _ in edges] == [(s.name, d) for s, d in expected]
    for (_, _, label), t in zip(edges, specs["queue_gate"].transitions, strict=True):
        # long labels are broken into lines; the words are the Mermaid label's
        assert label.replace("\\n", " ") == expected_label(t)


def test_header_names_the_file_never_a_local_path(machines_copy: Path) -> None:
    specs = load_machine_dir(machines_copy, REGISTRIES)
    assert Path(specs["queue_gate"].file).is_absolute()  # the loader kept the real path
    for spec in specs.values():
        for text in (render_mermaid(spec, REGISTRIES[spec.name]), render_dot(spec)):
            assert str(machines_copy) not in text
            assert f"from machines/{spec.name}.yaml; do not edit" in text.splitlines()[0]


# --- transition row ids ---------------------------------------------------------------


def test_transition_ids_are_made_from_the_transition_itself(
    specs: dict[str, MachineSpec],
) -> None:
    assert transition_ids(specs["request"]) == [
        "admit:accepted->processing",
        "supersede:accepted->superseded",
        "succeed:processing->succeeded",
        "fail:processing->failed",
        "cancel:processing->cancelled",
        "fail_closed:accepted,processing->failed",
        "withdraw:accepted->cancelled",
    ]
    gate = specs["queue_gate"]
    ids = transition_ids(gate)
    assert len(set(ids)) == len(ids) == len(gate.transitions)
    assert ids[-1] == "admit:slot_claimed->acked"


def _spec(transitions: list[tuple[str, tuple[str, ...], str, str]], wild: str = "") -> MachineSpec:
    """A lifecycle over states a, b, c from (trigger, sources, dest, condition) rows; the
    trigger named ``wild`` is written with ``source: '*'``."""
    where = Location("ids.yaml", 1, 1)
    states = tuple(StateSpec(n, where, terminal=n == "c") for n in ("a", "b", "c"))
    rows = tuple(
        TransitionSpec(
            i,
            trigger,
            tuple(NameRef(n, where) for n in sources),
            NameRef(dest, where),
            where,
            conditions=(NameRef(cond, where),) if cond else (),
            wildcard_source=trigger == wild,
        )
        for i, (trigger, sources, dest, cond) in enumerate(transitions)
    )
    return MachineSpec("ids", "lifecycle", NameRef("a", where), states, rows, "ids.yaml")


def test_transition_ids_keep_wildcards_and_number_repeats_in_yaml_order() -> None:
    rows = [
        ("go", ("a",), "b", "ready"),
        ("stop", ("a", "b"), "c", ""),
        ("go", ("a",), "b", "forced"),
        ("go", ("a",), "b", "late"),
    ]
    assert transition_ids(_spec(rows, wild="stop")) == [
        "go:a->b",
        "stop:*->c",  # '*' stays '*': a state added later does not change the id
        "go:a->b#2",
        "go:a->b#3",
    ]
    # a transition appended, or inserted before another one, renames no existing row
    grown = [*rows[:1], ("back", ("b",), "a", ""), *rows[1:], ("go", ("a",), "b", "new")]
    assert transition_ids(_spec(grown, wild="stop")) == [
        "go:a->b",
        "back:b->a",
        "stop:*->c",
        "go:a->b#2",
        "go:a->b#3",
        "go:a->b#4",
    ]


def _transitions_table(page: str) -> list[str]:
    table = page.split("## Transitions\n", 1)[1].split("\n## ", 1)[0]
    return table.strip().splitlines()


def test_inserting_a_transition_changes_only_its_own_row(machines_copy: Path) -> None:
    """The review diff of a new transition is that transition, not a renumbered table."""
    before = render_diagrams(load_machine_dir(machines_copy, REGISTRIES), REGISTRIES)
    _edit(
        machines_copy / "request.yaml",
        "  - trigger: succeed\n",
        "  - trigger: abandon\n"
        "    source: accepted\n"
        "    dest: superseded\n"
        "    description: the head was withdrawn before process saw it\n"
        "  - trigger: succeed\n",
    )
    after = render_diagrams(load_machine_dir(machines_copy, REGISTRIES), REGISTRIES)
    old_rows = _transitions_table(before["request.md"])
    new_rows = _transitions_table(after["request.md"])
    diff = [
        line
        for line in difflib.unified_diff(old_rows, new_rows, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert diff == [
        "+| `abandon:accepted->superseded` | `abandon` | `accepted` | `superseded` |  |  "
        "| releases its slot, if held | the head was withdrawn before process saw it |"
    ]
    assert new_rows.index(diff[0][1:]) == old_rows.index(
        next(r for r in old_rows if r.startswith("| `succeed:"))
    )  # it sits where it was written, among rows that kept their text
    # the whole page only gains lines (the row and the Mermaid edge); nothing is rewritten
    page_diff = difflib.ndiff(before["request.md"].splitlines(), after["request.md"].splitlines())
    assert [line[2:] for line in page_diff if line.startswith("- ")] == []
    assert after["queue_gate.md"] == before["queue_gate.md"]


# --- determinism ----------------------------------------------------------------------


def test_rendering_is_deterministic(specs: dict[str, MachineSpec]) -> None:
    first = render_diagrams(specs, REGISTRIES)
    again = render_diagrams(specs, REGISTRIES)
    fresh = render_diagrams(load_machine_dir(MACHINES, REGISTRIES), REGISTRIES)
    assert first == again == fresh
    assert sorted(first) == REQUIRED_NAMES
    reordered = dict(reversed(list(specs.items())))
    assert list(render_diagrams(reordered, REGISTRIES)) == list(first)


def test_outputs_from_a_copied_tree_are_identical(
    specs: dict[str, MachineSpec], machines_copy: Path
) -> None:
    copied = load_machine_dir(machines_copy, REGISTRIES)
    assert render_diagrams(copied, REGISTRIES) == render_diagrams(specs, REGISTRIES)


# --- drift ----------------------------------------------------------------------------


def test_written_diagrams_are_not_stale_and_rewriting_is_a_no_op(
    specs: dict[str, MachineSpec], tmp_path: Path
) -> None:
    files = diagram_files(specs, REGISTRIES)
    assert files.contents == render_diagrams(specs, REGISTRIES)
    out = tmp_path / "docs" / "diagrams"
    assert stale_diagrams(files, out) == REQUIRED_NAMES  # directory does not exist yet
    written = write_diagrams(files, out)
    assert [p.name for p in written] == REQUIRED_NAMES
    assert stale_diagrams(files, out) == []
    assert sorted(p.name for p in out.iterdir()) == REQUIRED_NAMES  # no temp files left
    for name, content in files.contents.items():
        assert (out / name).read_bytes() == content.encode("utf-8")
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o644  # readable, not private
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert write_diagrams(files, out) == []
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_changing_a_destination_makes_exactly_that_machines_files_stale(
    machines_copy: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    write_diagrams(diagram_files(load_machine_dir(machines_copy, REGISTRIES), REGISTRIES), out)
    _edit(
        machines_copy / "request.yaml",
        "  - trigger: fail_closed\n    source: [accepted, processing]\n    dest: failed",
        "  - trigger: fail_closed\n    source: [accepted, processing]\n    dest: cancelled",
    )
    edited = diagram_files(load_machine_dir(machines_copy, REGISTRIES), REGISTRIES)
    assert "accepted --> cancelled : fail_closed" in edited.contents["request.md"]
    assert stale_diagrams(edited, out) == ["request.dot", "request.md"]
    assert [p.name for p in write_diagrams(edited, out)] == ["request.dot", "request.md"]
    assert stale_diagrams(edited, out) == []


def test_adding_an_action_makes_exactly_that_machines_files_stale(
    machines_copy: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    write_diagrams(diagram_files(load_machine_dir(machines_copy, REGISTRIES), REGISTRIES), out)
    _edit(
        machines_copy / "queue_gate.yaml",
        "after: [publish_build, ack]",
        "after: [publish_build, load_queue, ack]",
    )
    edited = diagram_files(load_machine_dir(machines_copy, REGISTRIES), REGISTRIES)
    edge = "reannounced --> acked : republish / publish_build, load_queue, ack"
    assert edge in edited.contents["queue_gate.md"]
    assert stale_diagrams(edited, out) == ["queue_gate.dot", "queue_gate.md"]


def test_missing_or_edited_file_is_stale(specs: dict[str, MachineSpec], tmp_path: Path) -> None:
    files = diagram_files(specs, REGISTRIES)
    write_diagrams(files, tmp_path)
    (tmp_path / "request.dot").unlink()
    assert stale_diagrams(files, tmp_path) == ["request.dot"]
    with (tmp_path / "queue_gate.md").open("a", encoding="utf-8") as handle:
        handle.write("hand edit\n")
    assert stale_diagrams(files, tmp_path) == ["queue_gate.md", "request.dot"]


def test_generated_files_no_longer_produced_are_stale_and_removed(
    specs: dict[str, MachineSpec], tmp_path: Path
) -> None:
    files = diagram_files(specs, REGISTRIES)
    write_diagrams(files, tmp_path)
    # a machine renamed from "gate" to "queue_gate" leaves its old files behind
    (tmp_path / "gate.md").write_text(files.contents["queue_gate.md"], encoding="utf-8")
    (tmp_path / "gate.dot").write_text(files.contents["queue_gate.dot"], encoding="utf-8")
    # files without the generated header are someone's own, and never touched
    (tmp_path / "README.md").write_text("# Diagrams\nhow to read them\n", encoding="utf-8")
    (tmp_path / "notes.dot").write_text("digraph { a -> b }\n", encoding="utf-8")
    assert stale_diagrams(files, tmp_path) == ["gate.dot", "gate.md"]
    assert write_diagrams(files, tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*REQUIRED_NAMES, "README.md", "notes.dot"]
    )
    assert stale_diagrams(files, tmp_path) == []


# --- SVG, only on request -------------------------------------------------------------

FAKE_DOT = """\
import pathlib
import sys
with pathlib.Path(__file__).with_name("calls").open("a") as log:
    log.write("dot\\n")
source = sys.stdin.read()
assert sys.argv[1:] == ["-Tsvg"], sys.argv
title = source.splitlines()[1].split('"')[1]
print('<?xml version="1.0" encoding="UTF-8" standalone="no"?>')
print("<!-- Generated by graphviz version 99.1.0 (20990101.0000)")
print(" -->")
print(f"<!-- Title: {title} Pages: 1 -->")
print(f'<svg width="{len(source)}pt"><title>{title}</title></svg>')
"""


@pytest.fixture
def fake_dot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in ``dot``, alone on PATH, that prints SVG the way Graphviz frames it and
    logs each run to ``calls`` beside it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "dot"
    script.write_text(f"#!{sys.executable}\n{FAKE_DOT}", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir))
    return script


def dot_runs(fake: Path) -> int:
    calls = fake.with_name("calls")
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_without_svg_dot_is_never_run_and_svg_files_are_left_alone(
    specs: dict[str, MachineSpec], tmp_path: Path, fake_dot: Path
) -> None:
    files = diagram_files(specs, REGISTRIES)
    assert sorted(files.contents) == REQUIRED_NAMES
    out = tmp_path / "out"
    write_diagrams(files, out)
    # a generated SVG that no longer matches, and one of a machine no longer produced
    header = "<!-- generated by stovepipe-fsm diagram from machines/request.yaml -->"
    old_svg = f"<?xml?>\n{header}\n<svg/>"
    (out / "request.svg").write_text(old_svg, encoding="utf-8")
    (out / "gate.svg").write_text(old_svg, encoding="utf-8")
    assert stale_diagrams(files, out) == []
    assert write_diagrams(files, out) == []
    assert (out / "request.svg").read_text(encoding="utf-8") == old_svg
    assert (out / "gate.svg").read_text(encoding="utf-8") == old_svg
    assert dot_runs(fake_dot) == 0


def test_without_dot_markdown_and_dot_need_no_program_and_svg_is_refused(
    specs: dict[str, MachineSpec], no_dot: None
) -> None:
    assert diagram_files(specs, REGISTRIES).contents == render_diagrams(specs, REGISTRIES)
    with pytest.raises(DiagramError, match="Graphviz 'dot' program, which is not on PATH"):
        diagram_files(specs, REGISTRIES, svg=True)


def test_svg_output_drops_the_graphviz_version_and_carries_our_header(
    specs: dict[str, MachineSpec], tmp_path: Path, fake_dot: Path
) -> None:
    files = diagram_files(specs, REGISTRIES, svg=True)
    assert sorted(files.contents) == sorted([*REQUIRED_NAMES, *SVG_NAMES])
    assert dot_runs(fake_dot) == 2  # one layout per machine
    svg = files.contents["request.svg"]
    assert "graphviz version" not in svg and "99.1.0" not in svg
    assert svg.splitlines()[:3] == [
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>',
        "<!-- Title: request Pages: 1 -->",
        "<!-- generated by stovepipe-fsm diagram from machines/request.yaml; do not edit -->",
    ]
    dot_source = files.contents["request.dot"]
    assert f'<svg width="{len(dot_source)}pt">' in svg  # laid out from the DOT
    assert diagram_files(specs, REGISTRIES, svg=True) == files

    out = tmp_path / "out"
    write_diagrams(files, out)
    assert stale_diagrams(files, out) == []
    (out / "request.svg").unlink()
    assert stale_diagrams(files, out) == ["request.svg"]
    write_diagrams(files, out)
    # with SVG asked for, an SVG of a machine no longer produced is stale and removed
    (out / "gate.svg").write_text(files.contents["queue_gate.svg"], encoding="utf-8")
    assert stale_diagrams(files, out) == ["gate.svg"]
    write_diagrams(files, out)
    assert not (out / "gate.svg").exists()


def test_failing_dot_is_reported(specs: dict[str, MachineSpec], fake_dot: Path) -> None:
    fake_dot.write_text(f"#!{sys.executable}\nimport sys\nsys.exit('syntax error')\n")
    with pytest.raises(DiagramError, match="syntax error"):
        diagram_files(specs, REGISTRIES, svg=True)


needs_graphviz = pytest.mark.skipif(
    shutil.which("dot") is None,
    reason="needs the Graphviz 'dot' program, which is not on PATH here; only --svg uses it",
)


@needs_graphviz
def test_real_graphviz_lays_out_the_machines(specs: dict[str, MachineSpec]) -> None:
    files = diagram_files(specs, REGISTRIES, svg=True)
    for spec in specs.values():
        svg = files.contents[f"{spec.name}.svg"]
        assert "Generated by graphviz" not in svg
        assert svg.index("<!-- generated by stovepipe-fsm diagram") < svg.index("<svg")
        for state in spec.states:
            assert f"<title>{state.name}</title>" in svg
    assert diagram_files(specs, REGISTRIES, svg=True) == files


# --- the diagram command --------------------------------------------------------------


def diagram(
    capsys: pytest.CaptureFixture[str], out: Path, *args: str, machines: Path = MACHINES
) -> tuple[int, str, str]:
    code = main(["diagram", "--machines", str(machines), "--out", str(out), *args])
    stdout, stderr = capsys.readouterr()
    return code, stdout, stderr


@pytest.mark.parametrize("graphviz", ["dot on PATH", "no dot"])
def test_check_of_the_committed_diagrams_passes_with_or_without_dot(
    graphviz: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``make test`` runs: it must not depend on whether Graphviz is installed."""
    fake = None
    if graphviz == "dot on PATH":
        fake = request.getfixturevalue("fake_dot")
    else:
        request.getfixturevalue("no_dot")
    code, out, err = diagram(capsys, COMMITTED, "--check", machines=SHIPPED)
    assert (code, out) == (0, "")
    assert err.strip() == f"diagrams in {COMMITTED} are up to date"
    assert fake is None or dot_runs(fake) == 0


def test_diagram_writes_then_check_finds_a_hand_edit(
    tmp_path: Path, no_dot: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert diagram(capsys, out, "--check")[0] == 1  # nothing written yet
    code, stdout, _ = diagram(capsys, out)
    assert code == 0
    assert stdout.splitlines() == [f"wrote {out / name}" for name in COMMAND_NAMES]
    assert diagram(capsys, out, "--check")[0] == 0
    with (out / "request.md").open("a", encoding="utf-8") as handle:
        handle.write("hand edit\n")
    code, stdout, stderr = diagram(capsys, out, "--check")
    assert (code, stdout) == (1, "")
    assert stderr.splitlines() == [f"{out / 'request.md'}: stale; run `stovepipe-fsm diagram`"]


@pytest.mark.parametrize("check", [[], ["--check"]])
def test_svg_without_dot_is_a_usage_error_naming_dot(
    check: list[str], tmp_path: Path, no_dot: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code, stdout, stderr = diagram(capsys, out, "--svg", *check)
    assert (code, stdout) == (2, "")
    assert stderr.splitlines() == [
        "stovepipe-fsm diagram: SVG output needs the Graphviz 'dot' program, which is not on "
        "PATH; install Graphviz, or leave out --svg (Markdown and DOT need no program)"
    ]
    assert not out.exists()


def test_svg_is_written_and_checked_only_with_the_flag(
    tmp_path: Path, fake_dot: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert diagram(capsys, out)[0] == 0
    assert sorted(p.name for p in out.iterdir()) == COMMAND_NAMES
    code, _, stderr = diagram(capsys, out, "--check", "--svg")
    assert code == 1
    assert stderr.splitlines() == [
        f"{out / name}: stale; run `stovepipe-fsm diagram --svg`" for name in SVG_NAMES
    ]
    code, stdout, _ = diagram(capsys, out, "--svg")
    assert code == 0
    assert stdout.splitlines() == [f"wrote {out / name}" for name in SVG_NAMES]
    assert diagram(capsys, out, "--check", "--svg")[0] == 0
    runs = dot_runs(fake_dot)
    assert diagram(capsys, out, "--check")[0] == 0
    assert diagram(capsys, out) == (0, "", f"diagrams in {out} are up to date\n")
    assert dot_runs(fake_dot) == runs  # the runs without --svg never called dot
    assert sorted(p.name for p in out.iterdir()) == sorted([*COMMAND_NAMES, *SVG_NAMES])


def test_output_path_that_is_a_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "diagrams"
    out.write_text("not a directory\n", encoding="utf-8")
    code, stdout, stderr = diagram(capsys, out)
    assert (code, stdout) == (2, "")
    assert stderr.startswith(f"{out}: cannot write diagrams: ")
    assert "Traceback" not in stderr


@needs_graphviz
def test_real_graphviz_through_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code, stdout, _ = diagram(capsys, out, "--svg")
    assert code == 0
    assert sorted(stdout.splitlines()) == [
        f"wrote {out / name}" for name in sorted([*COMMAND_NAMES, *SVG_NAMES])
    ]
    assert diagram(capsys, out, "--check", "--svg")[0] == 0
    assert diagram(capsys, out, "--check")[0] == 0
    # the committed diagrams carry no SVG, and the default check does not ask for one
    assert diagram(capsys, COMMITTED, "--check", machines=SHIPPED)[0] == 0
    assert diagram(capsys, COMMITTED, "--check", "--svg", machines=SHIPPED)[0] == 1


# --- escaping -------------------------------------------------------------------------

NASTY = (
    'a: b; c #quot; #59; "q" `code` <br/> x > y 50% %%{init: {"theme":"dark"}}%% '
    "--> end\nnext\tline"
)


def test_mermaid_text_neutralises_syntax_characters() -> None:
    safe = mermaid_text(NASTY)
    for char in (":", ";", '"', "`", "<", ">", "\n", "\t"):
        assert char not in safe, char
    assert "%%" not in safe
    assert re.search(r"#\w+;", safe) is None  # no entity code survives
    assert "  " not in safe and safe == safe.strip()
    assert safe.startswith("a - b, c #quot, #59, 'q' 'code' ")
    assert "50%" in safe and safe.endswith("end next line")
    assert mermaid_text("plain words, (parens) [brackets] & co") == (
        "plain words, (parens) [brackets] & co"
    )


def test_mermaid_diagram_with_hostile_text_and_keyword_names_stays_well_formed() -> None:
    where = Location("hostile.yaml", 1, 1)
    names = ["note", "state", "class", "end", "plain"]
    states = tuple(
        StateSpec(n, where, terminal=n == "end", holds_slot=n == "state", description=NASTY)
        for n in names
    )
    transitions = tuple(
        TransitionSpec(
            i,
            "go",
            (NameRef(a, where),),
            NameRef(b, where),
            where,
            conditions=(NameRef("style", where),),
            after=(NameRef("click", where),),
        )
        for i, (a, b) in enumerate([("note", "state"), ("state", "plain"), ("plain", "end")])
    )
    spec = MachineSpec("hostile", "lifecycle", NameRef("note", where), states, transitions, "x")
    ident = r"[a-z_][a-z0-9_]*"
    label = r"[^:;\"`<>\n]*"
    grammar = [
        r"stateDiagram-v2",
        r"classDef (slot|terminal) [a-z:#0-9,-]+",
        rf'state "{label}" as {ident}',
        rf"{ident} : {label}",
        rf"\[\*\] --> {ident}",
        rf"{ident} --> {ident} : {label}",
        rf"{ident} --> \[\*\]",
        rf"class {ident}(,{ident})* (slot|terminal)",
    ]
    lines = [line.strip() for line in mermaid_diagram(spec).splitlines()]
    for line in lines:
        assert any(re.fullmatch(g, line) for g in grammar), line
    for name in names:
        assert f'state "{name}' in "\n".join(lines)
    assert mermaid_id("note") == "_note" and mermaid_id("plain") == "plain"
    assert "_note --> _state : go [style] / click" in lines
    assert "class _state slot" in lines and "class _end terminal" in lines


def test_dot_and_markdown_escaping() -> None:
    assert dot_string('say "hi"\\n\nnext') == '"say \\"hi\\"\\\\n\\nnext"'
    assert markdown_cell("a | b\n c") == "a \\| b c"


# --- the committed diagrams -----------------------------------------------------------


def test_committed_diagrams_match_the_shipped_machines(
    shipped_specs: dict[str, MachineSpec],
) -> None:
    """CI's drift check: edit a machine, then regenerate with ``stovepipe-fsm diagram``."""
    files = diagram_files(shipped_specs, REGISTRIES)
    for name in REQUIRED_NAMES:
        committed = COMMITTED / name
        assert committed.is_file(), f"docs/diagrams/{name} is missing; run stovepipe-fsm diagram"
        assert committed.read_bytes() == files.contents[name].encode("utf-8"), (
            f"docs/diagrams/{name} is stale; run stovepipe-fsm diagram"
        )
    assert stale_diagrams(files, COMMITTED) == []

"""Reviewer diagrams of the machine files, drawn from the spec data alone.

Platform engineers change policy by editing YAML and reviewing the diagram diff, so the
diagrams are generated files under version control and CI fails when they drift from the
YAML. That only works if rendering is a pure function of the :class:`MachineSpec`, and
this module is exactly that: spec in, text out, no files, no programs run.

- nothing here touches ``transitions`` (its ``GraphMachine`` keeps growing memory in a
  long-lived process, and it would draw the compiled machine, not the file under review);
- output is byte-identical across runs: states and transitions keep their YAML order
  (it is the reading order of the table), everything else (legend rows, class members,
  output names) is sorted, and no timestamps, versions or absolute paths are written;
- a review diff stays local: each row of the transitions table is keyed by an id made
  from the transition itself (:func:`transition_ids`), never by its position, so
  inserting a transition adds one row and leaves the others alone.

Per machine ``<name>`` the texts are ``<name>.md`` (Markdown with a Mermaid
``stateDiagram-v2``, which GitHub renders, plus tables of states, transitions and the
conditions and actions used) and ``<name>.dot`` (Graphviz source). Writing them, the
drift check and the optional SVG layout by Graphviz live in
``stovepipe_fsm.apps.diagram_files``.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

from .model import FLOW, SEARCH, MachineSpec, StateSpec, TransitionSpec
from .parameters import as_json
from .registry import ConditionInfo, Registry

GENERATOR = "stovepipe-fsm diagram"
SUFFIXES = (".md", ".dot")
"""The files every machine gets: ``<name>.md`` and ``<name>.dot``."""

SLOT_MARK = "holds slot"
DOT_WRAP = 28
"""Characters per line of descriptions and long edge labels in DOT, to keep nodes and
edges narrow enough for the layout to stay readable."""
DOT_TERMINAL_WRAP = 16

_KIND_NOTES = {
    "lifecycle": "an entity's states, moved by the named triggers",
    FLOW: (
        "a decision procedure: the driver fires the one trigger leaving each state "
        "until a terminal state; actions run in the order shown"
    ),
    SEARCH: (
        "a flow run once for each build of the queue that ends; the terminal state it "
        "reaches is where the queue's culprit search stands"
    ),
}

# Words the Mermaid state-diagram lexer (case-insensitively) takes for keywords where a
# state id is expected; a state named like one is drawn under the id ``_<name>``, which no
# YAML identifier can collide with (they start with a letter). The display name is set
# separately, so the prefix never shows.
_MERMAID_KEYWORDS = frozenset(
    {"as", "class", "classdef", "click", "default", "href", "note", "scale", "state", "style"}
    | {"accdescr", "acctitle", "direction", "end", "hide_empty_description"}
)

# Characters Mermaid reads as syntax inside a label: ':' and ';' end a transition or
# description label, '"' ends a state's display string, '<' '>' are HTML, '`' starts a
# markdown string, and '%%' (anywhere in the text) opens a comment or an init directive.
# Each becomes a plain look-alike rather than a Mermaid entity code: Mermaid 11 prints
# entity codes in state labels verbatim. '#' stays: it is special only as the start of
# an entity code ``#name;``, which cannot survive once ';' is replaced.
_MERMAID_REPLACEMENTS = {
    ":": " -",
    ";": ",",
    '"': "'",
    "`": "'",
    "<": "\u2039",  # SINGLE LEFT-POINTING ANGLE QUOTATION MARK
    ">": "\u203a",  # SINGLE RIGHT-POINTING ANGLE QUOTATION MARK
}
_MERMAID_UNSAFE = re.compile("|".join(re.escape(c) for c in _MERMAID_REPLACEMENTS) + "|%%+")


# --- text helpers ---------------------------------------------------------------------


def mermaid_text(text: str) -> str:
    """Make free text (a description) safe inside a Mermaid label, on one line.

    Whitespace runs, newlines included, collapse to one space: a newline would end the
    Mermaid statement. A run of ``%`` becomes a single one, which Mermaid prints as is.
    See ``_MERMAID_REPLACEMENTS`` for what each other character becomes.
    """
    replaced = _MERMAID_UNSAFE.sub(lambda m: _MERMAID_REPLACEMENTS.get(m.group(0), "%"), text)
    return " ".join(replaced.split())


def markdown_cell(text: str) -> str:
    """Make text safe in one Markdown table cell: one line, ``|`` escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def dot_string(text: str) -> str:
    """Quote text as a DOT string; newlines become DOT's centred line break ``\\n``."""
    lines = [line.replace("\\", "\\\\").replace('"', '\\"') for line in text.split("\n")]
    return '"' + "\\n".join(lines) + '"'


def header_line(spec: MachineSpec) -> str:
    """The do-not-edit line; names the file by its base name only, never a local path."""
    return f"generated by {GENERATOR} from machines/{Path(spec.file).name}; do not edit"


def edge_label(t: TransitionSpec) -> str:
    """``trigger [cond, !unless] / action, action``, leaving out empty parts.

    The trigger is shown for flows too: it is the name a reviewer finds in the YAML.
    """
    label = t.trigger
    guards = [c.name for c in t.conditions] + [f"!{u.name}" for u in t.unless]
    if guards:
        label += f" [{', '.join(guards)}]"
    if t.actions:
        label += " / " + ", ".join(a.name for a in t.actions)
    return label


def state_marks(spec: MachineSpec, state: StateSpec) -> list[str]:
    marks = []
    if state.name == spec.initial.name:
        marks.append("initial")
    if state.holds_slot:
        marks.append(SLOT_MARK)
    if state.terminal:
        marks.append("terminal")
    return marks


def _display_name(state: StateSpec) -> str:
    return f"{state.name} ({SLOT_MARK})" if state.holds_slot else state.name


def _edges(spec: MachineSpec) -> Iterable[tuple[str, TransitionSpec]]:
    """One edge per (source, transition), in YAML order."""
    for t in spec.transitions:
        for source in t.source_names:
            yield source, t


# --- Mermaid --------------------------------------------------------------------------


def mermaid_id(name: str) -> str:
    """The id a state is drawn under: its name, unless Mermaid would read a keyword."""
    return f"_{name}" if name in _MERMAID_KEYWORDS else name


def mermaid_diagram(spec: MachineSpec) -> str:
    """The ``stateDiagram-v2`` source (without the Markdown fence).

    Every state is declared as ``state "<display>" as <id>`` followed by
    ``<id> : <description>``: Mermaid then draws the display name as a title above the
    description. A description alone would replace the state's name in the box.
    """
    lines = [
        "stateDiagram-v2",
        "    classDef slot fill:#ffe8a3,stroke:#b8860b,stroke-width:2px",
        "    classDef terminal font-weight:bold,stroke-width:3px",
    ]
    for state in spec.states:
        sid = mermaid_id(state.name)
        lines.append(f'    state "{mermaid_text(_display_name(state))}" as {sid}')
        description = mermaid_text(state.description)
        if description:
            lines.append(f"    {sid} : {description}")
    lines.append(f"    [*] --> {mermaid_id(spec.initial.name)}")
    for source, t in _edges(spec):
        label = mermaid_text(edge_label(t))
        lines.append(f"    {mermaid_id(source)} --> {mermaid_id(t.dest.name)} : {label}")
    for state in spec.states:
        if state.terminal:
            lines.append(f"    {mermaid_id(state.name)} --> [*]")
    for cls, members in (("slot", spec.slot_states), ("terminal", spec.terminal_states)):
        if members:
            lines.append(f"    class {','.join(mermaid_id(m) for m in sorted(members))} {cls}")
    return "\n".join(lines)


def render_mermaid(spec: MachineSpec, registry: Registry | None = None) -> str:
    """A Markdown page for reviewers: the Mermaid diagram and what every name means.

    ``registry`` supplies the one-line doc of each condition and action in the legend;
    without it the legend still lists every name and where it is used.
    """
    out = [f"<!-- {header_line(spec)} -->", f"# `{spec.name}` state machine", ""]
    if spec.description:
        out += [" ".join(spec.description.split()), ""]
    out += [
        _reading_guide(spec),
        "",
        "```mermaid",
        mermaid_diagram(spec),
        "```",
        "",
        *_states_table(spec),
        "",
        *_transitions_table(spec),
        "",
        *_legend_table(spec, registry),
        *_parameters_table(spec),
        *_roles_table(spec),
    ]
    return "\n".join(out) + "\n"


def _parameters_table(spec: MachineSpec) -> list[str]:
    """The machine's declared parameters: the reference of what config may set."""
    if not spec.parameters:
        return []
    rows = [
        "",
        "## Parameters",
        "",
        "Set per queue and per glob in `config/queues.yaml`.",
        "",
        "| Parameter | Type | Bounds | Default | Description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p in spec.parameters:
        schema = p.value_schema()
        bounds = ", ".join(
            f"{key} {json.dumps(value, sort_keys=True)}"
            for key, value in sorted(schema.items())
            if key != "type"
        )
        rows.append(
            f"| `{p.name}` | {schema.get('type', '')} | {markdown_cell(bounds) or '-'} | "
            f"`{json.dumps(as_json(p.default))}` | {markdown_cell(p.description)} |"
        )
    return rows


def _roles_table(spec: MachineSpec) -> list[str]:
    """Which trigger plays each role the runtime relies on, and the build outcomes."""
    if not spec.roles and not spec.outcomes:
        return []
    rows = ["", "## Roles and outcomes", "", "| Role | Trigger | Note |", "| --- | --- | --- |"]
    rows += [f"| {r.role} | `{r.trigger.name}` | |" for r in spec.roles]
    for o in spec.outcomes:
        note = "green: advances last green" if o.green else ""
        rows.append(f"| outcome `{o.name}` | `{o.trigger.name}` | {note} |")
    return rows


def _reading_guide(spec: MachineSpec) -> str:
    kind_note = _KIND_NOTES.get(spec.kind, spec.kind)
    guide = (
        f"Kind: `{spec.kind}` ({kind_note}). Initial state: `{spec.initial.name}`. "
        "Edge labels read `trigger [condition, !unless] / action, ...`; bold states are "
        "terminal"
    )
    if spec.slot_states:
        guide += f"; filled states marked ({SLOT_MARK}) hold one of the queue's build slots"
    return guide + "."


def _code(names: Iterable[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _states_table(spec: MachineSpec) -> list[str]:
    rows = ["## States", "", "| State | Marks | Description |", "| --- | --- | --- |"]
    for state in spec.states:
        marks = ", ".join(state_marks(spec, state))
        rows.append(f"| `{state.name}` | {marks} | {markdown_cell(state.description)} |")
    return rows


def transition_ids(spec: MachineSpec) -> list[str]:
    """A row id per transition, in YAML order, made from the transition's own data.

    The id is ``trigger:sources->dest`` (``fail_closed:accepted,processing->failed``;
    a ``'*'`` source stays ``*``, so adding a state leaves it alone). Names are
    ``[a-z][a-z0-9_]*``, so the punctuation cannot be mistaken for part of a name. Ids
    that repeat (one trigger, same sources and dest, told apart by conditions) are
    numbered in YAML order: the first keeps the plain id, the next ones get ``#2``,
    ``#3``... Inserting a transition thus changes no other row's id, unless it repeats
    the id of a transition written after it.
    """
    seen: Counter[str] = Counter()
    ids = []
    for t in spec.transitions:
        sources = "*" if t.wildcard_source else ",".join(t.source_names)
        base = f"{t.trigger}:{sources}->{t.dest.name}"
        seen[base] += 1
        ids.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return ids


def _transitions_table(spec: MachineSpec) -> list[str]:
    """One row per YAML transition; a ``Slot`` column when the machine declares slots.

    Rows are keyed by :func:`transition_ids`, not numbered, so a review diff of an
    inserted, removed or edited transition shows that row only.

    Slot effects are never written per transition (they follow from ``holds_slot`` and
    ``terminal``), so the table spells them out where a reviewer would look for them.
    """
    slots = bool(spec.slot_states)
    head = "| Id | Trigger | From | To | Conditions | Actions |" + (" Slot |" if slots else "")
    rows = ["## Transitions", "", head + " Description |", "| --- " * (head.count("|")) + "|"]
    for t, row_id in zip(spec.transitions, transition_ids(spec), strict=True):
        source = "`*` (every state)" if t.wildcard_source else _code(t.source_names)
        guards = [f"`{c.name}`" for c in t.conditions] + [f"not `{u.name}`" for u in t.unless]
        row = (
            f"| `{row_id}` | `{t.trigger}` | {source} | `{t.dest.name}` | "
            f"{', '.join(guards)} | {_code(a.name for a in t.actions)} |"
        )
        if slots:
            row += f" {_slot_effect(spec, t)} |"
        rows.append(f"{row} {markdown_cell(t.description)} |")
    return rows


def _slot_effect(spec: MachineSpec, t: TransitionSpec) -> str:
    """The slot effect the compiler derives for this transition (see ``compiler.Step``)."""
    dest = t.dest.name
    if dest in spec.terminal_states:
        return "releases its slot, if held"
    if dest in spec.slot_states and any(s not in spec.slot_states for s in t.source_names):
        return "takes a slot"
    return ""


def _used_names(spec: MachineSpec) -> tuple[dict[str, dict[str, None]], dict[str, dict[str, None]]]:
    """Condition and action names, each with the triggers that use it (YAML order)."""
    conditions: dict[str, dict[str, None]] = {}
    actions: dict[str, dict[str, None]] = {}
    for t in spec.transitions:
        for ref in t.conditions + t.unless:
            conditions.setdefault(ref.name, {})[t.trigger] = None
        for ref in t.actions:
            actions.setdefault(ref.name, {})[t.trigger] = None
    return conditions, actions


def _legend_table(spec: MachineSpec, registry: Registry | None) -> list[str]:
    conditions, actions = _used_names(spec)
    rows = ["## Conditions and actions", ""]
    if not conditions and not actions:
        return [*rows, "No transition of this machine names a condition or an action."]
    rows += ["| Name | Kind | Used by | What it does | Facts |", "| --- | --- | --- | --- | --- |"]
    for name in sorted(conditions):
        kind, doc, facts = _name_info(registry, name, "condition")
        rows.append(f"| `{name}` | {kind} | {_code(conditions[name])} | {doc} | {facts} |")
    for name in sorted(actions):
        kind, doc, facts = _name_info(registry, name, "action")
        rows.append(f"| `{name}` | {kind} | {_code(actions[name])} | {doc} | {facts} |")
    return rows


def _name_info(registry: Registry | None, name: str, kind: str) -> tuple[str, str, str]:
    """A legend row's kind, doc and facts for the condition or action ``name``."""
    if registry is None:
        return kind, "", ""
    info = (registry.conditions if kind == "condition" else registry.actions).get(name)
    if info is None:
        return kind, "(not registered)", ""
    if isinstance(info, ConditionInfo):
        facts = _facts(
            ("provides when true", info.provides), ("provides when false", info.provides_unless)
        )
    else:
        kind = "action, finishes the delivery" if info.finishes else kind
        facts = _facts(("requires", info.requires), ("provides", info.provides))
    if info.origin:  # a plugin's names say where they come from
        kind += f" (plugin `{markdown_cell(info.origin)}`)"
    return kind, markdown_cell(info.doc), facts


def _facts(*groups: tuple[str, frozenset[str]]) -> str:
    return "; ".join(f"{label} {_code(sorted(names))}" for label, names in groups if names)


# --- Graphviz -------------------------------------------------------------------------


def render_dot(spec: MachineSpec) -> str:
    """Graphviz DOT source with the same content as the Mermaid diagram.

    Terminal states are bold double circles, slot-holding states are filled; each state
    shows its name and its (wrapped) description, each edge the same label as Mermaid.
    """
    title = spec.name
    if spec.description:
        title += "\n" + _wrap(spec.description, 72)
    out = [
        f"// {header_line(spec)}",
        f"digraph {dot_string(spec.name)} {{",
        f"  graph [label={dot_string(title)}, labelloc=t, fontname=Helvetica];",
        "  node [shape=box, style=rounded, fontname=Helvetica, fontsize=11];",
        "  edge [fontname=Helvetica, fontsize=9];",
        '  "__start__" [shape=point, width=0.15, label=""];',
    ]
    for state in spec.states:
        out.append(f"  {dot_string(state.name)} [{_dot_state_attrs(state)}];")
    out.append(f'  "__start__" -> {dot_string(spec.initial.name)};')
    for source, t in _edges(spec):
        out.append(
            f"  {dot_string(source)} -> {dot_string(t.dest.name)} "
            f"[label={dot_string(_dot_edge_label(t))}];"
        )
    out.append("}")
    return "\n".join(out) + "\n"


def _wrap(text: str, width: int) -> str:
    """Wrap at spaces only: a name like ``gate_wait_delay_ms`` must stay whole."""
    return textwrap.fill(
        " ".join(text.split()), width, break_long_words=False, break_on_hyphens=False
    )


def _dot_edge_label(t: TransitionSpec) -> str:
    """The Mermaid edge label, broken before the guard and the actions when long."""
    label = edge_label(t)
    if len(label) <= DOT_WRAP:
        return label
    head, _, actions = label.partition(" / ")
    trigger, _, guards = head.partition(" [")
    lines = [trigger]
    if guards:
        lines.append(_wrap("[" + guards, DOT_WRAP))
    if actions:
        lines.append(_wrap("/ " + actions, DOT_WRAP))
    return "\n".join(lines)


def _dot_state_attrs(state: StateSpec) -> str:
    """Name over description; terminal states are bold double circles.

    A circle grows with the width of its label, so a terminal state's description is
    wrapped narrower (Graphviz ``xlabel`` would keep the circle small but places the
    text next to whichever node has room, which reads as the wrong state's).
    """
    width = DOT_TERMINAL_WRAP if state.terminal else DOT_WRAP
    label = _display_name(state)
    description = _wrap(state.description, width)
    if description:
        label += "\n" + description
    attrs = [f"label={dot_string(label)}"]
    if state.terminal:
        attrs += ["shape=doublecircle", "style=bold", "margin=0"]
    if state.holds_slot:
        attrs += ['style="rounded,filled"', 'fillcolor="#ffe8a3"', 'color="#b8860b"']
    return ", ".join(attrs)


# --- all texts ------------------------------------------------------------------------


def render_diagrams(
    specs: Mapping[str, MachineSpec], registries: Mapping[str, Registry] | None
) -> dict[str, str]:
    """Every diagram text for ``specs``: file name (``<machine>.md``, ``.dot``) → content.

    Keys are sorted by machine name, so the result does not depend on the order of
    ``specs``.
    """
    outputs: dict[str, str] = {}
    for spec in sorted(specs.values(), key=lambda s: s.name):
        registry = registries.get(spec.name) if registries is not None else None
        outputs[f"{spec.name}.md"] = render_mermaid(spec, registry)
        outputs[f"{spec.name}.dot"] = render_dot(spec)
    return outputs

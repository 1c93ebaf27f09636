"""Semantic lint: one broken machine per rule, each reported at the line to edit.

Most cases are copies of the tests' own machines (``tests/fixtures/machines``, which
began as the shipped ones) with one realistic edit (the kind of change a reviewer would
make in a pull request), so the tests also prove lint catches mistakes in real tables,
not only in toy ones. A test parses the rule list out of ``machine/lint.py``'s docstring so
a new rule without a case here fails the suite. The messages docs/machines.md quotes
are checked against the same edits of the shipped machines, whose lines it cites.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixture_policy import GATE_YAML, MACHINES, REQUEST_YAML

from stovepipe_fsm.located.errors import SpecError, SpecIssue
from stovepipe_fsm.located.yaml_source import parse_yaml
from stovepipe_fsm.machine import lint as lint_module
from stovepipe_fsm.machine.lint import lint_machine
from stovepipe_fsm.machine.loader import load_machine, parse_machine
from stovepipe_fsm.machine.registry import Registry
from stovepipe_fsm.process.catalog import REGISTRIES, load_process_machines

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "machines"
REQUEST = REQUEST_YAML.read_text(encoding="utf-8")
GATE = GATE_YAML.read_text(encoding="utf-8")
NAME = "m.yaml"


def edit(text: str, old: str, new: str) -> str:
    """Replace exactly one occurrence, so a drifting fixture fails loudly."""
    assert text.count(old) == 1, f"expected exactly one {old!r}"
    return text.replace(old, new)


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based line of the ``nth`` line containing ``needle``."""
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) >= nth, f"{needle!r} occurs on {len(hits)} line(s)"
    return hits[nth - 1]


def column_of(text: str, line: int, needle: str) -> int:
    return text.splitlines()[line - 1].index(needle) + 1


def lint_text(text: str, registries: dict[str, Registry] | None = REGISTRIES) -> list[SpecIssue]:
    return lint_machine(parse_machine(parse_yaml(text, NAME)), registries)


def by_rule(issues: list[SpecIssue], rule: str) -> list[SpecIssue]:
    return [i for i in issues if i.rule == rule]


# --- a toy registry for shapes the shipped tables do not have ------------------------

TOY = Registry("toy")


@TOY.condition()
def ready(ctx: object) -> bool:
    """Always true; lint never calls it."""
    return True


@TOY.condition()
def late(ctx: object) -> bool:
    """Always false; lint never calls it."""
    return False


@TOY.condition(provides=["fresh"])
def cached(ctx: object) -> bool:
    """Establishes 'fresh' when true."""
    return True


@TOY.action(provides=["fresh"])
def fetch(ctx: object) -> None:
    """Establishes 'fresh'."""


@TOY.action(requires=["fresh"])
def send(ctx: object) -> None:
    """Needs 'fresh' on every path."""


@TOY.action(finishes=True)
def done(ctx: object) -> None:
    """Settles the flow."""


TOYS = {"toy": TOY}

TOY_LIFECYCLE = """\
name: toy
initial: open
states:
  - open
  - name: busy
    holds_slot: true
  - name: closed
    terminal: true
transitions:
  - {trigger: start, source: open, dest: busy}
  - {trigger: stop, source: [open, busy], dest: closed}
"""

TOY_FLOW = """\
name: toy
kind: flow
initial: begin
states:
  - begin
  - middle
  - name: end
    terminal: true
transitions:
  - {trigger: step, source: begin, dest: middle, conditions: ready}
  - {trigger: step, source: begin, dest: middle, unless: ready, after: fetch}
  - {trigger: finish, source: middle, dest: end, after: [send, done]}
"""


def test_toy_machines_are_clean() -> None:
    # Baselines: each broken variant below differs from these by one edit.
    assert lint_text(TOY_LIFECYCLE, TOYS) == []
    flow = edit(TOY_FLOW, "conditions: ready}", "conditions: ready, after: fetch}")
    assert lint_text(flow, TOYS) == []


# --- the machines the cases edit, and the shipped ones --------------------------------


@pytest.mark.parametrize("directory", [MACHINES, SHIPPED], ids=["fixture", "shipped"])
@pytest.mark.parametrize("filename", ["request.yaml", "queue_gate.yaml"])
def test_machines_lint_clean_against_the_registries(directory: Path, filename: str) -> None:
    spec = load_machine(directory / filename, lint=False)
    assert lint_machine(spec, REGISTRIES) == []
    assert lint_machine(spec, None) == []


@pytest.mark.parametrize("directory", [MACHINES, SHIPPED], ids=["fixture", "shipped"])
def test_machines_load_and_compile(directory: Path) -> None:
    machines = load_process_machines(directory)
    assert machines.request.spec.name == "request"
    assert machines.queue_gate.spec.name == "queue_gate"


# --- one case per rule ---------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A broken machine, the rule it must trigger, where, and a phrase of the message."""

    id: str
    rule: str
    text: str
    line: int
    fragment: str
    registries: dict[str, Registry] | None = None
    column: int | None = None
    also: frozenset[str] = frozenset()  # rules the same edit rightly triggers as well


def _cases(request: str, gate: str) -> list[Case]:
    """One case per rule, built on ``request`` and ``gate`` (the texts of the two machines)."""
    cases: list[Case] = []

    def add(
        id: str,
        rule: str,
        text: str,
        line: int,
        fragment: str,
        registries: dict[str, Registry] | None = REGISTRIES,
        column: int | None = None,
        also: frozenset[str] = frozenset(),
    ) -> None:
        cases.append(Case(id, rule, text, line, fragment, registries, column, also))

    text = edit(request, "  - name: cancelled\n", "  - name: accepted\n  - name: cancelled\n")
    add(
        "duplicate-state",
        "duplicate-state",
        text,
        line_of(text, "- name: accepted", 2),
        f"state 'accepted' is declared twice (first at line {line_of(text, '- name: accepted')})",
    )

    cancel = "    source: processing\n    dest: cancelled\n"
    text = edit(request, cancel, cancel.replace("cancelled", "canceled"))
    add(
        "undeclared-dest",
        "undeclared-state",
        text,
        line_of(text, "dest: canceled"),
        "state 'canceled' is not declared; declared states: accepted, processing,",
        column=len("    dest: ") + 1,
    )
    text = edit(request, "initial: accepted\n", "initial: ingested\n")
    add(
        "undeclared-initial",
        "undeclared-state",
        text,
        line_of(text, "initial: ingested"),
        "state 'ingested' is not declared",
    )

    text = edit(request, "name: request\n", "name: requests\n")
    add(
        "unknown-machine",
        "unknown-machine",
        text,
        line_of(text, "name: requests"),
        "no Python registry serves machine 'requests'; known machines: culprit, queue_gate, "
        "request",
    )

    text = edit(
        gate,
        "    dest: loaded\n    after: load_request\n",
        "    dest: loaded\n    after: load_requests\n",
    )
    add(
        "unregistered-action",
        "unregistered",
        text,
        line_of(text, "after: load_requests"),
        "no action named 'load_requests' is registered for machine 'queue_gate'; "
        "registered actions: ack, announce,",
        column=len("    after: ") + 1,
    )
    text = edit(gate, "    conditions: gate_closed\n", "    conditions: gate_shut\n")
    add(
        "unregistered-condition",
        "unregistered",
        text,
        line_of(text, "conditions: gate_shut"),
        "no condition named 'gate_shut' is registered for machine 'queue_gate'",
        # 'gate_shut' and 'unless: gate_closed' no longer exclude each other.
        also=frozenset({"nondeterministic", "flow-exhaustive"}),
    )

    text = edit(
        request,
        "  - trigger: fail_closed\n    source: [accepted, processing]\n    dest: failed\n"
        "    description: dead-letter reconciler forces a conservative outcome\n",
        "",
    )
    add(
        "role-trigger-dropped",
        "role-shape",
        text,
        line_of(text, "dead_letter: fail_closed"),
        "role 'dead_letter' names trigger 'fail_closed', which no transition declares; "
        "declared triggers: admit, supersede, succeed, fail, cancel",
        column=column_of(text, line_of(text, "dead_letter: fail_closed"), "fail_closed"),
    )
    text = edit(request, "  dead_letter: fail_closed", "  # dead_letter: fail_closed")
    add(
        "missing-role",
        "missing-role",
        text,
        line_of(text, "roles:"),
        "machine 'request' must declare role 'dead_letter' under 'roles:' (the dead-letter "
        "reconciler fires it to end a request whose delivery gave up): name the trigger that "
        "plays it",
    )
    text = edit(request, "  dead_letter: fail_closed", "  dead_letter: fail_closed\n  retry: admit")
    add(
        "unknown-role",
        "unknown-role",
        text,
        line_of(text, "  retry: admit"),
        "role 'retry' is not one the code of machine 'request' uses; its roles: admit, "
        "dead_letter, preempt, skip, supersede, withdraw",
        column=3,
    )
    text = edit(request, "  supersede: supersede ", "  supersede: succeed ")
    add(
        "role-from-initial",
        "role-shape",
        text,
        line_of(text, "supersede: succeed"),
        "role 'supersede': trigger 'succeed' must leave the initial state 'accepted' "
        "(process fires it on a head a newer one made stale)",
        column=column_of(text, line_of(text, "supersede: succeed"), "succeed"),
    )
    text = edit(
        request, "  cancelled: {trigger: cancel}", "  cancelled: {trigger: cancel, green: true}"
    )
    add(
        "two-green-outcomes",
        "role-shape",
        text,
        line_of(text, "cancelled: {trigger: cancel, green"),
        "outcome 'cancelled' is green, but so is 'succeeded'; exactly one outcome advances "
        "last green",
        column=3,
    )

    text = edit(gate, "    default: 1\n", "    default: 0\n")
    add(
        "parameter-default",
        "parameter-default",
        text,
        line_of(text, "    default: 0"),
        "default of parameter 'max_concurrent' does not fit its declaration: 0 is less than "
        "the minimum of 1",
        column=column_of(text, line_of(text, "    default: 0"), "0"),
    )
    gate_wait = gate[gate.index("  gate_wait_delay_ms:\n") : gate.index("states:\n")]
    text = edit(gate, gate_wait, "")
    add(
        "undeclared-parameter",
        "undeclared-parameter",
        text,
        line_of(text, "after: hold"),
        "'hold' reads parameter 'gate_wait_delay_ms', which machine 'queue_gate' does not "
        "declare; declared parameters: max_concurrent",
        column=column_of(text, line_of(text, "after: hold"), "hold"),
    )

    text = edit(request, "kind: lifecycle\n", "kind: flow\n")
    add(
        "wrong-kind",
        "wrong-kind",
        text,
        line_of(text, "kind: flow"),
        "machine 'request' must be kind 'lifecycle', not 'flow': the process stage drives it "
        "that way",
        column=len("kind: ") + 1,
    )

    text = TOY_LIFECYCLE + "  - {trigger: stop, source: limbo, dest: closed}\n"
    text = edit(text, "  - open\n", "  - open\n  - limbo\n")
    add(
        "unreachable",
        "unreachable",
        text,
        line_of(text, "- limbo"),
        "state 'limbo' is unreachable from initial state 'open'",
        TOYS,
    )

    text = edit(TOY_LIFECYCLE, "source: [open, busy], dest: closed}", "source: open, dest: closed}")
    add(
        "dead-end",
        "dead-end",
        text,
        line_of(text, "- name: busy"),
        "non-terminal state 'busy' has no way out; add a transition or mark it terminal",
        TOYS,
    )

    text = TOY_LIFECYCLE + "  - {trigger: reopen, source: closed, dest: open}\n"
    add(
        "terminal-exit-listed",
        "terminal-exit",
        text,
        line_of(text, "trigger: reopen"),
        "terminal state 'closed' has an outgoing transition (trigger 'reopen')",
        TOYS,
        column=column_of(text, line_of(text, "trigger: reopen"), "closed"),
    )
    text = edit(request, "    source: [accepted, processing]\n", "    source: '*'\n")
    add(
        "terminal-exit-wildcard",
        "terminal-exit",
        text,
        line_of(text, "source: '*'"),
        "source '*' includes terminal state 'cancelled'; list sources (trigger 'fail_closed')",
        column=len("    source: ") + 1,
    )

    # The shipped gate tests skip_paths first; a gate without it holds right away.
    skip_first = "    unless: only_skip_paths_changed\n"
    closed, excluded = (
        (skip_first, "[only_skip_paths_changed, gate_closed]")
        if "    conditions: gate_closed\n" + skip_first in gate
        else ("", "gate_closed")
    )
    text = edit(
        gate,
        "    conditions: gate_closed\n" + closed + "    after: hold\n",
        f"    conditions: gate_closed\n    unless: {excluded}\n    after: hold\n",
    )
    add(
        "never-fires",
        "never-fires",
        text,
        line_of(text, "trigger: gate", 1),
        "condition 'gate_closed' is both required and excluded; this transition can never fire",
        also=frozenset({"flow-exhaustive"}),  # nothing leaves 'latest' when the gate is closed
    )

    text = edit(gate, "    unless: slot_conflict\n", "")
    add(
        "nondeterministic",
        "nondeterministic",
        text,
        line_of(text, "trigger: admit", 2),
        f"this transition and the one at line {line_of(text, 'trigger: admit')} both fire "
        "on trigger 'admit' from state 'slot_claimed' when slot_conflict=true",
        also=frozenset({"persist-before-publish"}),  # nothing proves the slot was won
    )

    text = edit(
        request,
        "  - name: cancelled\n    terminal: true\n",
        "  - name: cancelled\n    terminal: true\n    holds_slot: true\n",
    )
    add(
        "slot-terminal",
        "slot-terminal",
        text,
        line_of(text, "- name: cancelled"),
        "terminal state 'cancelled' is declared slot-holding",
    )

    text = edit(
        gate,
        "    after: [publish_build, ack]\n",
        "    after: [publish_build, ack]\n"
        "  - trigger: ack_only\n    source: reannounced\n    dest: acked\n    after: ack\n",
    )
    add(
        "flow-trigger",
        "flow-trigger",
        text,
        line_of(text, "- name: reannounced"),
        "flow state 'reannounced' leaves on several triggers (ack_only, republish); "
        "a flow step needs exactly one",
    )

    # The shipped gate also holds on a lag bound before it derives the strategy.
    admit_from_latest = "    unless: gate_closed\n"
    also_false = ""
    also_after = ""
    if admit_from_latest not in gate:
        admit_from_latest = (
            "    unless: [only_skip_paths_changed, gate_closed, baseline_lag_exceeded]\n"
        )
        also_false = "baseline_lag_exceeded=false, "
        also_after = "only_skip_paths_changed=false, "
    text = edit(
        gate,
        admit_from_latest,
        "    conditions: request_is_processing\n" + admit_from_latest,
    )
    add(
        "flow-exhaustive",
        "flow-exhaustive",
        text,
        line_of(text, "- name: latest"),
        f"flow state 'latest' has no transition when {also_false}gate_closed=false, "
        f"{also_after}request_is_processing=false; the delivery would stop there",
    )

    text = edit(gate, "    after: [supersede, ack]\n", "    after: supersede\n")
    add(
        "flow-finish-missing",
        "flow-finish",
        text,
        line_of(text, "trigger: coalesce", 2),
        "transition into terminal state 'acked' must end with exactly one finishing action",
    )
    text = edit(gate, "    after: [supersede, ack]\n", "    after: [ack, supersede]\n")
    add(
        "flow-finish-not-last",
        "flow-finish",
        text,
        line_of(text, "trigger: coalesce", 2),
        "must end with exactly one finishing action (ack or hold) as its last action",
    )
    text = edit(
        gate,
        "    dest: loaded\n    after: load_request\n",
        "    dest: loaded\n    after: [load_request, ack]\n",
    )
    add(
        "flow-finish-early",
        "flow-finish",
        text,
        line_of(text, "after: [load_request, ack]"),
        "action 'ack' finishes the delivery but the flow goes on to non-terminal state 'loaded'",
        column=column_of(text, line_of(text, "[load_request, ack]"), "ack]"),
    )

    text = edit(
        gate,
        "    after: [mark_processing, release_lost_claim, announce, publish_build, ack]\n",
        "    after: [publish_build, mark_processing, release_lost_claim, announce, ack]\n",
    )
    add(
        "publish-before-mark-processing",
        "persist-before-publish",
        text,
        line_of(text, "[publish_build, mark_processing"),
        "persist before publish: 'publish_build' needs 'request_processing' (established by "
        "release_lost_claim, conditions: request_is_processing), 'start_announced' (established "
        "by announce) but runs from state 'slot_claimed' on a path where they are not yet "
        "established",
        column=len("    after: [") + 1,
    )
    text = edit(
        gate,
        "    after: [mark_processing, release_lost_claim, announce, publish_build, ack]\n",
        "    after: [mark_processing, release_lost_claim, publish_build, announce, ack]\n",
    )
    add(
        "publish-before-announce",
        "persist-before-publish",
        text,
        line_of(text, "[mark_processing, release_lost_claim, publish_build"),
        "persist before publish: 'publish_build' needs 'start_announced' (established by "
        "announce) but runs from state 'slot_claimed' on a path where it is not yet "
        "established",
        column=len("    after: [mark_processing, release_lost_claim, ") + 1,
    )

    text = edit(GATE, "  - admits_latest ", "  - admit_latest  ")
    add(
        "unknown-invariant",
        "unknown-invariant",
        text,
        line_of(text, "- admit_latest "),
        "no invariant named 'admit_latest' in the catalogue; invariants: admits_latest, "
        "base_is_green_ancestor, baseline_lag_bounded, dead_letter_failed_closed, keeps_newest_n,",
        column=len("  - ") + 1,
    )
    text = edit(GATE, "  - progress ", "  - {name: progress, held_by: paused} ")
    add(
        "invariant-parameter",
        "invariant-parameter",
        text,
        line_of(text, "held_by: paused"),
        "invariant 'progress' has no parameter 'held_by'; its parameters: none",
        column=column_of(text, line_of(text, "held_by: paused"), "held_by"),
    )
    text = edit(GATE, "  - admits_latest ", "  - {name: admits_latest, queues: [' main']} ")
    add(
        "invariant-queues",
        "invariant-queues",
        text,
        line_of(text, "queues: [' main']"),
        "invariant 'admits_latest': ' main' is neither a queue name nor a pattern that can "
        "match one",
        column=column_of(text, line_of(text, "queues: [' main']"), "' main'"),
    )
    text = edit(GATE, "  - progress ", "  - max_concurrent\n  - progress ")
    add(
        "duplicate-invariant",
        "duplicate-invariant",
        text,
        line_of(text, "  - max_concurrent", 2),
        f"invariant 'max_concurrent' is declared twice (first at line "
        f"{line_of(text, '  - max_concurrent')}); declare it once",
        column=len("  - ") + 1,
    )
    text = edit(
        gate,
        "    after: [mark_processing, release_lost_claim, announce, publish_build, ack]\n",
        "    after: [announce, mark_processing, release_lost_claim, publish_build, ack]\n",
    )
    add(
        "announce-before-mark-processing",
        "persist-before-publish",
        text,
        line_of(text, "[announce, mark_processing"),
        "persist before publish: 'announce' needs 'request_processing'",
        column=len("    after: [") + 1,
    )
    # Derive and claim share one transition in the fixture; the shipped gate derives on
    # the way into ``derived`` and claims on the way out.
    paired = "    after: [derive_strategy, claim_slot]\n"
    derive = paired if paired in gate else "    after: derive_strategy\n"
    text = edit(gate, derive, "    after: [claim_slot, derive_strategy]\n")
    add(
        "claim-before-derive",
        "persist-before-publish",
        text,
        line_of(text, "[claim_slot, derive_strategy]"),
        "'claim_slot' needs 'strategy_derived' (established by derive_strategy)",
    )
    return cases


CASES = _cases(REQUEST, GATE)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_rule_fires_at_the_line_to_edit(case: Case) -> None:
    issues = lint_text(case.text, case.registries)
    hits = by_rule(issues, case.rule)
    assert hits, f"no {case.rule} issue; got {[str(i) for i in issues]}"
    assert {i.rule for i in issues} == {case.rule, *case.also}, [str(i) for i in issues]
    hit = next((i for i in hits if case.fragment in i.message), None)
    assert hit is not None, f"no message with {case.fragment!r}: {[i.message for i in hits]}"
    assert hit.location.file == NAME
    assert hit.location.line == case.line, str(hit)
    if case.column is not None:
        assert hit.location.column == case.column, str(hit)
    assert str(hit) == f"{NAME}:{hit.location.line}:{hit.location.column}: {hit.message}"


def test_every_rule_in_the_lint_docstring_has_a_case() -> None:
    documented = set(re.findall(r"^- ``([a-z-]+)``", lint_module.__doc__ or "", re.MULTILINE))
    assert len(documented) >= 15
    assert documented == {c.rule for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_loading_a_broken_machine_raises_with_the_same_issues(case: Case, tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(case.text, encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        load_machine(path, case.registries, display_name=NAME)
    expected = lint_text(case.text, case.registries)
    assert sorted(caught.value.issues, key=str) == sorted(expected, key=str)


# --- details of particular rules -----------------------------------------------------


def test_undeclared_states_stop_the_graph_rules() -> None:
    # Every reference to the misspelt state is reported once; no unreachable/dead-end noise.
    cancel = "    source: processing\n    dest: cancelled\n"
    text = edit(REQUEST, cancel, cancel.replace("cancelled", "canceled"))
    issues = lint_text(text)
    assert [i.rule for i in issues] == ["undeclared-state"]


def test_wildcard_source_reports_every_terminal_state_at_the_star() -> None:
    text = edit(REQUEST, "    source: [accepted, processing]\n", "    source: '*'\n")
    hits = by_rule(lint_text(text), "terminal-exit")
    star = line_of(text, "source: '*'")
    assert {i.location.line for i in hits} == {star}
    assert sorted(re.findall(r"terminal state '(\w+)'", " ".join(i.message for i in hits))) == [
        "cancelled",
        "failed",
        "succeeded",
        "superseded",
    ]


def test_wildcard_source_over_non_terminal_states_only_is_fine() -> None:
    text = TOY_LIFECYCLE.replace("  - name: closed\n    terminal: true\n", "  - closed\n")
    text += "  - {trigger: reset, source: '*', dest: open}\n"
    issues = lint_text(text, TOYS)
    assert by_rule(issues, "terminal-exit") == []
    assert by_rule(issues, "dead-end") == []


def test_a_half_done_trigger_rename_names_the_outcome_that_lost_its_trigger() -> None:
    text = edit(REQUEST, "  - trigger: cancel\n", "  - trigger: abort\n")
    hits = by_rule(lint_text(text), "role-shape")
    assert [(i.location.line, i.message.split(";")[0]) for i in hits] == [
        (
            line_of(text, "cancelled: {trigger: cancel}"),
            "outcome 'cancelled' names trigger 'cancel', which no transition declares",
        )
    ]


def test_unregistered_names_are_all_reported_and_suppress_persist_check() -> None:
    text = edit(
        GATE,
        "    dest: loaded\n    after: load_request\n",
        "    dest: loaded\n    after: load_requests\n",
    )
    text = text.replace(": gate_closed\n", ": gate_shut\n")
    text = edit(
        text,
        "    after: [mark_processing, release_lost_claim, announce, publish_build, ack]\n",
        "    after: [publish_build, mark_processing, release_lost_claim, announce, ack]\n",
    )
    issues = lint_text(text)
    assert [(i.rule, i.location.line) for i in issues] == [
        ("unregistered", line_of(text, "load_requests")),
        ("unregistered", line_of(text, "conditions: gate_shut")),
        ("unregistered", line_of(text, "unless: gate_shut")),
    ]


def test_without_registries_names_are_not_checked() -> None:
    text = edit(
        GATE,
        "    dest: loaded\n    after: load_request\n",
        "    dest: loaded\n    after: load_requests\n",
    )
    assert lint_text(text, None) == []


def test_nondeterministic_also_breaks_the_admit_persist_order() -> None:
    # Without 'unless: slot_conflict' nothing proves the slot was won before the write.
    text = edit(GATE, "    unless: slot_conflict\n", "")
    issues = lint_text(text)
    assert {i.rule for i in issues} == {"nondeterministic", "persist-before-publish"}
    [persist] = by_rule(issues, "persist-before-publish")
    assert "'mark_processing' needs 'slot_held' (established by unless: slot_conflict)" in (
        persist.message
    )


def test_unguarded_pair_is_nondeterministic_whatever_the_conditions() -> None:
    text = TOY_LIFECYCLE + "  - {trigger: start, source: open, dest: closed}\n"
    [hit] = by_rule(lint_text(text, TOYS), "nondeterministic")
    assert hit.location.line == len(text.splitlines())  # the added, second one
    assert "when no condition guards them" in hit.message


def test_mutually_exclusive_pair_is_deterministic() -> None:
    text = TOY_LIFECYCLE + (
        "  - {trigger: poke, source: busy, dest: open, conditions: ready}\n"
        "  - {trigger: poke, source: busy, dest: closed, unless: ready}\n"
    )
    assert lint_text(text, TOYS) == []


def test_flow_exhaustive_needs_unless_even_for_complementary_names() -> None:
    # 'ready' and 'late' mean opposite things to a reader, but lint treats conditions as
    # independent: both false leaves the delivery stuck.
    text = edit(TOY_FLOW, "unless: ready, after: fetch}", "conditions: late, after: fetch}")
    text = edit(text, "conditions: ready}", "conditions: ready, unless: late, after: fetch}")
    [hit] = by_rule(lint_text(text, TOYS), "flow-exhaustive")
    assert hit.location.line == line_of(text, "  - begin")
    assert "late=false, ready=false" in hit.message


def test_persist_check_intersects_facts_where_paths_join() -> None:
    # 'fresh' is fetched on one branch only: 'send' on the joined path is flagged...
    [hit] = by_rule(lint_text(TOY_FLOW, TOYS), "persist-before-publish")
    assert hit.location.line == line_of(TOY_FLOW, "after: [send, done]")
    assert "'send' needs 'fresh' (established by fetch, conditions: cached) but runs" in (
        hit.message
    )
    # ...a condition that establishes the fact on the other branch satisfies it...
    text = edit(TOY_FLOW, "conditions: ready}", "conditions: cached}")
    text = edit(text, "unless: ready,", "unless: cached,")
    assert lint_text(text, TOYS) == []
    # ...and so does fetching on both branches.
    text = edit(TOY_FLOW, "conditions: ready}", "conditions: ready, after: fetch}")
    assert lint_text(text, TOYS) == []


def test_persist_check_follows_loops_back_to_an_earlier_state() -> None:
    # The gate's conflict loop returns to queue_loaded; facts from the first pass must not
    # leak into the second. Dropping derive_strategy makes claim_slot unsafe on every path.
    text = edit(GATE, "    after: [derive_strategy, claim_slot]\n", "    after: claim_slot\n")
    issues = lint_text(text)
    hits = by_rule(issues, "persist-before-publish")
    assert {i.message.split(" needs ")[0] for i in hits} == {
        "persist before publish: 'claim_slot'",
        "persist before publish: 'mark_processing'",
    }


def test_issues_of_several_rules_are_reported_together() -> None:
    text = edit(
        REQUEST,
        "  - name: cancelled\n    terminal: true\n",
        "  - name: cancelled\n    terminal: true\n    holds_slot: true\n",
    )
    text = edit(text, "    source: [accepted, processing]\n", "    source: '*'\n")
    text = edit(text, "  - trigger: cancel\n", "  - trigger: abort\n")
    rules = sorted({i.rule for i in lint_text(text)})
    assert rules == ["role-shape", "slot-terminal", "terminal-exit"]


# --- the reference in docs/machines.md -----------------------------------------------

DOC = ROOT / "docs" / "machines.md"
# The reference quotes file:line of the shipped machines: these checks are about them.
SHIPPED_REQUEST = (SHIPPED / "request.yaml").read_text(encoding="utf-8")
SHIPPED_GATE = (SHIPPED / "queue_gate.yaml").read_text(encoding="utf-8")


def _display_name(case: Case) -> str:
    if case.text.startswith(SHIPPED_REQUEST.splitlines()[0]):
        return "machines/request.yaml"
    if case.text.startswith(SHIPPED_GATE.splitlines()[0]):
        return "machines/queue_gate.yaml"
    return "toy.yaml"


def test_every_rule_is_documented_with_a_heading() -> None:
    headings = set(re.findall(r"^### `([a-z-]+)`$", DOC.read_text(encoding="utf-8"), re.M))
    assert {c.rule for c in CASES} <= headings


def test_every_message_shown_in_the_lint_reference_is_what_lint_prints() -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Lint rules", 1)[1].split("\n## ", 1)[0]
    # The plugin-* rules come from loading a policy's plugins, not from lint_machine;
    # tests/test_plugins.py checks what their sections show.
    section = re.sub(r"^### `plugin-[a-z-]+`$.*?(?=^### |\Z)", "", section, flags=re.M | re.S)
    shown = [
        line
        for block in re.findall(r"```text\n(.*?)```", section, re.S)
        for line in block.splitlines()
    ]
    shipped_cases = _cases(SHIPPED_REQUEST, SHIPPED_GATE)
    printed = {
        f"{_display_name(case)}:{i.location.line}:{i.location.column}: {i.message}"
        for case in shipped_cases
        for i in lint_text(case.text, case.registries)
    }
    assert len(shown) >= len({c.rule for c in shipped_cases})
    assert [line for line in shown if line not in printed] == []

"""Semantic lint: what the schema cannot see.

Each rule has an id (shown in ``--format json``) and reports at the YAML location that
needs the edit. Rules:

- ``duplicate-state``        a state declared twice
- ``undeclared-state``       initial/source/dest naming a state that is not declared
- ``unknown-machine``        no Python registry serves this machine name
- ``unregistered``           a condition/action name without a registered callable
- ``missing-role``           a role (or ``outcomes:``) the machine's code needs is not declared
- ``unknown-role``           a role no code of this machine uses
- ``role-shape``             a role's trigger is undeclared or has the wrong shape; not exactly
                             one green outcome (see :mod:`.roles`)
- ``wrong-kind``             the machine's kind is not the one its registry's code drives
- ``unreachable``            a state no path from ``initial`` reaches
- ``dead-end``               a non-terminal state with no way out
- ``terminal-exit``          a terminal state with an outgoing transition
- ``never-fires``            a name both in ``conditions`` and ``unless``
- ``nondeterministic``       two transitions on one trigger and source that can both fire
- ``slot-terminal``          a terminal state declared slot-holding
- ``flow-trigger``           a flow state whose way out uses more than one trigger
- ``flow-exhaustive``        a flow state where some combination of conditions fires nothing
- ``flow-finish``            a flow must settle the delivery exactly on entering a terminal state
- ``parameter-default``      a parameter default its own declaration refuses
- ``undeclared-parameter``   a used condition or action reads a parameter the machine does
                             not declare (see :mod:`.parameters`)
- ``persist-before-publish`` an action that needs a persisted fact runs on a path where that
                             fact has not been established (e.g. publish before the write)
- ``unknown-invariant``      an ``invariants:`` name the catalogue does not have
                             (:mod:`.invariants`; the message lists the catalogue)
- ``invariant-parameter``    a parameter the invariant does not take, a value its schema
                             refuses, or a required parameter left out
- ``duplicate-invariant``    an invariant declared twice in the policy (in one file, or
                             again in a later file of the machine directory)
- ``invariant-queues``       an invariant's ``queues:`` entry that is neither a valid queue
                             name nor a pattern that can match one

Non-determinism and exhaustiveness are decided exactly by enumerating the truth table of
the conditions involved (treated as independent), so the YAML must say ``unless`` where
two branches exclude each other, just as a decision table would.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

from ..located.errors import Location, SpecIssue
from .invariants import INVARIANTS, InvariantCatalog, queue_scope_issues, unknown_invariant
from .model import FLOW, FLOW_KINDS, MachineSpec, TransitionSpec
from .parameters import parameter_issues
from .registry import Registry
from .roles import role_issues

MAX_TRUTH_TABLE_VARIABLES = 12
UNKNOWN_INVARIANT = "unknown-invariant"
UNREGISTERED = "unregistered"
INVARIANT_PARAMETER = "invariant-parameter"
DUPLICATE_INVARIANT = "duplicate-invariant"
INVARIANT_QUEUES = "invariant-queues"


def lint_machine(
    spec: MachineSpec,
    registries: Mapping[str, Registry] | None = None,
    *,
    invariants: InvariantCatalog = INVARIANTS,
) -> list[SpecIssue]:
    """Every lint issue of ``spec``; empty when the machine is sound.

    ``invariants`` is the catalogue its ``invariants:`` names come from (the shipped one,
    or a policy's copy with what its plugins registered).
    """
    issues = [*_structure(spec), *_invariants(spec, invariants)]
    if any(i.rule in ("duplicate-state", "undeclared-state") for i in issues):
        return issues  # graph rules would only repeat the same mistake
    registry = None
    if registries is not None:
        registry = registries.get(spec.name)
        if registry is None:
            known = ", ".join(sorted(registries)) or "none"
            issues.append(
                SpecIssue(
                    spec.location,
                    f"no Python registry serves machine {spec.name!r}; known machines: {known}",
                    "unknown-machine",
                )
            )
        else:
            issues += _registration(spec, registry)
    reachable = _reachable(spec)
    issues += _graph(spec, reachable)
    issues += _determinism(spec)
    wrong_kind = any(i.rule == "wrong-kind" for i in issues)
    if spec.kind in FLOW_KINDS and not wrong_kind:  # they would only repeat that mistake
        issues += _flow_shape(spec)
        if spec.kind == FLOW:
            issues += _flow_finish(spec, registry)
    issues += parameter_issues(spec, registry)
    if registry is not None and not any(i.rule == "unregistered" for i in issues):
        issues += _persist_before_publish(spec, registry, reachable)
    return issues


def _structure(spec: MachineSpec) -> Iterator[SpecIssue]:
    seen: dict[str, Location] = {}
    for state in spec.states:
        if state.name in seen:
            # Not spec.state_map: it keeps the *last* declaration, i.e. this one.
            first = seen[state.name]
            yield SpecIssue(
                state.location,
                f"state {state.name!r} is declared twice (first at line {first.line})",
                "duplicate-state",
            )
        seen.setdefault(state.name, state.location)
        if state.terminal and state.holds_slot:
            yield SpecIssue(
                state.location,
                f"terminal state {state.name!r} is declared slot-holding; entering a "
                "terminal state releases the slot, so a request there would leak it",
                "slot-terminal",
            )
    declared = set(seen)
    refs = [spec.initial]
    for t in spec.transitions:
        refs += [*t.sources, t.dest]
    for ref in refs:
        if ref.name not in declared:
            yield SpecIssue(
                ref.location,
                f"state {ref.name!r} is not declared; declared states: "
                f"{', '.join(spec.state_names)}",
                "undeclared-state",
            )


def _invariants(spec: MachineSpec, catalog: InvariantCatalog) -> Iterator[SpecIssue]:
    seen: dict[str, Location] = {}
    for ref in spec.invariants:
        if ref.name in seen:
            yield SpecIssue(
                ref.location,
                f"invariant {ref.name!r} is declared twice (first at line "
                f"{seen[ref.name].line}); declare it once",
                DUPLICATE_INVARIANT,
            )
            continue
        seen[ref.name] = ref.location
        yield from queue_scope_issues(ref, INVARIANT_QUEUES)
        info = catalog.get(ref.name)
        if info is None:
            yield unknown_invariant(ref, catalog, UNKNOWN_INVARIANT)
        else:
            yield from info.parameter_issues(ref, INVARIANT_PARAMETER)


def _registration(spec: MachineSpec, registry: Registry) -> Iterator[SpecIssue]:
    if registry.kind is not None and spec.kind != registry.kind:
        yield SpecIssue(
            spec.kind_location or spec.location,
            f"machine {spec.name!r} must be kind {registry.kind!r}, not {spec.kind!r}: "
            "the process stage drives it that way",
            "wrong-kind",
        )
    for t in spec.transitions:
        for ref in t.conditions + t.unless:
            if ref.name not in registry.conditions:
                yield _unregistered(ref.name, ref.location, "condition", registry)
        for ref in t.actions:
            if ref.name not in registry.actions:
                yield _unregistered(ref.name, ref.location, "action", registry)
    yield from role_issues(spec, registry.roles, needs_outcomes=registry.outcomes)


def _unregistered(name: str, location: Location, kind: str, registry: Registry) -> SpecIssue:
    pool = registry.conditions if kind == "condition" else registry.actions
    return SpecIssue(
        location,
        f"no {kind} named {name!r} is registered for machine {registry.machine!r}; "
        f"registered {kind}s: {', '.join(sorted(pool)) or 'none'}",
        UNREGISTERED,
    )


def _reachable(spec: MachineSpec) -> set[str]:
    seen = {spec.initial.name}
    frontier = [spec.initial.name]
    while frontier:
        state = frontier.pop()
        for t in spec.outgoing(state):
            if t.dest.name not in seen:
                seen.add(t.dest.name)
                frontier.append(t.dest.name)
    return seen


def _graph(spec: MachineSpec, reachable: set[str]) -> Iterator[SpecIssue]:
    for state in spec.states:
        if state.name not in reachable:
            yield SpecIssue(
                state.location,
                f"state {state.name!r} is unreachable from initial state {spec.initial.name!r}",
                "unreachable",
            )
        outgoing = spec.outgoing(state.name)
        if state.terminal:
            for t in outgoing:
                where = next(s.location for s in t.sources if s.name == state.name)
                if t.wildcard_source:
                    text = f"source '*' includes terminal state {state.name!r}; list sources"
                else:
                    text = f"terminal state {state.name!r} has an outgoing transition"
                yield SpecIssue(where, f"{text} (trigger {t.trigger!r})", "terminal-exit")
        elif not outgoing:
            yield SpecIssue(
                state.location,
                f"non-terminal state {state.name!r} has no way out; add a transition "
                "or mark it terminal",
                "dead-end",
            )


def _groups(spec: MachineSpec) -> dict[tuple[str, str], list[TransitionSpec]]:
    groups: dict[tuple[str, str], list[TransitionSpec]] = {}
    for t in spec.transitions:
        for source in t.source_names:
            groups.setdefault((source, t.trigger), []).append(t)
    return groups


def _fires(t: TransitionSpec, values: Mapping[str, bool]) -> bool:
    return all(values[c.name] for c in t.conditions) and not any(values[u.name] for u in t.unless)


def _truth_table(transitions: list[TransitionSpec]) -> list[dict[str, bool]] | None:
    names = sorted({r.name for t in transitions for r in t.conditions + t.unless})
    if len(names) > MAX_TRUTH_TABLE_VARIABLES:
        return None
    return [
        dict(zip(names, combo, strict=True))
        for combo in itertools.product((False, True), repeat=len(names))
    ]


def _determinism(spec: MachineSpec) -> Iterator[SpecIssue]:
    for t in spec.transitions:
        both = {c.name for c in t.conditions} & {u.name for u in t.unless}
        for name in sorted(both):
            yield SpecIssue(
                t.location,
                f"condition {name!r} is both required and excluded; this transition can never fire",
                "never-fires",
            )
    reported: set[tuple[int, int]] = set()
    for (source, trigger), group in _groups(spec).items():
        if len(group) < 2:
            continue
        table = _truth_table(group)
        if table is None:
            continue
        for values in table:
            firing = [t for t in group if _fires(t, values)]
            for first, second in itertools.combinations(firing, 2):
                if (first.index, second.index) in reported:
                    continue
                reported.add((first.index, second.index))
                yield SpecIssue(
                    second.location,
                    f"non-deterministic: this transition and the one at line "
                    f"{first.location.line} both fire on trigger {trigger!r} from state "
                    f"{source!r} when {_describe(values)}; add 'unless' to separate them",
                    "nondeterministic",
                )


def _describe(values: Mapping[str, bool]) -> str:
    if not values:
        return "no condition guards them"
    return ", ".join(f"{k}={'true' if v else 'false'}" for k, v in values.items())


def _flow_shape(spec: MachineSpec) -> Iterator[SpecIssue]:
    for state in spec.states:
        outgoing = spec.outgoing(state.name)
        triggers = sorted({t.trigger for t in outgoing})
        if len(triggers) > 1:
            yield SpecIssue(
                state.location,
                f"flow state {state.name!r} leaves on several triggers "
                f"({', '.join(triggers)}); a flow step needs exactly one",
                "flow-trigger",
            )
            continue
        if not outgoing or state.terminal:
            continue
        table = _truth_table(list(outgoing))
        for values in table or []:
            if not any(_fires(t, values) for t in outgoing):
                yield SpecIssue(
                    state.location,
                    f"flow state {state.name!r} has no transition when "
                    f"{_describe(values)}; the delivery would stop there",
                    "flow-exhaustive",
                )
                break


def _flow_finish(spec: MachineSpec, registry: Registry | None) -> Iterator[SpecIssue]:
    """Every transition into a terminal state of a flow ends with one finishing action
    (the delivery is settled once); none before."""
    if registry is None:
        return
    terminal = spec.terminal_states
    for t in spec.transitions:
        actions = t.actions
        finishing = [i for i, a in enumerate(actions) if _finishes(registry, a.name)]
        if t.dest.name in terminal:
            if not finishing or finishing[-1] != len(actions) - 1 or len(finishing) > 1:
                yield SpecIssue(
                    t.location,
                    f"transition into terminal state {t.dest.name!r} must end with "
                    "exactly one finishing action (ack or hold) as its last action",
                    "flow-finish",
                )
        elif finishing:
            ref = actions[finishing[0]]
            yield SpecIssue(
                ref.location,
                f"action {ref.name!r} finishes the delivery but the flow goes on to "
                f"non-terminal state {t.dest.name!r}",
                "flow-finish",
            )


def _finishes(registry: Registry, name: str) -> bool:
    info = registry.actions.get(name)
    return bool(info and info.finishes)


def _persist_before_publish(
    spec: MachineSpec, registry: Registry, reachable: set[str]
) -> list[SpecIssue]:
    """Must-analysis of facts along every path from ``initial``.

    A fact is established by an action's ``provides`` or by a condition's outcome; an
    action's ``requires`` must hold on *every* path reaching it. This is the classic
    forward data-flow fixed point with intersection at joins.
    """
    universe: frozenset[str] = frozenset().union(
        *(a.provides for a in registry.actions.values()),
        *(c.provides | c.provides_unless for c in registry.conditions.values()),
    )
    facts_in: dict[str, frozenset[str]] = {s: universe for s in reachable}
    facts_in[spec.initial.name] = frozenset()

    def entry_facts(t: TransitionSpec, source: str) -> frozenset[str]:
        facts = set(facts_in[source])
        for c in t.conditions:
            facts |= registry.conditions[c.name].provides
        for u in t.unless:
            facts |= registry.conditions[u.name].provides_unless
        return frozenset(facts)

    steps = [(t, s) for t in spec.transitions for s in t.source_names if s in reachable]
    changed = True
    while changed:
        changed = False
        for t, source in steps:
            out = set(entry_facts(t, source))
            for a in t.actions:
                out |= registry.actions[a.name].provides
            dest = t.dest.name
            merged = facts_in[dest] & frozenset(out)
            if dest == spec.initial.name:
                merged = frozenset()
            if merged != facts_in[dest]:
                facts_in[dest] = merged
                changed = True

    issues: list[SpecIssue] = []
    # What the message suggests as the fix: the actions to run first, or the guards that
    # establish the fact (``unless: slot_conflict`` proves the slot was won).
    conditions = registry.conditions.values()
    providers = {
        fact: [
            *sorted(a.name for a in registry.actions.values() if fact in a.provides),
            *sorted(f"conditions: {c.name}" for c in conditions if fact in c.provides),
            *sorted(f"unless: {c.name}" for c in conditions if fact in c.provides_unless),
        ]
        for fact in universe
    }
    for t, source in steps:
        facts = set(entry_facts(t, source))
        for a in t.actions:
            info = registry.actions[a.name]
            missing = sorted(info.requires - facts)
            if missing:  # one issue per misplaced action, naming every missing fact
                needs = ", ".join(
                    f"{fact!r} (established by "
                    f"{', '.join(providers.get(fact, [])) or 'nothing registered'})"
                    for fact in missing
                )
                it = "it is" if len(missing) == 1 else "they are"
                issues.append(
                    SpecIssue(
                        a.location,
                        f"persist before publish: {a.name!r} needs {needs} but runs from "
                        f"state {source!r} on a path where {it} not yet established",
                        "persist-before-publish",
                    )
                )
            facts |= info.provides
    return list(dict.fromkeys(issues))  # one issue per place and message

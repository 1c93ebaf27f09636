"""Roles: what the runtime relies on a machine for, declared in its YAML, checked by lint.

The runtime never names a state or a trigger of a machine. It asks the compiled machine
instead: which trigger admits a head, which one supersedes it, which one the dead-letter
reconciler fires, which build outcomes exist, the trigger each one fires and which one
is green. A machine file answers in its ``roles:`` and ``outcomes:`` blocks, and the
code that drives a machine declares, in its registry, the roles it needs and the shape
each must have. Lint holds the two together, so a rename done in one place but not the
other is a ``validate`` error at the YAML line, never a runtime retry loop.

Rules (ids as in ``validate --format json``):

- ``missing-role``  a role the machine's code needs is not declared (or no ``outcomes:``);
                    an optional role (``RoleShape.optional``) may be left out
- ``unknown-role``  a role no code of this machine uses (a typo, or the wrong machine)
- ``role-shape``    the role's trigger is not declared, or its transitions do not have the
                    shape the role needs (where they start, where they lead); an outcome
                    block without exactly one green outcome
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ..located.errors import Location, SpecIssue
from .model import MachineSpec

SLOT_HOLDING = "slot-holding"
TERMINAL = "terminal"


@dataclass(frozen=True)
class RoleShape:
    """What a role's trigger must look like for the code that fires it to be sound.

    ``purpose`` says what the runtime does with the role; it is quoted in lint messages
    and in generated docs. ``leads_to`` is the kind of state every transition of the
    trigger must enter; ``from_initial`` and ``from_every_open_state`` say where its
    transitions must start.
    """

    purpose: str
    leads_to: str
    from_initial: bool = False
    from_every_open_state: bool = False
    #: The code works without it (an operator verb it enables is refused instead).
    optional: bool = False
    #: Its transitions must leave only the initial state (nothing else may be undone).
    only_from_initial: bool = False
    #: It must not lead to a state of the green outcome (it never validates anything).
    never_green: bool = False
    #: Its transitions must leave exactly the non-terminal slot-holding states (it ends a
    #: running build, never a waiting head).
    only_from_holding: bool = False


def role_issues(
    spec: MachineSpec, shapes: Mapping[str, RoleShape], *, needs_outcomes: bool
) -> Iterator[SpecIssue]:
    """Every role issue of ``spec`` against the roles its code declares it needs."""
    declared = {r.role: r for r in spec.roles}
    known = ", ".join(sorted(shapes)) or "none"
    for role in spec.roles:
        if role.role not in shapes:
            yield SpecIssue(
                role.location,
                f"role {role.role!r} is not one the code of machine {spec.name!r} uses; "
                f"its roles: {known}",
                "unknown-role",
            )
    for name, shape in shapes.items():
        found = declared.get(name)
        if found is None and shape.optional:
            continue
        if found is None:
            yield SpecIssue(
                spec.roles_location or spec.location,
                f"machine {spec.name!r} must declare role {name!r} under 'roles:' "
                f"({shape.purpose}): name the trigger that plays it",
                "missing-role",
            )
            continue
        trigger = found.trigger
        yield from _shape_issues(spec, f"role {name!r}", trigger.name, trigger.location, shape)
    yield from _outcome_issues(spec, needs_outcomes)


def _outcome_issues(spec: MachineSpec, needs_outcomes: bool) -> Iterator[SpecIssue]:
    if not needs_outcomes:
        if spec.outcomes_location is not None:
            yield SpecIssue(
                spec.outcomes_location,
                f"machine {spec.name!r} records no build outcomes; remove 'outcomes:'",
                "unknown-role",
            )
        return
    if not spec.outcomes:
        yield SpecIssue(
            spec.outcomes_location or spec.location,
            f"machine {spec.name!r} must declare 'outcomes:' (the build outcomes record "
            "accepts, each with the trigger it fires; exactly one green: true)",
            "missing-role",
        )
        return
    shape = RoleShape("record fires it for a build outcome", TERMINAL)
    holding = sorted(s.name for s in spec.states if s.holds_slot and not s.terminal)
    for outcome in spec.outcomes:
        what = f"outcome {outcome.name!r}"
        found = _shape_issues(spec, what, outcome.trigger.name, outcome.trigger.location, shape)
        yield from found
        if found:
            continue
        missing = sorted(set(holding) - _sources(spec, outcome.trigger.name))
        if missing:
            yield SpecIssue(
                outcome.trigger.location,
                f"{what}: trigger {outcome.trigger.name!r} must leave every slot-holding "
                f"state (a build runs while its request holds a slot); it does not leave "
                f"{', '.join(missing)}",
                "role-shape",
            )
    greens = [o for o in spec.outcomes if o.green]
    if not greens:
        yield SpecIssue(
            spec.outcomes_location or spec.location,
            "exactly one outcome must be 'green: true' (recording it advances the queue's "
            "last green); none is",
            "role-shape",
        )
    for both in (o for o in spec.outcomes if o.green and o.red):
        yield SpecIssue(
            both.location,
            f"outcome {both.name!r} is both green and red; a build outcome says the commit "
            "works or that it is broken, not both",
            "role-shape",
        )
    for extra in greens[1:]:
        yield SpecIssue(
            extra.location,
            f"outcome {extra.name!r} is green, but so is {greens[0].name!r}; exactly one "
            "outcome advances last green",
            "role-shape",
        )


def _shape_issues(
    spec: MachineSpec, what: str, trigger: str, where: Location, shape: RoleShape
) -> list[SpecIssue]:
    transitions = [t for t in spec.transitions if t.trigger == trigger]
    if not transitions:
        return [
            SpecIssue(
                where,
                f"{what} names trigger {trigger!r}, which no transition declares; declared "
                f"triggers: {', '.join(spec.triggers)}",
                "role-shape",
            )
        ]
    issues: list[SpecIssue] = []

    def wrong(must: str, but: str = "", at: Location = where) -> None:
        text = f"{what}: trigger {trigger!r} must {must} ({shape.purpose}){but}"
        issues.append(SpecIssue(at, text, "role-shape"))

    states = spec.state_map
    for t in transitions:
        dest = states.get(t.dest.name)
        if dest is None:
            continue  # undeclared-state reports it
        fits = (
            dest.holds_slot and not dest.terminal
            if shape.leads_to == SLOT_HOLDING
            else dest.terminal
        )
        if not fits:
            wrong(
                f"lead to a {shape.leads_to} state", f"; {dest.name!r} is not one", t.dest.location
            )
    sources = _sources(spec, trigger)
    initial = f"the initial state {spec.initial.name!r}"
    if shape.from_initial and spec.initial.name not in sources:
        wrong(f"leave {initial}")
    if shape.only_from_initial and (extra := sorted(sources - {spec.initial.name})):
        wrong(f"leave only {initial}", f"; it also leaves {', '.join(extra)}")
    green = {
        t.dest.name
        for o in spec.outcomes
        if o.green
        for t in spec.transitions
        if t.trigger == o.trigger.name
    }
    if shape.never_green and (leads := sorted(leads_to(spec, trigger) & green)):
        wrong("not lead to a state of the green outcome", f"; it leads to {', '.join(leads)}")
    holding = {s.name for s in spec.states if s.holds_slot and not s.terminal}
    if shape.only_from_holding and (extra := sorted(sources - holding)):
        wrong("leave only slot-holding states", f"; it also leaves {', '.join(extra)}")
    if shape.only_from_holding and (missing := sorted(holding - sources)):
        wrong("leave every slot-holding state", f"; it does not leave {', '.join(missing)}")
    open_states = {s.name for s in spec.states if not s.terminal}
    if shape.from_every_open_state and (missing := sorted(open_states - sources)):
        wrong("leave every non-terminal state", f"; it does not leave {', '.join(missing)}")
    return issues


def _sources(spec: MachineSpec, trigger: str) -> set[str]:
    return {s for t in spec.transitions if t.trigger == trigger for s in t.source_names}


def leads_to(spec: MachineSpec, trigger: str) -> frozenset[str]:
    """Every state ``trigger`` can lead to."""
    return frozenset(t.dest.name for t in spec.transitions if t.trigger == trigger)

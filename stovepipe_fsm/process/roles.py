"""The request machine's roles, as the process stage, ingest, record and the DLQ use them.

Every name comes from ``machines/request.yaml``: the initial state, the triggers under
``roles:`` and the build outcomes under ``outcomes:``. :data:`REQUEST_ROLES` is what the
code needs (lint checks the YAML against it); :class:`RequestRoles` is the resolved
answer the code reads, so renaming a state or a trigger consistently in the YAML is all
a rename takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from ..machine.model import MachineSpec
from ..machine.roles import SLOT_HOLDING, TERMINAL, RoleShape, leads_to

ADMIT = "admit"
SUPERSEDE = "supersede"
DEAD_LETTER = "dead_letter"
WITHDRAW = "withdraw"
SKIP = "skip"
PREEMPT = "preempt"

REQUEST_ROLES: Mapping[str, RoleShape] = {
    ADMIT: RoleShape(
        "process fires it to admit the latest head; it takes a build slot",
        SLOT_HOLDING,
        from_initial=True,
    ),
    SUPERSEDE: RoleShape(
        "process fires it on a head a newer one made stale", TERMINAL, from_initial=True
    ),
    DEAD_LETTER: RoleShape(
        "the dead-letter reconciler fires it to end a request whose delivery gave up",
        TERMINAL,
        from_every_open_state=True,
    ),
    # Optional: without it ``cancel`` is refused, naming the missing role.
    WITHDRAW: RoleShape(
        "an operator's cancel fires it to end a head still waiting for admission",
        TERMINAL,
        from_initial=True,
        optional=True,
        only_from_initial=True,
        never_green=True,
    ),
    # Optional: without it a queue's ``skip_paths`` is refused when a head would be skipped.
    SKIP: RoleShape(
        "process fires it to end, unbuilt, a head whose changes since last green all match "
        "skip_paths; it takes no slot",
        TERMINAL,
        from_initial=True,
        optional=True,
        only_from_initial=True,
        never_green=True,
    ),
    # Optional, and off in the shipped machine: without it a running build is never
    # preempted, and a gate that names ``preempt_older_builds`` is refused at load.
    PREEMPT: RoleShape(
        "process fires it on the running build of an older head when a newer head is kept "
        "(cancel in progress); it ends the build and frees its slot",
        TERMINAL,
        optional=True,
        only_from_holding=True,
        never_green=True,
    ),
}


@dataclass(frozen=True)
class Outcome:
    """A build outcome record accepts: the trigger it fires and the states it leads to."""

    name: str
    trigger: str
    states: frozenset[str]
    green: bool
    #: The outcome says the commit is broken (a culprit search starts on a red head).
    red: bool = False


@dataclass(frozen=True)
class RequestRoles:
    """The request machine's names for what the runtime does (resolved from a linted spec)."""

    initial: str
    admit: str
    supersede: str
    dead_letter: str
    #: The trigger ``cancel`` fires on a waiting head; ``""`` when the policy has none.
    withdraw: str
    withdrawn_states: frozenset[str]
    #: The trigger that ends a head skip_paths covers; ``""`` when the policy has none.
    skip: str
    skipped_states: frozenset[str]
    #: The trigger that ends an older head's running build for a newer head; ``""`` when
    #: the policy has none (the shipped one: nothing is ever preempted).
    preempt: str
    preempted_states: frozenset[str]
    admitted_states: frozenset[str]
    superseded_states: frozenset[str]
    outcomes: Mapping[str, Outcome]

    @classmethod
    def from_spec(cls, spec: MachineSpec) -> RequestRoles:
        def trigger(role: str) -> str:
            name = spec.role_trigger(role)
            if name is None:  # only with lint off: a spec lint would have refused
                raise ValueError(f"machine {spec.name!r} declares no role {role!r}")
            return name

        admit, supersede = trigger(ADMIT), trigger(SUPERSEDE)
        withdraw = spec.role_trigger(WITHDRAW) or ""
        skip = spec.role_trigger(SKIP) or ""
        preempt = spec.role_trigger(PREEMPT) or ""
        return cls(
            initial=spec.initial.name,
            admit=admit,
            supersede=supersede,
            dead_letter=trigger(DEAD_LETTER),
            withdraw=withdraw,
            withdrawn_states=leads_to(spec, withdraw) if withdraw else frozenset(),
            skip=skip,
            skipped_states=leads_to(spec, skip) if skip else frozenset(),
            preempt=preempt,
            preempted_states=leads_to(spec, preempt) if preempt else frozenset(),
            admitted_states=leads_to(spec, admit),
            superseded_states=leads_to(spec, supersede),
            outcomes={
                o.name: Outcome(
                    o.name, o.trigger.name, leads_to(spec, o.trigger.name), o.green, o.red
                )
                for o in spec.outcomes
            },
        )

    @property
    def retryable_states(self) -> frozenset[str]:
        """The ended states ``retry`` takes a head from: those of every build outcome but
        the green one, and those a withdrawal leads to."""
        ended = (o.states for o in self.outcomes.values() if not o.green)
        return frozenset().union(*ended, self.withdrawn_states)

    @property
    def green_outcome(self) -> Outcome:
        return next(o for o in self.outcomes.values() if o.green)

    def outcome_of_state(self, state: str) -> Outcome | None:
        """The build outcome whose trigger leads to ``state`` (``None`` for other states).

        The dead-letter role leads to a state an outcome also leads to (``failed``), so a
        request failed closed ends, and is announced, as that outcome.
        """
        return self._outcome_by_state.get(state)

    @cached_property
    def _outcome_by_state(self) -> dict[str, Outcome]:
        """Each state an outcome leads to, with the first such outcome in declaration
        order: every lifecycle asks it once per state, and every terminal write asks it."""
        by_state: dict[str, Outcome] = {}
        for outcome in self.outcomes.values():
            for state in outcome.states:
                by_state.setdefault(state, outcome)
        return by_state

    def outcome(self, name: str) -> Outcome:
        """The outcome called ``name``; ``ValueError`` naming the declared ones otherwise."""
        found = self.outcomes.get(name)
        if found is None:
            raise ValueError(f"outcome {name!r} is not one of {', '.join(sorted(self.outcomes))}")
        return found

"""The invariants catalogue: the properties ``stovepipe-fsm check`` can prove, by name.

A machine file lists under ``invariants:`` the properties the model checker must prove
for the policy; ``check`` proves exactly those (docs/check.md). The names come from this
catalogue: a name, a one-line summary, and the parameters a declaration may give, each
described by a JSON Schema. It lives in the machine layer so that lint can check a
declaration without the checker. The checker (``stovepipe_fsm.apps.check``) binds every
built-in name to its own checking functions, and a test holds the two together.

A plugin adds an invariant to the policy that loads it by registering its checking
function in ``register(plugin)``, on ``plugin.invariants`` (a catalogue of that policy's
own); the checker calls it with what it observed and the declaration's parameters
(defaults filled in)::

    def register(plugin):
        @plugin.invariants.state(
            summary="at most `limit` requests are built in full",
            parameters={"limit": {"type": "integer", "minimum": 0, "default": 0}},
        )
        def few_full_builds(obs, rules, params):
            full = [r.id for r in obs.requests if r.build_strategy == "full"]
            if len(full) > params["limit"]:
                yield f"{len(full)} full builds: {full}"

The shipped catalogue :data:`INVARIANTS` is read-only: a registration on it would belong
to the process, not to one policy (two versions of a policy loaded side by side would
register the name twice).

A state invariant is called as ``check(obs, rules, params)`` in every explored state, a
transition invariant as ``check(pre, post, rules, params)`` on every explored step; each
yields one line per thing that is wrong (nothing when it holds). ``obs`` is an
``Observation`` and ``rules`` the ``Rules`` of :mod:`stovepipe_fsm.apps.check`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from jsonschema import Draft202012Validator

from ..domain.queue_names import InvalidQueueName, validate_queue_name
from ..located.errors import SpecIssue
from .model import INVARIANT_QUEUES, InvariantRef, MachineSpec
from .registry import DuplicateName, RegistrationRefused, first_paragraph

STATE = "state"
TRANSITION = "transition"
BUILT_IN = "built-in"

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")

InvariantCheck = Callable[..., Iterator[str]]
Schema = Mapping[str, Any]


@dataclass(frozen=True)
class InvariantInfo:
    """One catalogue entry.

    ``scope`` is where the checker evaluates it: ``state`` and ``transition`` entries
    carry their ``check`` function; ``built-in`` ones are checked by the checker's own
    code (in states, on steps, or over the explored graph, as ``progress`` is).
    ``parameters`` maps each parameter a declaration may give to its JSON Schema; one
    with a ``default`` may be left out, any other is required.
    """

    name: str
    summary: str
    scope: str = BUILT_IN
    parameters: Mapping[str, Schema] = field(default_factory=dict)
    check: InvariantCheck | None = None

    def values(self, ref: InvariantRef) -> dict[str, Any]:
        """The parameters of a declaration, with the defaults of those it leaves out."""
        given = ref.values
        return {
            name: given[name] if name in given else schema.get("default")
            for name, schema in self.parameters.items()
        }

    def parameter_issues(self, ref: InvariantRef, rule: str) -> Iterator[SpecIssue]:
        """What is wrong with the parameters ``ref`` gives, each where it is written."""
        accepted = ", ".join(sorted(self.parameters)) or "none"
        for given in ref.parameters:
            schema = self.parameters.get(given.name)
            if schema is None:
                yield SpecIssue(
                    given.location,
                    f"invariant {self.name!r} has no parameter {given.name!r}; "
                    f"its parameters: {accepted}",
                    rule,
                )
                continue
            for error in Draft202012Validator(schema).iter_errors(given.value):
                yield SpecIssue(
                    given.value_location,
                    f"invariant {self.name!r}, parameter {given.name!r}: {error.message}",
                    rule,
                )
        for name, schema in self.parameters.items():
            if "default" not in schema and name not in ref.values:
                yield SpecIssue(
                    ref.location,
                    f"invariant {self.name!r} needs parameter {name!r}"
                    + (f" ({schema['description']})" if schema.get("description") else ""),
                    rule,
                )


class InvariantCatalog:
    """The invariants a policy may declare, in registration order.

    Registering a name twice raises ``ValueError`` (:class:`.registry.DuplicateName`),
    whoever registers it: a plugin cannot silently replace a shipped property. A frozen
    catalogue (:meth:`freeze`; the shipped one) refuses every registration; its
    :meth:`copy` does not.
    """

    def __init__(self, entries: Iterable[InvariantInfo] = ()) -> None:
        self._entries: dict[str, InvariantInfo] = {}
        self._frozen = False
        for info in entries:
            self.add(info)

    def freeze(self) -> InvariantCatalog:
        """Refuse any further registration; returns this catalogue."""
        self._frozen = True
        return self

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[InvariantInfo]:
        return iter(tuple(self._entries.values()))

    def get(self, name: str) -> InvariantInfo | None:
        return self._entries.get(name)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def copy(self) -> InvariantCatalog:
        """A catalogue with the same entries, to extend without touching this one."""
        return InvariantCatalog(self)

    def add(self, info: InvariantInfo) -> InvariantInfo:
        if self._frozen:
            raise RegistrationRefused(
                f"invariant {info.name!r}: the shipped invariant catalogue is read-only; a "
                "plugin registers an invariant in register(plugin) with "
                "plugin.invariants.state() or plugin.invariants.transition()"
            )
        if not NAME_PATTERN.match(info.name):
            raise RegistrationRefused(
                f"invariant name {info.name!r} must match {NAME_PATTERN.pattern}"
            )
        if info.name in self._entries:
            raise DuplicateName(f"invariant {info.name!r} is registered twice")
        if info.scope not in (STATE, TRANSITION, BUILT_IN):
            raise RegistrationRefused(f"invariant {info.name!r}: unknown scope {info.scope!r}")
        if (info.check is None) != (info.scope == BUILT_IN):
            raise RegistrationRefused(
                f"invariant {info.name!r}: a {info.scope} invariant "
                + ("needs a check function" if info.check is None else "takes no function")
            )
        for name, schema in info.parameters.items():
            if not NAME_PATTERN.match(name) or name in ("name", INVARIANT_QUEUES):
                raise RegistrationRefused(f"invariant {info.name!r}: bad parameter name {name!r}")
            Draft202012Validator.check_schema(dict(schema))
        parameters = {k: MappingProxyType(dict(v)) for k, v in info.parameters.items()}
        entry = InvariantInfo(
            info.name, info.summary, info.scope, MappingProxyType(parameters), info.check
        )
        self._entries[info.name] = entry
        return entry

    def built_in(
        self, name: str, summary: str, *, parameters: Mapping[str, Schema] | None = None
    ) -> InvariantInfo:
        """Declare a property the checker itself knows how to check."""
        return self.add(InvariantInfo(name, summary, BUILT_IN, parameters or {}))

    def state(
        self,
        name: str | None = None,
        *,
        summary: str | None = None,
        parameters: Mapping[str, Schema] | None = None,
    ) -> Callable[[InvariantCheck], InvariantCheck]:
        """Register ``check(obs, rules, params)``, evaluated in every explored state."""
        return self._registering(STATE, name, summary, parameters)

    def transition(
        self,
        name: str | None = None,
        *,
        summary: str | None = None,
        parameters: Mapping[str, Schema] | None = None,
    ) -> Callable[[InvariantCheck], InvariantCheck]:
        """Register ``check(pre, post, rules, params)``, evaluated on every explored step."""
        return self._registering(TRANSITION, name, summary, parameters)

    def _registering(
        self,
        scope: str,
        name: str | None,
        summary: str | None,
        parameters: Mapping[str, Schema] | None,
    ) -> Callable[[InvariantCheck], InvariantCheck]:
        def register(fn: InvariantCheck) -> InvariantCheck:
            text = summary or first_paragraph(fn)
            self.add(InvariantInfo(name or fn.__name__, text, scope, parameters or {}, fn))
            return fn

        return register


def unknown_invariant(ref: InvariantRef, catalog: InvariantCatalog, rule: str) -> SpecIssue:
    return SpecIssue(
        ref.location,
        f"no invariant named {ref.name!r} in the catalogue; invariants: "
        f"{', '.join(sorted(catalog.names())) or 'none'}",
        rule,
    )


def queue_scope_issues(ref: InvariantRef, rule: str) -> Iterator[SpecIssue]:
    """The ``queues:`` entries of ``ref`` that no valid queue name can be (nor match).

    ``*`` matches any run of characters, as in ``config/queues.yaml``: a pattern can
    match a valid name exactly when it does with every ``*`` standing for one ordinary
    character (``docs/config.md``)."""
    for pattern in ref.queues:
        probe = pattern.name.replace("*", "0")
        try:
            if "**" in pattern.name:
                raise InvalidQueueName("'**' means the same as '*' here; write a single '*'")
            validate_queue_name(probe)
        except InvalidQueueName as exc:
            reason = str(exc).replace(repr(probe), repr(pattern.name))
            yield SpecIssue(
                pattern.location,
                f"invariant {ref.name!r}: {pattern.name!r} is neither a queue name nor a "
                f"pattern that can match one: {reason}",
                rule,
            )


def policy_invariants(specs: Iterable[MachineSpec]) -> tuple[InvariantRef, ...]:
    """What a policy declares: every machine's ``invariants:``, in file order, each name once
    (the first declaration; lint and :func:`repeated_invariants` report the others)."""
    seen: dict[str, InvariantRef] = {}
    for spec in specs:
        for ref in spec.invariants:
            seen.setdefault(ref.name, ref)
    return tuple(seen.values())


def repeated_invariants(specs: Iterable[MachineSpec], rule: str) -> Iterator[SpecIssue]:
    """An invariant declared by one machine file and again by a later one."""
    first: dict[str, InvariantRef] = {}
    for spec in specs:
        own: set[str] = set()
        for ref in spec.invariants:
            earlier = first.get(ref.name)
            if earlier is not None and ref.name not in own:
                yield SpecIssue(
                    ref.location,
                    f"invariant {ref.name!r} is already declared at {earlier.location}; "
                    "a policy declares each invariant once",
                    rule,
                )
            own.add(ref.name)
            first.setdefault(ref.name, ref)


# The properties the checker proves today. The names are what users write and read in
# `check`'s output; apps/check maps each one to the checks that decide it.
INVARIANTS = InvariantCatalog()
INVARIANTS.built_in(
    "persist_before_publish",
    "a build or start event exists only for a request whose admission (processing, "
    "strategy and base) is persisted",
)
INVARIANTS.built_in(
    "one_event_per_admission", "every start event of one admission carries the same id"
)
INVARIANTS.built_in(
    "admits_latest",
    "a request is admitted only while it is among the newest keep_newest heads of its "
    "queue not yet terminal, the latest always counted (no stale admission); a queue "
    "with every_head may admit any head",
)
INVARIANTS.built_in(
    "keeps_newest_n",
    "a waiting head is superseded only when it is no longer among the newest "
    "keep_newest heads of its queue not yet terminal; with every_head, never",
)
INVARIANTS.built_in("newest_not_superseded", "the newest ingested head is never superseded")
INVARIANTS.built_in(
    "superseded_never_started", "a superseded request never got a start event or a build"
)
INVARIANTS.built_in(
    "preempts_only_older",
    "a running build is preempted only from a slot-holding state, for a newer head of its "
    "queue that is kept, and never once its outcome was recorded (a policy with the "
    "preempt role)",
)
INVARIANTS.built_in("max_concurrent", "never more slot holders than the queue's max_concurrent")
INVARIANTS.built_in(
    "base_is_green_ancestor",
    "an incremental admission's base is a recorded green of its queue at its admit and "
    "an ancestor of its head: the newest recorded green that is",
)
INVARIANTS.built_in(
    "rewrite_runs_alone",
    "a head that does not descend from last green is admitted only when no other request "
    "holds a slot, and nothing else holds one while it does",
)
INVARIANTS.built_in(
    "baseline_lag_bounded",
    "an admission pins a base at most max_baseline_lag heads (ingest order) behind it, "
    "unless nothing else of its queue was in flight",
)
INVARIANTS.built_in(
    "slot_bookkeeping",
    "the queue row lists exactly the requests that hold a slot: every request in a "
    "slot-holding state, and an accepted one only while its admission is still under way",
)
INVARIANTS.built_in(
    "strategy_sound",
    "an incremental build's base is an ancestor of its commit; a full build has no base",
)
INVARIANTS.built_in("strategy_immutable", "strategy and base never change once set")
INVARIANTS.built_in("last_green_forward", "last green never moves back in ingest order")
INVARIANTS.built_in(
    "dead_letter_failed_closed", "a request the runtime dead-lettered is terminal and holds no slot"
)
INVARIANTS.built_in(
    "lease_bounds_stall",
    "when the queue sets max_validation_ms: deliveries and clock advances alone, with no "
    "build ever reporting, admit or supersede every waiting head (leases expire, and the "
    "gate reclaims them)",
)
INVARIANTS.built_in(
    "progress",
    "with deliveries, clock advances and build completions only, every state reaches one "
    "with no message pending and no accepted request waiting",
)
# Culprit finding (machines/culprit.yaml), proved by check's culprit exploration.
INVARIANTS.built_in(
    "search_ends",
    "every culprit search ends named or unresolved, or is replaced by a newer red head's: "
    "no reachable state has it open with no probe in flight nor one left to start, and "
    "it never starts more than max_probes",
)
INVARIANTS.built_in(
    "probe_slots_bound", "never more probes in flight for a queue than its probe_slots"
)
INVARIANTS.built_in(
    "named_soundly",
    "a commit is named only with a green result on its parent (the base counts) and at "
    "least confirm_reds red results; when none of its reds was a flake it is the culprit",
)
INVARIANTS.built_in(
    "probes_never_delay_heads",
    "a probe never holds a build slot, never becomes latest or the serial holder, and a "
    "head's delivery decides the same with or without probes in flight",
)
INVARIANTS.freeze()

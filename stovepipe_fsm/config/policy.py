"""The loaded per-queue policy: defaults plus entries, and how a queue resolves.

Resolution is deliberately simple enough to do in one's head when reading
``config/queues.yaml``:

1. start from the built-in :class:`~stovepipe_fsm.domain.entities.QueueConfig` defaults
   of the runtime's own keys and the declared default of every parameter (a policy
   loaded without its machines' declarations has none: the process stage's services
   fill them in);
2. apply every field set under ``defaults:``;
3. apply the fields set in the *single* best matching ``queues:`` entry: the exact
   name if there is one, else the matching pattern with the most literal characters.

Entries never stack: a pattern's fields do not leak into a queue that an exact entry or
a more specific pattern claims. That keeps "what does this queue get?" answerable by
finding one entry, and it is why two equally specific patterns that can match the same
name are rejected at load time instead of being ordered by position in the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from ..domain.entities import QueueConfig
from ..domain.queue_names import validate_stored_queue_name
from ..located.errors import Location, SpecError, SpecIssue
from .globs import common_match, glob_match, is_pattern, specificity

#: How many queue names a policy keeps resolved configs for before it starts over.
MAX_RESOLVED_QUEUES = 100_000


@dataclass(frozen=True)
class Settings:
    """Fields one ``defaults:`` block or ``queues:`` entry sets; ``None`` means "not set".

    Kept separate from :class:`QueueConfig` because "not set, inherit" and "set to the
    default value" must differ: an entry that sets nothing must not reset ``defaults:``.
    """

    max_attempts: int | None = None
    repository: str | None = None
    ref: str | None = None
    parameters: tuple[tuple[str, Any], ...] = ()

    def apply(self, base: QueueConfig) -> QueueConfig:
        """``base`` with every field this block sets replaced."""
        changes = dict(self.items())
        return base.with_values(changes) if changes else base

    def items(self) -> tuple[tuple[str, Any], ...]:
        """The fields that are set: runtime keys in declaration order, then parameters."""
        runtime = tuple(
            (f.name, getattr(self, f.name))
            for f in fields(self)
            if f.name != "parameters" and getattr(self, f.name) is not None
        )
        return runtime + self.parameters


@dataclass(frozen=True)
class PolicyEntry:
    """One ``queues:`` entry: an exact queue name or a pattern, its fields and its place."""

    key: str
    settings: Settings = Settings()
    location: Location | None = None

    @property
    def is_pattern(self) -> bool:
        return is_pattern(self.key)

    @property
    def specificity(self) -> int:
        return specificity(self.key)

    def matches(self, queue: str) -> bool:
        return glob_match(self.key, queue) if self.is_pattern else self.key == queue


@dataclass(frozen=True)
class InvariantScope:
    """An ``invariants:`` entry of the config: the queues (names and patterns) an
    invariant the machines declare is proved for, in place of what the machines say."""

    name: str
    queues: tuple[str, ...]
    location: Location | None = None


@dataclass(frozen=True)
class QueuePolicy:
    """Defaults plus entries; answers "what config does this queue get?".

    Construction refuses ties (see :func:`tie_issues`), so every value of this type
    resolves each queue name to exactly one entry or to the defaults.
    """

    defaults: Settings = Settings()
    entries: tuple[PolicyEntry, ...] = ()
    source: str = "<built-in>"
    parameter_defaults: tuple[tuple[str, Any], ...] = ()
    #: What ``stovepipe-fsm check`` proves for which queues (it alone reads them).
    invariant_scopes: tuple[InvariantScope, ...] = ()
    _exact: dict[str, PolicyEntry] = field(init=False, repr=False, compare=False)
    _patterns: tuple[PolicyEntry, ...] = field(init=False, repr=False, compare=False)
    #: Resolved configs by queue name: a policy never changes (a reload makes a new one)
    #: and the service resolves a queue's config on every delivery.
    _resolved: dict[str, QueueConfig] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        exact: dict[str, PolicyEntry] = {}
        problems: list[SpecIssue] = []
        for entry in self.entries:
            if entry.is_pattern:
                continue
            where = entry.location or Location(self.source, 1, 1)
            if entry.key in exact:
                problems.append(SpecIssue(where, f"queue {entry.key!r} is listed twice", "tie"))
            exact[entry.key] = entry
        located = ((e.key, e.location or Location(self.source, 1, 1)) for e in self.entries)
        problems += tie_issues(located)
        if problems:
            raise SpecError(problems)
        # Most specific first: the first matching pattern is then the winner.
        patterns = sorted((e for e in self.entries if e.is_pattern), key=lambda e: -e.specificity)
        object.__setattr__(self, "_exact", exact)
        object.__setattr__(self, "_patterns", tuple(patterns))
        object.__setattr__(self, "_resolved", {})

    def winning_entry(self, queue: str) -> PolicyEntry | None:
        """The entry whose fields apply to ``queue``, or None when only defaults apply."""
        validate_stored_queue_name(queue)
        if queue in self._exact:
            return self._exact[queue]
        return next((e for e in self._patterns if e.matches(queue)), None)

    def resolve(self, queue: str) -> QueueConfig:
        """Built-in defaults, then ``defaults:``, then the winning entry's fields.

        Raises :class:`~stovepipe_fsm.domain.queue_names.InvalidQueueName` for a name
        no queue can have, so a typo at a call site fails loudly instead of quietly
        getting the defaults.
        """
        resolved = self._resolved.get(queue)
        if resolved is not None:
            return resolved
        config = self.defaults.apply(QueueConfig(parameters=self.parameter_defaults))
        entry = self.winning_entry(queue)
        resolved = entry.settings.apply(config) if entry is not None else config
        if len(self._resolved) >= MAX_RESOLVED_QUEUES:
            self._resolved.clear()
        self._resolved[queue] = resolved
        return resolved

    def configured_queues(self) -> tuple[str, ...]:
        """Exact queue names with an entry, in file order (patterns excluded)."""
        return tuple(e.key for e in self.entries if not e.is_pattern)


def tie_issues(keys: Iterable[tuple[str, Location]]) -> Iterator[SpecIssue]:
    """One issue at *each* location of every pair of equally specific, overlapping patterns.

    Such a pair would make the winner depend on file order, which nobody reviewing a
    diff of ``config/queues.yaml`` can see, so it is an error with an example name that
    both match.
    """
    by_rank: dict[int, list[tuple[str, Location]]] = {}
    for key, location in keys:
        if is_pattern(key):
            by_rank.setdefault(specificity(key), []).append((key, location))
    for rank, group in by_rank.items():
        for index, (left, left_at) in enumerate(group):
            for right, right_at in group[index + 1 :]:
                example = common_match(left, right)
                if example is None:
                    continue
                yield _tie(left, right, right_at, rank, example, left_at)
                yield _tie(right, left, left_at, rank, example, right_at)


def _tie(
    key: str, other: str, other_at: Location, rank: int, example: str, where: Location
) -> SpecIssue:
    return SpecIssue(
        where,
        f"pattern {key!r} ties with {other!r} at {other_at}: both have {rank} literal "
        f"character(s) and both match {example!r}, so neither would win; make one of them "
        "more specific (more literal characters) or merge them into one entry",
        "tie",
    )

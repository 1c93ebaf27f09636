"""Checks on ``queues:`` keys that JSON Schema cannot express.

Schema validation covers the shape and the values; these rules need code: an exact key
must be a name ingest would accept, a pattern must be able to match such a name, and
equally specific patterns must not overlap. They run even when the schema found
problems, so one ``validate`` run reports everything at once.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..domain.queue_names import InvalidQueueName, validate_queue_name
from ..located.errors import Location, SpecIssue
from ..located.yaml_source import SourceDocument
from .globs import STAR, is_pattern
from .policy import tie_issues

QUEUES = "queues"


def key_issues(doc: SourceDocument) -> Iterator[SpecIssue]:
    """Invalid exact names, patterns that can match nothing, and ties, all located."""
    data = doc.data
    if not isinstance(data, dict) or not isinstance(data.get(QUEUES), dict):
        return
    keys = [(key, doc.locate((QUEUES, key), key=True)) for key in data[QUEUES]]
    usable: list[tuple[str, Location]] = []
    for key, where in keys:
        problem = key_problem(key)
        if problem is None:
            usable.append((key, where))
        else:
            rule = "pattern" if is_pattern(key) else "queue-name"
            yield SpecIssue(where, problem, rule)
    # A key already reported as unusable would only add noise as one side of a tie.
    yield from tie_issues(usable)


INVARIANTS = "invariants"


def invariant_scope_issues(doc: SourceDocument) -> Iterator[SpecIssue]:
    """Queue names or patterns under ``invariants:`` that can name no queue, located."""
    data = doc.data
    if not isinstance(data, dict) or not isinstance(data.get(INVARIANTS), dict):
        return
    for name, queues in data[INVARIANTS].items():
        for i, key in enumerate(queues if isinstance(queues, list) else ()):
            if not isinstance(key, str) or not key:
                continue  # the schema reports it
            problem = key_problem(key)
            if problem is not None:
                where = doc.locate((INVARIANTS, name, i))
                yield SpecIssue(where, f"invariants: {name}: {problem}", "queue-name")


def key_problem(key: str) -> str | None:
    """Why ``key`` (a pattern or an exact queue name) can name no queue, or None."""
    return pattern_problem(key) if is_pattern(key) else name_problem(key)


def name_problem(key: str) -> str | None:
    """Why ``key`` is not a valid exact queue name, or None."""
    try:
        validate_queue_name(key)
    except InvalidQueueName as exc:
        return (
            f"invalid queue name {key!r}: {exc}; use the exact name ingest accepts, "
            "or '*' to match several queues"
        )
    return None


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is unusable, or None.

    A pattern is usable when at least one valid queue name matches it. Replacing every
    ``*`` by one ordinary character gives the most permissive candidate: literal text is
    kept as is, and no ``*`` can then create a leading, trailing or doubled ``/``. So the
    pattern can match a valid name exactly when that candidate is one; checking it with
    the domain's own rule keeps the two from drifting apart. The candidate has the same
    length as the pattern, so reported positions refer to the pattern.
    """
    if STAR * 2 in pattern:
        return (
            f"pattern {pattern!r} contains '**', which means the same as '*' here "
            "('*' already matches '/'); write a single '*'"
        )
    probe = pattern.replace(STAR, "0")  # a digit: ordinary, and of no script
    try:
        validate_queue_name(probe)
    except InvalidQueueName as exc:
        reason = str(exc).replace(repr(probe), repr(pattern))
        return f"pattern {pattern!r} can never match a valid queue name: {reason}"
    return None


LEASE = "max_validation_ms"
HOLD_DELAY = "gate_wait_delay_ms"
DEFAULTS = "defaults"


def lease_issues(doc: SourceDocument, declared_hold_delay: object) -> Iterator[SpecIssue]:
    """A slot lease shorter than the queue's hold delay, located at the value that sets it.

    A lease must outlast at least one hold: a head held by the gate re-checks only after
    ``gate_wait_delay_ms``, so a shorter lease would expire between two looks and the
    bound it promises (a stall of at most ``max_validation_ms`` plus one hold) would be
    meaningless. Each block is checked with what a queue it applies to gets: the block's
    own values, else ``defaults:``, else the declared default of the hold delay. Values
    of the wrong type are left to the schema. 0 (no expiry) is never too short.
    """
    data = doc.data
    if not isinstance(data, dict):
        return
    raw_defaults = data.get(DEFAULTS)
    defaults: dict[str, object] = raw_defaults if isinstance(raw_defaults, dict) else {}
    blocks: list[tuple[tuple[str, ...], dict[str, object]]] = [((DEFAULTS,), defaults)]
    queues = data.get(QUEUES)
    if isinstance(queues, dict):
        blocks += [((QUEUES, key), body) for key, body in queues.items() if isinstance(body, dict)]
    for path, body in blocks:
        lease = body.get(LEASE, defaults.get(LEASE))
        delay = body.get(HOLD_DELAY, defaults.get(HOLD_DELAY, declared_hold_delay))
        if not isinstance(lease, int | float) or not isinstance(delay, int | float):
            continue
        if not _whole(lease) or not _whole(delay) or lease <= 0 or lease >= delay:
            continue  # no lease, or a value the schema already reports
        if LEASE not in body and HOLD_DELAY not in body:
            continue  # reported once, at the defaults that set both
        where = (*path, LEASE) if LEASE in body else (*path, HOLD_DELAY)
        yield SpecIssue(
            doc.locate(where),
            f"{'.'.join(where)}: {LEASE} {lease} is shorter than {HOLD_DELAY} {delay}; a "
            "slot lease must last at least one hold delay (or be 0: no expiry)",
            "lease",
        )


def _whole(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == int(value)

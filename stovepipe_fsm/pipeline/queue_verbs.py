"""The operator verbs about queues (``pause``, ``resume``, ``dlq prune``): which is
refused, and the decision-trail record each leaves.

A pause holds a queue's heads through the policy's own pause condition, which reads the
``paused`` parameter; a policy in force that declares parameters but not that one would
read no pause, so the pause is refused, naming that policy. Without a recorded policy
the pause is kept: the policy that will run reads it.

Each verb appends one ``operator`` record whose tag names the verb, the pattern and what
it is about, so running the verb again is the same record: a pause is keyed by the
pause (when it began), a resume by the pause it lifted, a dlq prune by the dead letters
it deleted. A request's history shows the verbs about its queue made while it was open
(:func:`with_queue_verbs`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ..config.globs import glob_match
from ..domain.errors import IllegalOperation
from ..domain.trail_record import OPERATOR, TrailRecord, detail
from ..process.gate import PAUSED


def refuse_unpausable(parameters: Collection[str], policy_hash: str) -> None:
    """``IllegalOperation`` when the policy in force (its declared ``parameters``, empty
    when none is recorded) cannot read a pause."""
    if parameters and PAUSED not in parameters:
        raise IllegalOperation(
            f"the policy in force ({policy_hash or 'unhashed'}) declares no "
            f"{PAUSED!r} parameter, so no pause condition would read a pause; "
            "declare it and name the condition in queue_gate.yaml (docs/machines.md)"
        )


def pause_record(pattern: str, paused_at_ms: int, by: str, reason: str) -> TrailRecord:
    """The record of the pause of ``pattern`` that began at ``paused_at_ms``."""
    why = f": {reason}" if reason else ""
    tag = f"pause|{pattern}|{paused_at_ms}"
    return _queue_record("pause", pattern, paused_at_ms, by, f"paused{why}", tag)


def resume_record(pattern: str, paused_at_ms: int, by: str, now_ms: int) -> TrailRecord:
    """The record of a resume that lifted the pause of ``pattern`` begun at
    ``paused_at_ms`` (a resume that lifted nothing leaves none)."""
    tag = f"resume|{pattern}|{paused_at_ms}"
    return _queue_record("resume", pattern, now_ms, by, "resumed", tag)


def _queue_record(verb: str, pattern: str, at_ms: int, by: str, what: str, tag: str) -> TrailRecord:
    """The record of ``verb`` about the queues ``pattern`` matches, keyed by ``tag``."""
    pairs = detail(verb=verb, by=by or "operator", what=what)
    return TrailRecord(OPERATOR, pattern, "", at_ms, detail=pairs, tag=tag)


def dlq_prune_record(
    queue_glob: str, pruned: Sequence[int], older_than_s: float, by: str, now_ms: int
) -> TrailRecord:
    """The record of a ``dlq prune`` that deleted the dead letters ``pruned`` (ids in
    stream order, at least one) of the queues ``queue_glob`` matches."""
    ids = f"{pruned[0]}..{pruned[-1]}" if len(pruned) > 1 else str(pruned[0])
    what = f"deleted {len(pruned)} dead letter(s) ({ids}) older than {older_than_s:g}s"
    tag = f"dlq prune|{queue_glob}|{ids}|{len(pruned)}"
    return _queue_record("dlq prune", queue_glob or "**", now_ms, by, what, tag)


def with_queue_verbs(
    records: Sequence[TrailRecord], verbs: Sequence[TrailRecord], ended_at_ms: int
) -> list[TrailRecord]:
    """A request's trail ``records`` (at least one) with the queue ``verbs`` about its
    queue made while it was open (from its first record to ``ended_at_ms``, or now when
    0), and a pause of it already in force when it was ingested, in time order."""
    queue = records[0].queue
    start = min(r.first_at_ms for r in records)
    matching = [v for v in verbs if glob_match(v.queue, queue)]
    # A pause and the resume that lifted it share the tag's "<pattern>|<paused at>".
    lifted_before = {
        v.tag.split("|", 1)[1] for v in matching if v.tag.startswith("resume|") and v.at_ms < start
    }
    mine = [
        v
        for v in matching
        if (not ended_at_ms or v.at_ms <= ended_at_ms)
        and (
            v.at_ms >= start
            or (v.tag.startswith("pause|") and v.tag.split("|", 1)[1] not in lifted_before)
        )
    ]
    return sorted([*records, *mine], key=lambda r: (r.first_at_ms, r.at_ms))

"""Writing the decision trail: what each stage notes, and a trail that keeps nothing.

The stages note a decision after its durable write and before they settle (ack, hold,
return), so a crash in between is followed by a redelivery that notes it again under the
same key (:mod:`stovepipe_fsm.domain.trail_record`): nothing is lost, nothing doubled. The
process stage notes in its finishing actions (``ack``, ``hold``), through
:func:`note_decision`: what the delivery decided is read off its context, and why it was
held off the flow transition that led to the hold (:func:`hold_reason`). A plugin's
action notes through :func:`note_plugin`, keyed by the request's version so a redelivery
writes the same record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..domain.entities import Request
from ..domain.parameter_text import parameters_text
from ..domain.trail_record import (
    ADMITTED,
    ATTEMPT_FAILED,
    HELD,
    PLUGIN,
    RECLAIMED,
    SKIPPED,
    SUPERSEDED,
    TrailRecord,
    detail,
)
from ..machine.compiler import Step
from .context import DeliveryContext
from .services import StageServices

log = logging.getLogger("stovepipe_fsm.decisions")

#: A request held for one reason is logged at its first hold, then at most this often.
HELD_LOG_INTERVAL_S = 60.0


@dataclass
class HeldLogLimiter:
    """Rate-limits the log lines of repeated holds the way the trail collapses them: the
    first hold of a (request, reason), then one line per interval with the count."""

    interval_s: float = HELD_LOG_INTERVAL_S
    limit: int = 10_000
    _runs: dict[str, dict[str, tuple[int, float]]] = field(default_factory=dict, init=False)

    def should_log(self, request_id: str, reason: str) -> int:
        """The holds to report now (0: stay quiet)."""
        runs = self._runs.get(request_id)
        if runs is None:
            if len(self._runs) >= self.limit:  # bounded: forget the oldest request
                self._runs.pop(next(iter(self._runs)))
            runs = self._runs[request_id] = {}
        now = time.monotonic()
        count, logged_at = runs.get(reason, (0, -self.interval_s))
        count += 1
        if now - logged_at >= self.interval_s:
            runs[reason] = (0, now)
            return count
        runs[reason] = (count, logged_at)
        return 0

    def forget(self, request_id: str) -> None:
        """The request left the waiting state: its hold runs are over."""
        self._runs.pop(request_id, None)


HELD_LOG = HeldLogLimiter()


class DiscardedTrail:
    """A ``DecisionTrail`` that keeps nothing: for the model checker, whose states must not
    grow with a history, and for callers that want no trail."""

    async def append(self, record: TrailRecord) -> None:
        return None

    async def has(self, request_id: str, kind: str) -> bool:
        return False

    async def history(self, request_id: str) -> list[TrailRecord]:
        return []


async def note(
    services: StageServices,
    kind: str,
    request: Request,
    *,
    tag: str = "",
    stream_seq: int = 0,
    **why: object,
) -> None:
    """Append one decision about ``request`` now, under the policy in force."""
    await _append(services, kind, request.queue, request.id, why, tag=tag, stream_seq=stream_seq)


async def _append(
    services: StageServices,
    kind: str,
    queue: str,
    request_id: str,
    why: Mapping[str, object],
    *,
    tag: str = "",
    stream_seq: int = 0,
    at_ms: int | None = None,
) -> None:
    """Append one record about ``request_id`` (at ``at_ms``; None: now)."""
    if isinstance(services.trail, DiscardedTrail):
        return  # nothing keeps it: do not build the record (check forks worlds by the
        # hundred thousand, each delivery noting a decision)
    await services.trail.append(
        TrailRecord(
            kind=kind,
            queue=queue,
            request_id=request_id,
            at_ms=services.clock.now_ms() if at_ms is None else at_ms,
            detail=detail(**why),
            tag=tag,
            stream_seq=stream_seq,
            policy=services.policy_hash(),
        )
    )


def hold_reason(step: Step | None) -> str:
    """Why a delivery ended where ``step`` took it: the transition's ``conditions``.

    A transition into a held state says why by what it tests (``gate_closed``,
    ``latest_not_stamped``); one guarded by ``unless`` only says ``not <name>``; an
    unguarded one by its ``description``, else by its trigger and source state.
    """
    t = step.transition if step is not None else None
    if step is None or t is None:
        return ""
    if t.conditions:
        return " and ".join(c.name for c in t.conditions)
    if t.unless:
        return " and ".join(f"not {u.name}" for u in t.unless)
    return t.description or f"{step.trigger} from {step.source}"


async def note_decision(ctx: DeliveryContext, *, held: bool) -> None:
    """Note what this delivery decided (nothing for a request it only acked as done)."""
    request = ctx.loaded_request
    if request is None:
        return
    services = ctx.services
    roles = services.roles
    seq = ctx.delivery.stream_seq
    extra = {"queue": request.queue, "request_id": request.id}
    if held:
        reason = hold_reason(ctx.via)
        queue = ctx.loaded_queue
        holds = HELD_LOG.should_log(request.id, reason)
        if holds:
            log.info("held: %s (%d hold(s) since the last line)", reason, holds, extra=extra)
        if isinstance(services.trail, DiscardedTrail):
            return  # as note() would, without joining the holders and parameters first
        await note(
            services,
            HELD,
            request,
            tag=reason,
            stream_seq=seq,
            reason=reason,
            # Which plugins' conditions held it (a rule of the policy's own code).
            plugin=", ".join(_plugins_of(ctx.via, services.condition_origins)),
            holders=", ".join(queue.slot_holders) if queue is not None else "",
            # The effective parameters (max_concurrent, paused, ... as the policy declares
            # them) the hold was decided under.
            parameters=parameters_text(ctx.config.parameters),
        )
        return
    HELD_LOG.forget(request.id)
    if request.state in roles.superseded_states:
        log.info("superseded by %s", request.superseded_by, extra=extra)
        await note(services, SUPERSEDED, request, stream_seq=seq, by=request.superseded_by)
    elif request.state in roles.skipped_states:
        matched = skip_matches_text(ctx.skip_matches)
        log.info("skipped: %s", matched, extra=extra)
        green = ctx.loaded_queue.last_green_uri if ctx.loaded_queue is not None else ""
        await note(services, SKIPPED, request, stream_seq=seq, green=green, matched=matched)
    elif request.state in roles.admitted_states:
        log.info(
            "admitted: %s build on %s (%s)",
            request.build_strategy,
            request.base_uri or "no base",
            ctx.strategy_reason or "no reason recorded",
            extra=extra,
        )
        await note(
            services,
            ADMITTED,
            request,
            stream_seq=seq,
            strategy=request.build_strategy,
            base=request.base_uri,
            why=ctx.strategy_reason,
            **base_choice_detail(ctx),
        )


def _plugins_of(step: Step | None, origins: Mapping[str, str]) -> list[str]:
    """The plugins whose conditions the transition of ``step`` tests."""
    t = step.transition if step is not None else None
    if t is None or not origins:
        return []
    return sorted({origins[c.name] for c in t.conditions if c.name in origins})


def base_choice_detail(ctx: DeliveryContext) -> dict[str, str]:
    """The structured why of an admission's base, as noted: the green chosen
    (``base_request``), how many newer recorded greens are not ancestors of the head
    (``newer_greens_not_ancestors``) and whose ancestry was unknown
    (``greens_ancestry_unknown``), how many ancestry queries the choice took
    (``ancestry_queries``), and why the build is full (``full_cause``: cold start, no
    recorded green is an ancestor, ancestry unknown, path rule, no repository
    configured). Empty values are left out of the note."""
    choice = ctx.base_choice
    if choice is None:
        return {}
    searched = choice.asked > 0
    return {
        "base_request": choice.green.request_id if choice.green and ctx.base_uri else "",
        "newer_greens_not_ancestors": str(len(choice.passed)) if searched else "",
        "greens_ancestry_unknown": str(len(choice.unknown) or ""),
        "ancestry_queries": str(choice.asked) if searched else "",
        "full_cause": ctx.full_cause,
    }


def skip_matches_text(matches: tuple[tuple[str, str], ...]) -> str:
    """Which skip_paths glob matched which changed paths: ``docs/** (docs/a.md, docs/b.md)``."""
    by_glob: dict[str, list[str]] = {}
    for path, glob in matches:
        by_glob.setdefault(glob, []).append(path)
    return "; ".join(f"{glob} ({', '.join(paths)})" for glob, paths in by_glob.items())


async def note_reclaimed(
    ctx: DeliveryContext, holders: list[str], *, why: str = "ended, slot not yet freed"
) -> None:
    """The slots the gate took back (from requests whose end had not freed them, or whose
    lease ran out), noted on each of those requests (by the delivery that found them)."""
    reclaimed = {"by": ctx.request.id, "why": why}
    seq, queue = ctx.delivery.stream_seq, ctx.request.queue
    for holder in holders:
        await _append(ctx.services, RECLAIMED, queue, holder, reclaimed, stream_seq=seq)


async def note_failed_attempt(
    services: StageServices,
    queue: str,
    request_id: str,
    *,
    stream_seq: int,
    failures: int,
    max_attempts: int,
    retry_in_ms: int,
    error: str,
) -> None:
    """A delivery of ``request_id`` raised and is retried: the error, which attempt of the
    budget failed and when the next try is due. Keyed by the delivery and the failure
    count, so the performer noting it again after a crash writes the same record."""
    now = services.clock.now_ms()
    why = {
        "error": error,
        "attempt": failures,
        "max_attempts": max_attempts or "",
        "next_try_at_ms": now + retry_in_ms,
    }
    tag = f"{stream_seq}:{failures}"
    await _append(
        services, ATTEMPT_FAILED, queue, request_id, why, tag=tag, stream_seq=stream_seq, at_ms=now
    )


#: Detail keys a plugin note sets itself; a plugin's own pairs may not use them.
PLUGIN_NOTE_KEYS = ("plugin", "note")


async def note_plugin(ctx: DeliveryContext, origin: str, what: str, **why: object) -> None:
    """A plugin's note about the delivery's request: ``what`` it noted and why.

    Keyed by plugin, ``what`` and the request's version: noting the same thing again
    (a redelivery, a later hold of the unchanged request) is the same record.
    """
    taken = sorted(set(PLUGIN_NOTE_KEYS) & set(why))
    if taken:
        raise ValueError(f"a trail note's detail may not use the key(s) {taken}")
    if not what.strip():
        raise ValueError("a trail note needs a non-empty 'what'")
    request = ctx.request
    await note(
        ctx.services,
        PLUGIN,
        request,
        tag=f"{origin}:{what}@{request.version}",
        stream_seq=ctx.delivery.stream_seq,
        plugin=origin,
        note=what,
        **why,
    )

"""``dlq list``, ``dlq replay`` and ``dlq prune``: the dead-letter stream, for an operator.

A record's id is its sequence in the dead-letter stream (what ``list`` prints).

``replay`` never brings an ended request back. The service's dead-letter consumer fails
the request of every ``process`` record closed (its slot freed, its queue moving on), and
every guarantee after that (one admission per request, last green only forward, a
terminal request stays terminal) holds because nothing leaves a terminal state. So a
replay goes through ``retry``: a new request for the same commit, linked to the failed
one by ``retry_of``, published to the process stream like any new head. It is refused,
with the reason, for a record whose request the consumer has not failed closed yet (no
service running, or a record the service never wrote), for one whose request ended
otherwise, and when a newer head of the queue was ingested since (it is validated
instead). Refused outcomes are tallied per queue
(:mod:`...adapters.jetstream.refused_outcomes`), and ``list`` shows those tallies after the
records; a ``record`` record is an outcome an older release refused and filed as a dead
letter. Neither replaces a work message, so there is nothing to replay (report the outcome
again with ``complete``).
Replaying twice makes one new request (the retry's link finds it).

``prune`` deletes records older than an age, except a ``process`` record whose request
has not ended yet: the dead-letter consumer still has to fail it closed, or its queue
would wait on it for ever.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import nats.js.errors
from nats.js import JetStreamContext

from ...adapters.jetstream import Topology
from ...adapters.jetstream.dead_letter import DeadLetter
from ...adapters.jetstream.errors import translated
from ...adapters.jetstream.refused_outcomes import RefusalTally, read_tallies
from ...config.globs import glob_match
from ...domain.errors import IllegalOperation, NonRetryable, NotFound
from ...pipeline.queue_verbs import dlq_prune_record
from ...views.entities import aligned
from .connect import NatsOptions, connected
from .operators import utc_text
from .verbs import VerbContext, retry_with, verb_context

PROCESS_STAGE = "process"


@dataclass(frozen=True)
class StoredLetter:
    """One record of the dead-letter stream (``letter`` None: not readable as one)."""

    seq: int
    subject: str
    at_ms: int
    letter: DeadLetter | None
    problem: str = ""

    def as_json(self) -> dict[str, Any]:
        letter = self.letter
        return {
            "id": self.seq,
            "at_ms": self.at_ms,
            "subject": self.subject,
            "stage": letter.stage if letter else "",
            "queue": letter.queue if letter else "",
            "request_id": letter.request_id if letter else "",
            "reason": letter.error if letter else self.problem,
            "attempts": letter.attempts if letter else 0,
        }


def _matches(pattern: str, queue: str) -> bool:
    return not pattern or glob_match(pattern, queue)


async def read_letters(
    js: JetStreamContext, topology: Topology, queue_glob: str = ""
) -> list[StoredLetter]:
    """Every dead-letter record (of the queues ``queue_glob`` matches), oldest first."""
    stream = topology.dead_letter_stream
    with translated(f"read {stream}"):
        info = await js.stream_info(stream)
        seq, last = info.state.first_seq, info.state.last_seq
        letters = []
        while seq and seq <= last:
            try:
                msg = await js.get_msg(stream, seq, subject=f"{topology.prefix}.dlq.>", next=True)
            except nats.js.errors.NotFoundError:
                break
            at_ms = int(msg.time.timestamp() * 1000) if msg.time else 0
            found, subject = int(msg.seq or seq), str(msg.subject or "")
            try:
                stored = StoredLetter(found, subject, at_ms, DeadLetter.decode(msg.data or b""))
            except NonRetryable as exc:
                stored = StoredLetter(found, subject, at_ms, None, str(exc))
            if stored.letter is None or _matches(queue_glob, stored.letter.queue):
                letters.append(stored)
            seq = found + 1
    return letters


def render_letters(letters: list[StoredLetter]) -> str:
    """A header, then one aligned line per dead letter, oldest first."""
    if not letters:
        return "no dead letters"
    rows = []
    for s in letters:
        row = s.as_json()
        rows.append(
            (
                f"{row['id']:>6}",
                utc_text(s.at_ms),
                row["stage"] or "-",
                row["queue"] or "-",
                row["request_id"] or "-",
                str(row["attempts"]),
                str(row["reason"]),
            )
        )
    header = (f"{'id':>6}", "stored at", "stage", "queue", "request", "attempts", "reason")
    return "\n".join(aligned(header, rows, indent=""))


def render_refusals(tallies: list[RefusalTally], shown: int = 3) -> str:
    """One line per queue with refused outcomes, then its ``shown`` latest refusals."""
    lines = []
    for tally in tallies:
        reasons = ", ".join(f"{kind} {n}" for kind, n in tally.reasons)
        lines.append(
            f"refused outcomes  {tally.queue}  {tally.count} since {utc_text(tally.first_at_ms)}, "
            f"last {utc_text(tally.last_at_ms)} ({reasons})"
        )
        for r in tally.recent[-shown:]:
            lines.append(
                f"    {utc_text(r.at_ms)}  {r.request_id or '-'}  {r.outcome or '-'}  {r.reason}"
            )
    return "\n".join(lines)


@dataclass(frozen=True)
class DeadLetterListing:
    """What ``dlq list`` shows: the dead-letter records and the refused outcomes."""

    letters: list[StoredLetter]
    refusals: list[RefusalTally]

    def as_json(self) -> dict[str, Any]:
        return {
            "dead_letters": [s.as_json() for s in self.letters],
            "refused_outcomes": [t.as_json() for t in self.refusals],
        }

    def render(self) -> str:
        letters, refused = render_letters(self.letters), render_refusals(self.refusals)
        return f"{letters}\n{refused}" if refused else letters


async def list_letters(
    options: NatsOptions, topology: Topology, queue_glob: str
) -> DeadLetterListing:
    async with connected(options) as nc:
        js = nc.jetstream()
        tallies = await read_tallies(js, topology)
        return DeadLetterListing(
            await read_letters(js, topology, queue_glob),
            [t for t in tallies if _matches(queue_glob, t.queue)],
        )


async def _replay_one(ctx: VerbContext, stored: StoredLetter, by: str) -> dict[str, Any]:
    """Replay ``stored`` through retry; ``IllegalOperation`` saying why it cannot be."""
    letter = stored.letter
    if letter is None:
        raise IllegalOperation(f"dead letter {stored.seq} is not readable: {stored.problem}")
    if letter.stage != PROCESS_STAGE:
        raise IllegalOperation(
            f"dead letter {stored.seq} is a refused {letter.stage} outcome, not work: nothing "
            "to replay; report the outcome again with complete"
        )
    if not letter.request_id:
        raise IllegalOperation(f"dead letter {stored.seq} names no request")
    try:
        request = await ctx.stores.requests.get(letter.request_id)
    except NotFound:
        raise IllegalOperation(
            f"dead letter {stored.seq}: request {letter.request_id} no longer exists (pruned)"
        ) from None
    if not ctx.lifecycle.is_terminal(request):
        raise IllegalOperation(
            f"dead letter {stored.seq}: request {request.id} is still {request.state}; the "
            "service's dead-letter consumer has not failed it closed yet (is a service "
            "running?), and a replay never runs beside it"
        )
    answer = await retry_with(ctx, request.id, by, verb="dlq replay")
    # The retry's own trail record says "dlq replay" (one record per request, however
    # many of its dead letters are replayed).
    return {"id": stored.seq, "replayed": True, **answer}


async def replay(
    options: NatsOptions, topology: Topology, letter_id: int | None, queue_glob: str, by: str
) -> dict[str, Any]:
    """Replay one record (``letter_id``; refused: ``IllegalOperation``), or every record
    of the queues ``queue_glob`` matches (each refusal reported, none raised)."""
    async with verb_context(options, topology) as ctx:
        letters = await read_letters(ctx.js, topology, queue_glob)
        if letter_id is not None:
            chosen = [s for s in letters if s.seq == letter_id]
            if not chosen:
                raise NotFound(f"no dead letter {letter_id} in {topology.dead_letter_stream}")
            return await _replay_one(ctx, chosen[0], by)
        done: list[dict[str, Any]] = []
        skipped: list[dict[str, Any]] = []
        for stored in letters:
            try:
                done.append(await _replay_one(ctx, stored, by))
            except IllegalOperation as exc:
                skipped.append({"id": stored.seq, "why": str(exc)})
        return {"replayed": done, "skipped": skipped}


async def prune(
    options: NatsOptions,
    topology: Topology,
    older_than_s: float,
    queue_glob: str,
    by: str,
    *,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Delete the records older than ``older_than_s`` (see the module docstring)."""
    cutoff_ms = int((time.time() - older_than_s) * 1000)
    async with verb_context(options, topology) as ctx:
        letters = await read_letters(ctx.js, topology, queue_glob)
        pruned: list[int] = []
        kept: list[dict[str, Any]] = []
        for stored in letters:
            if stored.at_ms >= cutoff_ms:
                continue
            letter = stored.letter
            if letter is not None and letter.stage == PROCESS_STAGE and letter.request_id:
                try:
                    request = await ctx.stores.requests.get(letter.request_id)
                except NotFound:
                    request = None
                if request is not None and not ctx.lifecycle.is_terminal(request):
                    kept.append(
                        {
                            "id": stored.seq,
                            "why": f"request {request.id} is still {request.state}: not "
                            "failed closed yet",
                        }
                    )
                    continue
            if not dry_run:
                # NotFound: deleted meanwhile (a concurrent prune).
                with (
                    translated(f"delete dead letter {stored.seq}"),
                    contextlib.suppress(nats.js.errors.NotFoundError),
                ):
                    await ctx.js.delete_msg(topology.dead_letter_stream, stored.seq)
            pruned.append(stored.seq)
        if pruned and not dry_run:
            now_ms = int(time.time() * 1000)
            await ctx.trail.append(dlq_prune_record(queue_glob, pruned, older_than_s, by, now_ms))
    return {"dry_run": dry_run, "pruned": pruned, "kept": kept}

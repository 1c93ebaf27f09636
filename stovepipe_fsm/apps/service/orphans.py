"""Process messages nobody will ever consume: found, dead-lettered and counted.

Ingest creates a queue's row before it publishes the queue's first message, and the
service starts a consumer for every queue row. A message on a process subject whose
queue has no row (published by hand or by a broken producer, or on a subject token that
decodes to no valid queue name) therefore has no consumer and would sit in the work-queue
stream for ever. Each discovery round lists the stream's subjects *before* reading the
queue rows (so a queue created in between is never mistaken for an orphan), and every
message on a subject that no consumer serves gets the same treatment as a poison
message: a termination mark, a bounded dead-letter record, then it is deleted from the
stream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from nats.js import JetStreamContext

from ...adapters.jetstream import Topology
from ...adapters.jetstream.dead_letter import DeadLetter, publish_dead_letter
from ...adapters.jetstream.partitions import delete_stored, stored_messages
from ...adapters.jetstream.terminations import TerminationLedger, TerminationMark
from ...domain.bounded_text import clip

log = logging.getLogger("stovepipe_fsm.service")

#: The most messages of one subject dead-lettered per round: a flood is worked off over
#: several rounds instead of stalling discovery.
MAX_PER_SUBJECT = 100


def orphan_subjects(
    topology: Topology, subjects: dict[str, int], served: Collection[str]
) -> dict[str, str]:
    """``{subject: queue}`` of the subjects no consumer serves; the queue is the decoded
    name, or the raw token when it decodes to none."""
    head = _head(topology)
    out = {}
    for subject in subjects:
        try:
            queue = topology.queue_of_process_subject(subject)
        except ValueError:
            out[subject] = subject[len(head) :] if subject.startswith(head) else subject
            continue
        if queue not in served:
            out[subject] = queue
    return out


async def dead_letter_orphans(
    js: JetStreamContext,
    topology: Topology,
    terminations: TerminationLedger,
    orphans: dict[str, str],
    observe: Callable[[str, str, str, str], None],
) -> int:
    """Dead-letter the messages of ``orphans`` (at most :data:`MAX_PER_SUBJECT` each);
    how many were."""
    done = 0
    for subject, queue in sorted(orphans.items()):
        stream = topology.process_stream_of_subject(subject)
        async for raw in stored_messages(js, stream, subject, MAX_PER_SUBJECT):
            seq = int(raw.seq or 0)
            reason = f"no queue row for {clip(queue, 200)!r}: no consumer serves its subject"
            letter = DeadLetter.bounded(queue, "", reason, 0, seq)
            await terminations.mark(seq, TerminationMark(letter.queue, ""))
            token = subject[len(_head(topology)) :]
            dlq_subject = f"{topology.prefix}.dlq.process.{token}"
            await publish_dead_letter(js, topology, letter, subject=dlq_subject)
            if not await delete_stored(js, stream, seq):
                # Two discovery rounds at once (the loop's and one a reconnect or a
                # publish started): the other deleted it, after the same mark and the
                # same dead letter (its msg id dedupes), and counted it.
                continue
            observe("orphan", queue, "", reason)
            log.error("orphan dead-lettered: %s", reason, extra={"queue": clip(queue, 200)})
            done += 1
    return done


def _head(topology: Topology) -> str:
    return f"{topology.prefix}.process."

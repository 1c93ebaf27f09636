"""Removing terminal requests older than a bound, with their uri-index entries.

A request's age is that of its KV entry: the time the server stored its last write, which
for a terminal request is the moment it became terminal (a terminal request is never
written again). Rows an older release wrote carry no ``ended_at_ms``; the KV time covers
them all alike.

What is never removed, whatever its age:

- a request in a state the request machine does not declare ``terminal``;
- a request a queue row names: the queue's latest request, its last green request, or a
  slot holder (a terminal slot holder is a record or reclaim still in progress);
- a request a culprit search row names: its red head (whose trail tells the search) and
  the probes it lists in flight (a listed probe whose request is missing is started again);
- a row that does not decode (left for an operator to look at).

The uri-index entry goes first, then the request, each only if unchanged since it was
read (a conditional delete): a crash between the two leaves a request without its entry,
which the next prune removes. Once a head's entry is gone, the same head reported again
is ingested as a new request, so the bound should be well beyond how late the upstream
stage may repeat a head.

A KV delete leaves a marker on its key, kept for ever unless removed. Each prune then
removes the markers of both buckets older than ``MARKER_KEEP_S`` (the previous runs'):
a purge of the marker's key up to the marker itself, so a value written to that key
since (the same head ingested again) stays. Nothing reads a marker: a read of a key
without one is the same miss, and a create that raced a removal retries.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection
from dataclasses import dataclass, field

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from ...domain.errors import NonRetryable
from .bulk import REMOVED_OPERATIONS, BucketRow, StoredMessage, kv_entries, values_of
from .codec import decode_queue, decode_request, decode_search, decode_uri_entry
from .errors import is_wrong_last_sequence, translated
from .names import uri_key
from .topology import Topology

#: Delete markers younger than this are left for the next prune.
MARKER_KEEP_S = 600.0


@dataclass
class PruneReport:
    """What a prune found and did, by request id."""

    pruned: list[str] = field(default_factory=list)
    #: Terminal and old enough, but named by a queue row.
    referenced: list[str] = field(default_factory=list)
    #: Changed between the read and the delete (so not removed this time).
    changed: list[str] = field(default_factory=list)
    #: Keys whose row does not decode.
    undecodable: list[str] = field(default_factory=list)
    live: int = 0
    recent: int = 0
    #: Delete markers removed (of requests and uri entries pruned by earlier runs).
    purged_markers: int = 0

    def as_json(self) -> dict[str, object]:
        return {
            "pruned": self.pruned,
            "kept_referenced": self.referenced,
            "kept_changed": self.changed,
            "kept_undecodable": self.undecodable,
            "kept_live": self.live,
            "kept_recent": self.recent,
            "purged_markers": self.purged_markers,
        }


async def prune_terminal_requests(
    js: JetStreamContext,
    topology: Topology,
    terminal_states: Collection[str],
    older_than_s: float,
    *,
    now: datetime.datetime | None = None,
    dry_run: bool = False,
    keep_markers_s: float = MARKER_KEEP_S,
) -> PruneReport:
    """Remove terminal requests stored more than ``older_than_s`` ago, then the delete
    markers stored more than ``keep_markers_s`` ago (see the module)."""
    if older_than_s <= 0:
        raise ValueError(f"the age bound must be positive, got {older_than_s}s")
    if not terminal_states:
        raise ValueError("no terminal states: the request machine declares none")
    now = now or datetime.datetime.now(datetime.UTC)
    cutoff = now - datetime.timedelta(seconds=older_than_s)
    referenced = await _referenced_ids(js, topology)
    uris = await _kv(js, topology.uris_bucket)
    requests = await _kv(js, topology.requests_bucket)
    report = PruneReport()
    stored = await kv_entries(js, topology.requests_bucket)
    for row in values_of(topology.requests_bucket, stored):
        try:
            request = decode_request(row.value)
        except NonRetryable:
            report.undecodable.append(row.key)
            continue
        if request.state not in terminal_states:
            report.live += 1
        elif row.stored > cutoff:
            report.recent += 1
        elif request.id in referenced:
            report.referenced.append(request.id)
        elif dry_run or await _remove(
            uris, requests, request.id, uri_key(request.queue, request.uri), row
        ):
            report.pruned.append(request.id)
        else:
            report.changed.append(request.id)
    if not dry_run:
        markers_before = now - datetime.timedelta(seconds=keep_markers_s)
        report.purged_markers = await _purge_markers(
            js, topology.requests_bucket, stored, markers_before
        ) + await _purge_markers(
            js, topology.uris_bucket, await kv_entries(js, topology.uris_bucket), markers_before
        )
    return report


async def _referenced_ids(js: JetStreamContext, topology: Topology) -> set[str]:
    ids: set[str] = set()
    for row in values_of(topology.queues_bucket, await kv_entries(js, topology.queues_bucket)):
        try:
            queue = decode_queue(row.value)
        except NonRetryable:
            continue
        ids.update((queue.latest_request_id, queue.last_green_request_id, *queue.slot_holders))
        ids.update(green.request_id for green in queue.recent_greens)
    for row in values_of(topology.searches_bucket, await kv_entries(js, topology.searches_bucket)):
        try:
            search = decode_search(row.value)
        except NonRetryable:
            continue
        ids.add(search.red_request_id)
        ids.update(probe.request_id for probe in search.probes)
    ids.discard("")
    return ids


async def _purge_markers(
    js: JetStreamContext, bucket: str, entries: list[StoredMessage], before: datetime.datetime
) -> int:
    """Remove the delete markers among ``entries`` stored before ``before``; how many.

    Each purge removes its key's messages up to the marker's sequence only, so a value
    written since (a higher sequence) is kept."""
    purged = 0
    for entry in entries:
        if entry.operation in REMOVED_OPERATIONS and entry.stored < before:
            with translated(f"purge the delete marker of {entry.subject}"):
                await js.purge_stream(f"KV_{bucket}", seq=entry.sequence + 1, subject=entry.subject)
            purged += 1
    return purged


async def _remove(
    uris: KeyValue, requests: KeyValue, request_id: str, key: str, row: BucketRow
) -> bool:
    """Delete the request's uri entry (if it names the request), then the request; ``False``
    when the request changed since it was read."""
    with translated(f"prune {request_id}"):
        try:
            entry = await uris.get(key)
        except nats.js.errors.KeyNotFoundError:
            entry = None
        if entry is not None and entry.revision is not None:
            try:
                names_it = decode_uri_entry(entry.value).request_id == request_id
            except NonRetryable:
                names_it = False
            if names_it:
                await _delete(uris, key, entry.revision)
        return await _delete(requests, row.key, row.revision)


async def _kv(js: JetStreamContext, bucket: str) -> KeyValue:
    with translated(f"open bucket {bucket}"):
        return await js.key_value(bucket)


async def _delete(kv: KeyValue, key: str, revision: int) -> bool:
    """Delete ``key`` if its latest revision is still ``revision``."""
    try:
        await kv.delete(key, last=revision)
    except nats.js.errors.APIError as exc:
        if is_wrong_last_sequence(exc):
            return False
        raise
    return True

"""Operator pauses: ``pause``/``resume`` a queue or a glob of queues, kept in the broker.

A pause is a key ``pause.<token>`` in the service bucket naming a queue or a glob (the
same patterns as ``config/queues.yaml``), with who paused it, when and why. It needs no
config edit and survives restarts. The service reads the pauses every policy check
(once a second) and serves its stages a config in which every queue a pause matches has
the policy's ``paused`` parameter set, so the policy's own pause condition holds the
queue's heads from its next wake-up on: within one hold delay. Only a policy that
declares ``paused`` can be paused this way (:func:`operator_pause` refuses otherwise,
naming the policy in force), and each ``pause`` and ``resume`` an operator runs leaves a
decision-trail record (:mod:`...pipeline.queue_verbs`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext

from ...adapters.jetstream import Topology, ensure_topology
from ...adapters.jetstream.bulk import kv_snapshot
from ...adapters.jetstream.decision_trail import JetStreamTrail
from ...adapters.jetstream.errors import translated
from ...adapters.jetstream.names import encode_name_token
from ...adapters.jetstream.policy_record import read_policy_record
from ...config.globs import glob_match, is_pattern
from ...domain.entities import QueueConfig
from ...domain.queue_names import normalize_queue_name
from ...pipeline.queue_verbs import pause_record, refuse_unpausable, resume_record
from ...ports.config import ConfigStore
from ...process.gate import PAUSED

PAUSE_KEY_PREFIX = "pause."


@dataclass(frozen=True)
class Pause:
    pattern: str
    at_ms: int
    reason: str = ""
    by: str = ""

    def matches(self, queue: str) -> bool:
        # Asked at every config read while any pause stands: a plain name by equality.
        if not is_pattern(self.pattern):
            return self.pattern == queue
        return glob_match(self.pattern, queue)


def checked_pattern(pattern: str) -> str:
    """A queue name (normalised) or a glob; ``ValueError`` saying what is wrong."""
    if not pattern:
        raise ValueError("give a queue name or a glob of queue names")
    if is_pattern(pattern):
        if len(pattern) > 512 or any(c.isspace() or ord(c) < 32 for c in pattern):
            raise ValueError(f"{pattern[:64]!r} is not a usable glob")
        return pattern
    return normalize_queue_name(pattern)


def _key(pattern: str) -> str:
    return PAUSE_KEY_PREFIX + encode_name_token(pattern)


def pause_write_subjects(topology: Topology) -> str:
    """The subjects a write of any pause key goes by (a put, a delete): a plain
    subscription to them learns of a ``pause``/``resume`` as it happens."""
    return f"$KV.{topology.service_bucket}.{PAUSE_KEY_PREFIX}>"


async def _bucket(js: JetStreamContext, topology: Topology) -> Any:
    with translated(f"open {topology.service_bucket}"):
        return await js.key_value(topology.service_bucket)


async def pause(
    js: JetStreamContext, topology: Topology, pattern: str, *, reason: str = "", by: str = ""
) -> tuple[Pause, bool]:
    """Pause ``pattern``; the pause in force and whether it was new (False: already)."""
    pattern = checked_pattern(pattern)
    current = {p.pattern: p for p in await read_pauses(js, topology)}
    if pattern in current:
        return current[pattern], False
    record = Pause(pattern, int(time.time() * 1000), reason[:500], by[:200])
    kv = await _bucket(js, topology)
    with translated(f"pause {pattern}"):
        await kv.put(_key(pattern), json.dumps(record.__dict__, sort_keys=True).encode())
    return record, True


async def resume(js: JetStreamContext, topology: Topology, pattern: str) -> bool:
    """Remove the pause of exactly ``pattern``; False when there was none."""
    pattern = checked_pattern(pattern)
    if pattern not in {p.pattern for p in await read_pauses(js, topology)}:
        return False
    kv = await _bucket(js, topology)
    with translated(f"resume {pattern}"):
        await kv.delete(_key(pattern))
    return True


async def operator_pause(
    js: JetStreamContext, topology: Topology, pattern: str, *, reason: str, by: str
) -> tuple[Pause, bool]:
    """``pause`` as an operator runs it: refused where the policy in force reads no pause,
    then :func:`pause`, then its trail record (the same record when run again)."""
    await ensure_topology(js, topology)
    record = await read_policy_record(js, topology)
    refuse_unpausable(record.parameters if record else (), record.hash if record else "")
    done, new = await pause(js, topology, pattern, reason=reason, by=by)
    trail = pause_record(done.pattern, done.at_ms, by, done.reason)
    await JetStreamTrail(js, topology).append(trail)
    return done, new


async def operator_resume(js: JetStreamContext, topology: Topology, pattern: str, by: str) -> bool:
    """``resume`` as an operator runs it: :func:`resume`, and a trail record of the pause
    it lifted; False when ``pattern`` was not paused."""
    pattern = checked_pattern(pattern)
    was = {p.pattern: p for p in await read_pauses(js, topology)}.get(pattern)
    lifted = await resume(js, topology, pattern)
    if lifted and was is not None:
        trail = resume_record(pattern, was.at_ms, by, int(time.time() * 1000))
        await JetStreamTrail(js, topology).append(trail)
    return lifted


async def read_pauses(js: JetStreamContext, topology: Topology) -> list[Pause]:
    """Every pause in force, by pattern (none when the bucket does not exist yet)."""
    with translated(f"read pauses in {topology.service_bucket}"):
        # Only the pause keys, in one pass: the bucket also holds a row per queue, which
        # a listing of every key would stream through here on every policy check.
        pauses = []
        for _, value in await kv_snapshot(js, topology.service_bucket, PAUSE_KEY_PREFIX + ">"):
            try:
                data = json.loads(value)
                pauses.append(
                    Pause(
                        str(data["pattern"]),
                        int(data["at_ms"]),
                        str(data.get("reason", "")),
                        str(data.get("by", "")),
                    )
                )
            except (ValueError, KeyError, TypeError):
                continue  # not one of ours
    return sorted(pauses, key=lambda p: p.pattern)


class PausableConfig:
    """The service's config with the operator pauses applied: a queue a pause matches has
    ``paused`` set, where the policy declares it."""

    def __init__(self, inner: ConfigStore, declared: Mapping[str, Any]) -> None:
        self.inner = inner
        self.declared = declared
        self.pauses: tuple[Pause, ...] = ()

    def get(self, queue: str) -> QueueConfig:
        config = self.inner.get(queue)
        if self.pauses and PAUSED in self.declared and self.paused(queue):
            return config.with_parameters({PAUSED: True})
        return config

    def paused(self, queue: str) -> bool:
        return any(p.matches(queue) for p in self.pauses)

    def configured_queues(self) -> tuple[str, ...]:
        return self.inner.configured_queues()

    def __getattr__(self, name: str) -> Any:
        # The reloadable file store's own attributes (last_error, source, ...).
        return getattr(self.inner, name)

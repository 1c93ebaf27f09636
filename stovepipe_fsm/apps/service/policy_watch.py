"""The policy a service has in force: its reloads, the operator pauses, and what the
service bucket records of both.

- With a :class:`~.policy.PolicyReloader`, the policy is checked every
  ``policy_check_interval_s``: a new machines version that passes its checks is swapped
  in between deliveries (every consumer reaches the stages through
  :attr:`~.broker_pipeline.Pipeline.stages`, one reference).
- The operator pauses are read once a second, and at once when a pause key is written
  (:meth:`PolicyWatch.on_pause_write`); the stages read a config with them applied
  (:class:`~.pauses.PausableConfig`).
- The policy record (hash, the request machine's roles) is written on start and on every
  reload, so operator commands read the policy in force; the effective parameters of
  each queue this replica serves are written as ``status`` shows them, again when the
  policy or the pauses change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from ...adapters.jetstream import Topology
from ...adapters.jetstream.errors import translated
from ...adapters.jetstream.policy_record import (
    read_queue_parameters,
    stored_parameters,
    write_policy_record,
    write_queue_parameters,
)
from ...process.catalog import ProcessMachines
from .broker_pipeline import Pipeline
from .pauses import PausableConfig, read_pauses
from .policy import PolicyReloader, policy_record
from .tasks import ServiceTasks

log = logging.getLogger("stovepipe_fsm.service")

#: After a pause write is announced, the pauses are read at once and, while the read
#: finds nothing new (the write not stored yet), again after these pauses.
PAUSE_WRITE_RETRIES_S = (0.0, 0.05, 0.2, 0.5)


def hash_in_force(reloader: PolicyReloader | None) -> str:
    """The hash of the policy in force; empty for a service given no policy paths."""
    return reloader.hash if reloader is not None else ""


@dataclass(eq=False)
class PolicyWatch:
    """The machines and pauses in force, kept current, and recorded in the broker."""

    js: JetStreamContext
    topology: Topology
    pipeline: Pipeline
    #: The config the stages read; this is its one writer (declarations, pauses).
    config: PausableConfig
    tasks: ServiceTasks
    _: KW_ONLY
    machines: ProcessMachines
    reloader: PolicyReloader | None
    replica: str
    check_interval_s: float
    concurrency: int
    #: One policy check at a time, in its thread.
    _reloading: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)
    #: Pause keys written since start, as the service bucket's subjects announced them,
    #: and one refresh at a time (a refresh that read before a write never lands after
    #: one that read after it).
    _pause_writes: int = field(init=False, default=0)
    _pauses_read: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)
    #: The queues whose parameters this replica records: those it opened a consumer of.
    _served: set[str] = field(init=False, default_factory=set)
    #: The parameters in the service bucket, by queue, as last read or written.
    _recorded: dict[str, dict[str, object]] = field(init=False, default_factory=dict)
    _service_kv: KeyValue | None = field(init=False, default=None)
    #: The refusal (and whether it was current) the last record written carries.
    _recorded_refusal: tuple[object, bool] = field(init=False, default=(None, False))

    async def start(self) -> None:
        """Record the policy (operator commands such as ingest read it) and take up the
        pauses, before any consumer runs; then check the pauses every interval."""
        if self.reloader is not None:
            log.info("policy %s in force", self.reloader.hash)
        await self._record_policy()
        self._recorded = await self._read_recorded_parameters()
        await self.refresh_pauses()
        self.tasks.spawn(
            "pauses", self.tasks.every(self.check_interval_s, self.refresh_pauses, "pause")
        )

    def watch(self) -> None:
        """Check the policy for edits every interval (with a reloader)."""
        if self.reloader is not None:
            self.tasks.spawn(
                "policy", self.tasks.every(self.check_interval_s, self.reload, "policy")
            )

    async def reload(self) -> bool:
        """Take up an edit of the policy now; True when a new policy is in force."""
        assert self.reloader is not None, "a service given its policy paths"
        # Reading and validating files is blocking work of unbounded size in principle:
        # a worker thread does it (one check at a time), the loop keeps serving queues.
        async with self._reloading:
            change = await asyncio.to_thread(self.reloader.check)
        if change is None:
            if self._recorded_refusal != self._refusal_now():
                await self._record_policy()  # status and /policy show the refused edit
            return False
        if change.machines is not None:
            self.pipeline.swap(change.machines)
            self.machines = change.machines
            self.config.declared = change.machines.parameters
        await self._record_policy()
        await self._record_all_parameters()
        return True

    async def refresh_pauses(self) -> bool:
        """Take up the operator pauses in the broker now; True when they changed."""
        async with self._pauses_read:
            pauses = tuple(await read_pauses(self.js, self.topology))
            if pauses == self.config.pauses:
                return False
            self.config.pauses = pauses
            log.info("operator pauses in force: %s", [p.pattern for p in pauses] or "none")
            await self._record_all_parameters()
            return True

    async def on_pause_write(self, msg: Any) -> None:
        """A ``pause``/``resume`` wrote a pause key: take the pauses up now rather than
        at the next once-a-second read, which stays as the backstop."""
        self._pause_writes += 1
        self.tasks.spawn_once("pauses-now", self._take_up_pause_writes())

    async def _take_up_pause_writes(self) -> None:
        """Read the pauses until every announced write has been looked for.

        The announcement can reach this subscription before the bucket's stream has
        stored the write (on a cluster, before the stream's leader commits it), so a read
        that finds nothing new is tried again a little later, a few times; the
        once-a-second read catches anything later still.
        """
        seen = -1
        while seen != self._pause_writes and not self.tasks.stopping:
            seen = self._pause_writes
            for pause_s in PAUSE_WRITE_RETRIES_S:
                await asyncio.sleep(pause_s)
                try:
                    if await self.refresh_pauses():
                        break
                except Exception as exc:  # the backstop read tries again
                    log.warning("pause check failed: %s: %s", type(exc).__name__, exc)
                    return

    async def record_parameters(self, queue: str) -> None:
        """What ``status`` shows as the queue's effective parameters (best effort); not
        written again when the bucket holds them already. The queue is recorded again
        whenever the policy or the pauses change."""
        self._served.add(queue)
        try:
            config = self.config.get(queue)
            values: dict[str, object] = dict(self.machines.parameter_defaults)
            values.update(dict(config.parameters))
            values["max_attempts"] = config.max_attempts
            stored = stored_parameters(values)
            if self._recorded.get(queue) == stored:
                return
            if self._service_kv is None:
                with translated(f"open bucket {self.topology.service_bucket}"):
                    self._service_kv = await self.js.key_value(self.topology.service_bucket)
            await write_queue_parameters(self.js, self.topology, queue, values, kv=self._service_kv)
            self._recorded[queue] = stored
        except Exception as exc:  # status shows the previous values until the next write
            log.warning(
                "queue parameters not recorded: %s: %s",
                type(exc).__name__,
                exc,
                extra={"queue": queue},
            )

    async def _record_all_parameters(self) -> None:
        gate = asyncio.Semaphore(self.concurrency)

        async def record(queue: str) -> None:
            async with gate:
                await self.record_parameters(queue)

        await asyncio.gather(*(record(queue) for queue in sorted(self._served)))

    async def _read_recorded_parameters(self) -> dict[str, dict[str, object]]:
        try:
            return await read_queue_parameters(self.js, self.topology)
        except Exception as exc:  # every queue's parameters are then written again
            log.warning("queue parameters not read: %s: %s", type(exc).__name__, exc)
            return {}

    def _refusal_now(self) -> tuple[object, bool]:
        reloader = self.reloader
        return (reloader.refusal, reloader.refused_now) if reloader else (None, False)

    async def _record_policy(self) -> None:
        now_ms = int(time.time() * 1000)
        hash_ = hash_in_force(self.reloader)
        record = policy_record(self.machines, hash_, self.replica, now_ms, self.reloader)
        self._recorded_refusal = self._refusal_now()
        try:
            await write_policy_record(self.js, self.topology, record)
        except Exception as exc:  # status shows an older hash until the next write
            log.warning("policy record not written: %s: %s", type(exc).__name__, exc)

"""Pruning terminal requests (and their uri-index entries) older than an age: by the
service every ``prune_interval_s``, or once by the ``prune`` command. Terminal is what
the request machine in force declares."""

from __future__ import annotations

import logging

from nats.js import JetStreamContext

from ...adapters.jetstream import Topology
from ...adapters.jetstream.policy_record import read_policy_record
from ...adapters.jetstream.prune import PruneReport, prune_terminal_requests
from ...pipeline.policy_in_force import terminal_states
from .policy_watch import PolicyWatch
from .tasks import ServiceTasks

log = logging.getLogger("stovepipe_fsm.service")


class Retention:
    """The prune of one service."""

    def __init__(
        self,
        js: JetStreamContext,
        topology: Topology,
        policy: PolicyWatch,
        tasks: ServiceTasks,
        *,
        older_than_s: float,
        interval_s: float,
    ) -> None:
        self.js = js
        self.topology = topology
        self.policy = policy
        self.tasks = tasks
        self.older_than_s = older_than_s
        self.interval_s = interval_s

    async def prune(self) -> PruneReport:
        """Remove the terminal requests older than ``older_than_s`` now."""
        terminal = self.policy.machines.request.terminal
        report = await prune_terminal_requests(self.js, self.topology, terminal, self.older_than_s)
        if report.pruned:
            log.info("pruned %d terminal request(s)", len(report.pruned))
        return report

    async def run(self) -> None:
        """Prune now, then every interval, until stopped."""
        while not self.tasks.stopping:
            try:
                await self.prune()
            except Exception as exc:  # the broker may be reconnecting; try next round
                log.warning("prune failed: %s: %s", type(exc).__name__, exc)
            await self.tasks.idle(self.interval_s)


async def operator_prune(
    js: JetStreamContext,
    topology: Topology,
    machines_dir: str,
    older_than_s: float,
    *,
    dry_run: bool = False,
) -> PruneReport:
    """The ``prune`` command: terminal is what the policy in force declares (the service
    records it), or, where no service ran yet, the request machine under ``machines_dir``."""
    record = await read_policy_record(js, topology)
    terminal = terminal_states(record.terminal_states if record else (), machines_dir)
    return await prune_terminal_requests(js, topology, terminal, older_than_s, dry_run=dry_run)

"""Pruning terminal requests (and their uri-index entries) older than an age, every
``prune_interval_s``; terminal is what the request machine in force declares."""

from __future__ import annotations

import logging

from nats.js import JetStreamContext

from ...adapters.jetstream import Topology
from ...adapters.jetstream.prune import PruneReport, prune_terminal_requests
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

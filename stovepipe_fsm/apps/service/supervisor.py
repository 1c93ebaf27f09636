"""The service: the process stage wired on JetStream, one consumer per queue.

This is :class:`~stovepipe_fsm.simulation.world.World` with real adapters: KV stores,
the JetStream publisher, the file config store (hot reload), git ancestry per queue's
``repository`` and the broker's clock (:mod:`...adapters.jetstream.broker_clock`: this
replica's clock set to the broker's, so leases mean the same on every replica).
:class:`Service` is a supervisor: it opens the
:class:`~.broker_pipeline.Pipeline`, wires its collaborators on it once, starts them in
order and stops them. Each owns its state:

- :class:`~.policy_watch.PolicyWatch`: the machines and operator pauses in force, their
  reloads, and the policy record and queue parameters in the service bucket;
- :class:`~.queue_consumers.QueueConsumers`: one consumer per queue, on the partition
  its row names, and the queues refused one;
- :class:`~.discovery.Discovery`: the queues to serve (a publish, a round every
  ``discover_interval_s``), and the orphan messages no queue will take;
- :class:`~.wakeups.Wakeups`: the plain subscriptions and reconnects that renew parked
  pull requests at once;
- :class:`~.health.Health`: the heartbeat, the health check and the runtime events;
- a :class:`DeadLetterConsumer` that fails dead-lettered requests closed, and an
  :class:`OutcomeConsumer` that records build outcomes with the policy in force;
- :class:`~.unpublished.UnpublishedHeads`: heads an ingest cut short left with no
  process message, published;
- with ``prune_older_than_s``, the prune of old terminal requests (as ``prune`` does).

Stopping is graceful: runners finish (or hand back) the message in hand, then the
subscriptions are drained. Nothing here holds state a replica could lose: all of it is in
JetStream, so any number of replicas may run against the same broker.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass

from nats.aio.client import Client

from ...adapters.jetstream import Topology
from ...adapters.jetstream.broker_clock import SYNC_INTERVAL_S, BrokerClock
from ...adapters.jetstream.consumer import DeadLetterConsumer, Observer
from ...adapters.jetstream.outcome_consumer import OutcomeConsumer
from ...adapters.jetstream.prune import prune_terminal_requests
from ...adapters.jetstream.shared_inbox import SharedInbox
from ...adapters.memory import SystemClock
from ...ports.clock import Clock
from ...ports.config import ConfigStore
from ...ports.source_control import SourceControlProvider
from ...process.catalog import ProcessMachines
from ...process.metrics import Metrics
from .broker_pipeline import Pipeline, open_pipeline
from .connect import ConnectionErrors
from .discovery import Discovery
from .health import Health
from .pauses import PausableConfig
from .policy import PolicyReloader
from .policy_watch import PolicyWatch, hash_in_force
from .queue_consumers import QueueConsumers
from .service_options import ServiceOptions
from .tasks import ServiceTasks
from .unpublished import UnpublishedHeads
from .wakeups import Wakeups

log = logging.getLogger("stovepipe_fsm.service")


@dataclass(frozen=True)
class Crew:
    """The collaborators of a started service, wired once on its pipeline."""

    pipeline: Pipeline
    policy: PolicyWatch
    dead_letters: DeadLetterConsumer
    outcomes: OutcomeConsumer
    queues: QueueConsumers
    discovery: Discovery
    wakeups: Wakeups
    unpublished: UnpublishedHeads


class Service:
    """Runs the process stage against one JetStream until stopped."""

    def __init__(
        self,
        nc: Client,
        topology: Topology,
        machines: ProcessMachines,
        config: ConfigStore,
        *,
        source_control: SourceControlProvider | None = None,
        clock: Clock | None = None,
        options: ServiceOptions | None = None,
        observer: Observer | None = None,
        reloader: PolicyReloader | None = None,
        connection_errors: ConnectionErrors | None = None,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.topology = topology
        self.options = options or ServiceOptions()
        self.reloader = reloader
        self.replica = f"{socket.gethostname()}:{os.getpid()}"
        self._machines = machines
        self._source_control = source_control
        #: Every time the stages read (leases included): ``clock`` (this replica's own,
        #: the system clock by default) set to the broker's.
        self.clock = BrokerClock(
            self.js, f"KV_{topology.queues_bucket}", clock if clock is not None else SystemClock()
        )
        self._connection_errors = connection_errors
        #: The config the stages read: the policy's, with operator pauses applied.
        self.config = PausableConfig(config, machines.parameters)
        self.metrics = Metrics()
        self.tasks = ServiceTasks()
        self.health = Health(
            nc,
            self.tasks,
            heartbeat_interval_s=self.options.heartbeat_interval_s,
            health_window_s=self.options.health_window_s,
            observer=observer,
        )
        self._crew: Crew | None = None

    # -- wiring -----------------------------------------------------------------------

    def _wire(self, pipeline: Pipeline) -> Crew:
        """Every collaborator, each given what it uses; nothing is rewired later."""
        assert pipeline.ports is not None, "a pipeline opened by open_pipeline"
        js, topology, options, tasks = self.js, self.topology, self.options, self.tasks
        observe = self.health.observe
        policy = PolicyWatch(
            js,
            topology,
            pipeline,
            self.config,
            tasks,
            machines=self._machines,
            reloader=self.reloader,
            replica=self.replica,
            check_interval_s=options.policy_check_interval_s,
            concurrency=options.open_concurrency,
        )
        dead_letters = DeadLetterConsumer(
            js,
            topology,
            pipeline.reconcile,
            terminations=pipeline.terminations,
            observer=observe,
            fetch_timeout_s=options.fetch_timeout_s,
            ack_wait_s=options.ack_wait_s,
        )
        outcomes = OutcomeConsumer(
            js,
            topology,
            pipeline.record_outcome,
            observer=observe,
            ack_wait_s=options.ack_wait_s,
            fetch_timeout_s=options.fetch_timeout_s,
            retry_base_s=options.retry_base_s,
            retry_cap_s=options.retry_cap_s,
        )
        queues = QueueConsumers(
            js,
            topology,
            pipeline,
            self.config,
            tasks,
            SharedInbox(self.nc),
            options=options,
            observe=observe,
            rows=pipeline.ports.queues,
            opened=policy.record_parameters,
        )
        discovery = Discovery(
            js,
            topology,
            queues,
            self.config,
            tasks,
            rows=pipeline.ports.queues,
            terminations=pipeline.terminations,
            observe=observe,
            interval_s=options.discover_interval_s,
        )
        wakeups = Wakeups(
            self.nc,
            topology,
            queues,
            discovery,
            policy,
            tasks,
            stage_loops=(dead_letters, outcomes),
            connection_errors=self._connection_errors,
            refused_retry_s=options.refused_retry_s,
        )
        ports = pipeline.ports
        unpublished = UnpublishedHeads(
            js,
            topology,
            ports.requests,
            ports.queues,
            ports.publisher,
            self.clock,
            lambda: pipeline.stages.lifecycle.roles.initial,
            queues.placement.refresh,
            observe,
            options.unpublished_after_s,
        )
        return Crew(
            pipeline, policy, dead_letters, outcomes, queues, discovery, wakeups, unpublished
        )

    @property
    def crew(self) -> Crew:
        assert self._crew is not None, "start() first"
        return self._crew

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        pipeline = await open_pipeline(
            self.js,
            self.topology,
            self._machines,
            self.config,
            source_control=self._source_control,
            clock=self.clock,
            metrics=self.metrics,
            policy_hash=lambda: self.policy_hash,
        )
        await self.clock.sync()  # before any decision reads a lease
        crew = self._crew = self._wire(pipeline)
        # Before any consumer runs: operator commands (ingest) read the policy in force,
        # and the pauses are in force.
        await crew.policy.start()
        for name, loop in (("dead-letters", crew.dead_letters), ("outcomes", crew.outcomes)):
            await loop.open()
            self.tasks.spawn(name, loop.run(self.tasks.stop_requested))
        await crew.wakeups.start()
        await crew.queues.open()
        await crew.discovery.start()
        self.health.began()
        self.tasks.spawn("heartbeat", self.health.heartbeat(crew.wakeups.after_round_trip))
        self.tasks.spawn("clock", self.tasks.every(SYNC_INTERVAL_S, self.clock.sync, "clock"))
        self.tasks.spawn(
            "unpublished",
            self.tasks.every(
                self.options.unpublished_interval_s, crew.unpublished.scan, "unpublished heads"
            ),
        )
        if self.options.prune_older_than_s is not None:
            self.tasks.spawn("prune", self._prune(self.options.prune_older_than_s))
        crew.policy.watch()
        log.info(
            "service started with %d queue consumer(s)%s",
            len(crew.queues.consumers),
            "" if crew.queues.all_warm else "; creating the others behind it",
        )

    async def _prune(self, older_than_s: float) -> None:
        """Remove the terminal requests older than ``older_than_s`` now, then every
        ``prune_interval_s``, until stopped."""
        while not self.tasks.stopping:
            try:
                terminal = self.crew.policy.machines.request.terminal
                report = await prune_terminal_requests(
                    self.js, self.topology, terminal, older_than_s
                )
                if report.pruned:
                    log.info("pruned %d terminal request(s)", len(report.pruned))
            except Exception as exc:  # the broker may be reconnecting; try next round
                log.warning("prune failed: %s: %s", type(exc).__name__, exc)
            await self.tasks.idle(self.options.prune_interval_s)

    async def stop(self) -> None:
        """Let runners settle the message in hand, then hand back whatever is left."""
        self.tasks.stop()
        crew = self._crew
        if crew is not None:
            crew.wakeups.wake_all()  # queue loops do not watch the stop event themselves
            await crew.wakeups.close()
        await self.tasks.finish(self.options.shutdown_timeout_s)
        if crew is not None:
            await crew.queues.close()
            await crew.dead_letters.close()
            await crew.outcomes.close()
        log.info("service stopped")

    # -- what the collaborators hold, read by the HTTP endpoint and operators ----------

    @property
    def machines(self) -> ProcessMachines:
        """The machines in force."""
        return self._crew.policy.machines if self._crew is not None else self._machines

    @property
    def policy_hash(self) -> str:
        """The hash of the policy in force; empty when the service was not given paths."""
        return hash_in_force(self.reloader)

    # -- readiness --------------------------------------------------------------------

    def readiness_problems(self) -> list[str]:
        """Why the service is not ready: unhealthy, or a queue was refused a consumer.
        (Consumers still being created behind start do not count: a head for such a queue
        creates its consumer at once.)"""
        problems = self.health.problems()
        if self._crew is not None:
            for queue, why in sorted(self._crew.queues.refused.items()):
                problems.append(f"queue {queue!r} has no consumer: {why}")
        return problems

    def readiness_notes(self) -> list[str]:
        """What ``/readyz`` adds without failing: a refused policy edit, still on disk
        (the service runs the last good policy, so it is ready, but the edit is not in
        force), with its located error."""
        reloader = self.reloader
        if reloader is None or reloader.refusal is None or not reloader.refused_now:
            return []
        refusal = reloader.refusal
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(refusal.at_ms / 1000))
        return [
            f"policy edit refused ({refusal.part}) at {when}; policy {reloader.hash} stays "
            f"in force: {refusal.error}"
        ]

    @property
    def ready(self) -> bool:
        """Healthy, and no queue the service knows was refused a consumer."""
        return not self.readiness_problems()


__all__ = ["Crew", "Service", "ServiceOptions"]

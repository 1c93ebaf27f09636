"""The stages on one broker: the stores opened on JetStream and every app wired on them.

The service runs its consumers on a :class:`Pipeline`; operator commands and tests open
one the same way (:func:`open_pipeline`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext

from ...adapters.git import GitSourceControlProvider
from ...adapters.jetstream import Topology, ensure_topology, open_kv_stores
from ...adapters.jetstream.attempts import AttemptsLedger
from ...adapters.jetstream.dead_letter import DeadLetter
from ...adapters.jetstream.decision_trail import JetStreamTrail
from ...adapters.jetstream.errors import translated
from ...adapters.jetstream.publisher import JetStreamPublisher
from ...adapters.jetstream.terminations import TerminationLedger
from ...adapters.memory import SystemClock
from ...domain.settle import Attempt, Settlement
from ...pipeline.wiring import Ports, Stages, build_stages
from ...ports.clock import Clock
from ...ports.config import ConfigStore
from ...ports.source_control import SourceControlProvider
from ...process.catalog import ProcessMachines
from ...process.metrics import Metrics


def config_repositories(config: ConfigStore) -> GitSourceControlProvider:
    """Ancestry from each queue's ``repository`` setting, re-read on every lookup."""
    return GitSourceControlProvider(lambda queue: config.get(queue).repository)


@dataclass
class Pipeline:
    """The stages on one broker, shared by the service and operator commands.

    ``stages`` is the one reference through which the consumers reach the controller
    and the reconciler: :meth:`swap` replaces it whole, so a delivery runs on the stages
    it started with and the next one on the new stages, never on half of each.
    """

    js: JetStreamContext
    topology: Topology
    stages: Stages
    ledger: AttemptsLedger
    terminations: TerminationLedger
    ports: Ports | None = None
    metrics: Metrics | None = None

    def swap(self, machines: ProcessMachines) -> None:
        """Build the stages on ``machines`` (same ports) and put them in force."""
        assert self.ports is not None, "a pipeline opened by open_pipeline"
        self.stages = build_stages(machines, self.ports, metrics=self.metrics, offload_plugins=True)

    async def handle(self, delivery: Any) -> Attempt:
        """A delivery, run by the controller in force when it starts: what it decided."""
        return await self.stages.controller.handle(delivery)

    async def note_retry(
        self, queue: str, request_id: str, stream_seq: int, decision: Settlement, max_attempts: int
    ) -> None:
        """A failed attempt the settle policy retries, noted in the decision trail."""
        await self.stages.note_retry(queue, request_id, stream_seq, decision, max_attempts)

    async def record_outcome(self, request_id: str, outcome: str) -> object:
        """A build outcome, recorded by the stages in force."""
        return await self.stages.record.complete(request_id, outcome)

    async def reconcile(self, letter: DeadLetter) -> object:
        """A dead letter, reconciled by the stages in force."""
        return await self.stages.reconciler.reconcile(
            letter.request_id, error=letter.error, attempts=letter.attempts
        )


async def open_pipeline(
    js: JetStreamContext,
    topology: Topology,
    machines: ProcessMachines,
    config: ConfigStore,
    *,
    source_control: SourceControlProvider | None = None,
    clock: Clock | None = None,
    metrics: Metrics | None = None,
    policy_hash: Callable[[], str] = lambda: "",
) -> Pipeline:
    """Create the topology if missing, open the stores and wire every app on them.

    ``policy_hash`` is read for every trail record: the hash of the policy in force.
    """
    await ensure_topology(js, topology)
    stores = await open_kv_stores(js, topology)
    ports = Ports(
        requests=stores.requests,
        queues=stores.queues,
        uri_index=stores.uris,
        counter=stores.counters,
        config=config,
        source_control=source_control or config_repositories(config),
        publisher=JetStreamPublisher(js, topology),
        clock=clock or SystemClock(),
        trail=JetStreamTrail(js, topology),
        policy_hash=policy_hash,
        searches=stores.searches,
    )
    with translated(f"open bucket {topology.attempts_bucket}"):
        attempts_kv = await js.key_value(topology.attempts_bucket)
    return Pipeline(
        js=js,
        topology=topology,
        stages=build_stages(machines, ports, metrics=metrics, offload_plugins=True),
        ledger=AttemptsLedger(attempts_kv),
        terminations=TerminationLedger(attempts_kv),
        ports=ports,
        metrics=metrics,
    )


__all__ = ["Pipeline", "config_repositories", "open_pipeline"]

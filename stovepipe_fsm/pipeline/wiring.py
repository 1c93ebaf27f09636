"""The one factory that puts the pipeline's stages together on a set of ports.

The service, the simulated world, ``check`` (and its variants), the benchmarks and the
tests all build their stages here, so they all run the same wiring: one
:class:`~..process.services.StageServices` shared by the controller, ingest, record and
the reconciler, with the lifecycle chosen at construction (``lifecycle_factory``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..domain.settle import Settlement
from ..ports.clock import Clock
from ..ports.config import ConfigStore
from ..ports.decision_trail import DecisionTrail
from ..ports.publisher import Publisher
from ..ports.source_control import SourceControlProvider
from ..ports.stores import Counter, QueueStore, RequestStore, SearchStore, UriIndex
from ..process.catalog import ProcessMachines
from ..process.controller import ProcessController
from ..process.culprit import CulpritFinder
from ..process.lifecycle import RequestLifecycle
from ..process.metrics import Metrics
from ..process.services import LifecycleFactory, StageServices
from ..process.trail_notes import DiscardedTrail, note_failed_attempt
from .dlq import DeadLetterReconciler
from .ingest import Ingest
from .record import Record


@dataclass(frozen=True)
class Ports:
    """The I/O the stages run on: stores, config, source control, publisher, clock."""

    requests: RequestStore
    queues: QueueStore
    uri_index: UriIndex
    counter: Counter
    config: ConfigStore
    source_control: SourceControlProvider
    publisher: Publisher
    clock: Clock
    #: Where decisions are noted; ``None`` keeps none (the model checker).
    trail: DecisionTrail | None = None
    #: The policy hash in force, read for every trail record.
    policy_hash: Callable[[], str] = lambda: ""
    #: Culprit search rows; ``None``: no search is run whatever the policy declares.
    searches: SearchStore | None = None


@dataclass(frozen=True)
class Stages:
    """The controller and the stages that share its services."""

    services: StageServices
    controller: ProcessController
    ingest: Ingest
    record: Record
    reconciler: DeadLetterReconciler

    @property
    def lifecycle(self) -> RequestLifecycle:
        return self.services.lifecycle

    async def note_retry(
        self, queue: str, request_id: str, stream_seq: int, decision: Settlement, max_attempts: int
    ) -> None:
        """A failed attempt the settle policy retries, noted in the decision trail."""
        await note_failed_attempt(
            self.services,
            queue,
            request_id,
            stream_seq=stream_seq,
            failures=decision.failures,
            max_attempts=max_attempts,
            retry_in_ms=round(decision.delay_s * 1000),
            error=decision.reason,
        )


def build_stages(
    machines: ProcessMachines,
    ports: Ports,
    *,
    metrics: Metrics | None = None,
    lifecycle_factory: LifecycleFactory = RequestLifecycle,
    offload_plugins: bool = False,
) -> Stages:
    """Every stage on ``ports``, sharing one :class:`StageServices`; ``offload_plugins``
    for a service, whose event loop a plugin step must not hold."""
    services = StageServices.build(
        machines.request,
        machines.roles,
        parameter_defaults=machines.parameter_defaults,
        requests=ports.requests,
        queues=ports.queues,
        config=ports.config,
        source_control=ports.source_control,
        publisher=ports.publisher,
        clock=ports.clock,
        trail=ports.trail if ports.trail is not None else DiscardedTrail(),
        policy_hash=ports.policy_hash,
        metrics=metrics,
        lifecycle_factory=lifecycle_factory,
        offload_plugins=offload_plugins,
        condition_origins={
            name: info.origin
            for name, info in machines.queue_gate.registry.conditions.items()
            if info.origin
        },
    )
    culprits = (
        CulpritFinder(
            machines.culprit, services, ports.searches, ports.counter, offload=offload_plugins
        )
        if machines.culprit is not None and ports.searches is not None
        else None
    )
    return Stages(
        services=services,
        controller=ProcessController(machines, services, offload_plugins=offload_plugins),
        ingest=Ingest.on(services, uri_index=ports.uri_index, counter=ports.counter),
        record=Record(services, culprits),
        reconciler=DeadLetterReconciler(services),
    )

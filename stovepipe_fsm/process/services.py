"""What the process stage's conditions and actions may touch: one explicit object.

:class:`StageServices` is built once, by :meth:`StageServices.build`, and handed to the
controller; nothing rewires it afterwards. A condition or action reaches the stores,
config, source control, publisher, clock, lifecycle, metrics and the once-only warning
log through it and through nothing else, so what a policy step can do is visible here
and a simulated world, the model checker and the JetStream service differ only in the
ports they pass in. A variant lifecycle (``check --bare-counter``) is a constructor
argument, never a patch applied after construction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..machine.compiler import CompiledLifecycle
from ..ports.clock import Clock
from ..ports.config import ConfigStore
from ..ports.decision_trail import DecisionTrail
from ..ports.publisher import Publisher
from ..ports.source_control import SourceControlProvider
from ..ports.stores import QueueStore, RequestStore
from .effective_config import stage_config
from .greens import greens_kept_by
from .lifecycle import RequestLifecycle
from .metrics import Metrics
from .roles import RequestRoles

log = logging.getLogger("stovepipe_fsm.process")

#: ``factory(machine, roles, requests, queues, clock=clock, offload=..., greens_kept=...)``:
#: a RequestLifecycle (or a variant of it, for check's mutants).
LifecycleFactory = Callable[..., RequestLifecycle]


@dataclass
class OnceLog:
    """Log a configuration warning once per process, not once per delivery."""

    seen: set[str] = field(default_factory=set)

    def warning(self, key: str, message: str, *args: Any) -> None:
        if key not in self.seen:
            self.seen.add(key)
            log.warning(message, *args)


@dataclass(frozen=True)
class StageServices:
    """Everything a registered condition or action of the process stage may use."""

    roles: RequestRoles
    requests: RequestStore
    queues: QueueStore
    #: Each queue's effective config (:mod:`.effective_config`), resolved once.
    config: ConfigStore
    source_control: SourceControlProvider
    publisher: Publisher
    clock: Clock
    lifecycle: RequestLifecycle
    metrics: Metrics
    warnings: OnceLog
    #: Where decisions are noted (:mod:`.trail`), and the policy hash each one carries.
    trail: DecisionTrail
    policy_hash: Callable[[], str]
    #: The gate's conditions a plugin registered, by name: the plugin (a hold says which
    #: plugin's rule held it).
    condition_origins: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        request_machine: CompiledLifecycle,
        roles: RequestRoles,
        *,
        parameter_defaults: Mapping[str, Any],
        requests: RequestStore,
        queues: QueueStore,
        config: ConfigStore,
        source_control: SourceControlProvider,
        publisher: Publisher,
        clock: Clock,
        trail: DecisionTrail,
        policy_hash: Callable[[], str] = lambda: "",
        metrics: Metrics | None = None,
        lifecycle_factory: LifecycleFactory = RequestLifecycle,
        offload_plugins: bool = False,
        condition_origins: Mapping[str, str] | None = None,
    ) -> StageServices:
        """The one place the process stage's dependencies are put together."""
        effective = stage_config(config, parameter_defaults)
        lifecycle = lifecycle_factory(
            request_machine,
            roles,
            requests,
            queues,
            clock=clock,
            offload=offload_plugins,
            greens_kept=greens_kept_by(effective),
        )
        return cls(
            roles=roles,
            requests=requests,
            queues=queues,
            config=effective,
            source_control=source_control,
            publisher=publisher,
            clock=clock,
            lifecycle=lifecycle,
            metrics=metrics or Metrics(),
            warnings=OnceLog(),
            trail=trail,
            policy_hash=policy_hash,
            condition_origins=dict(condition_origins or {}),
        )

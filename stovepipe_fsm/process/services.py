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
from dataclasses import dataclass, field, replace
from typing import Any

from ..domain.entities import QueueConfig
from ..ports.clock import Clock
from ..ports.config import ConfigStore
from ..ports.publisher import Publisher
from ..ports.source_control import SourceControlProvider
from ..ports.stores import QueueStore, RequestStore
from ..ports.trail import DecisionTrail
from ..spec.compiler import CompiledLifecycle
from .lifecycle import RequestLifecycle
from .metrics import Metrics
from .roles import RequestRoles

log = logging.getLogger("stovepipe_fsm.process")

#: ``factory(machine, roles, requests, queues, clock=clock)``: a RequestLifecycle (or a
#: variant of it, for check's mutants).
LifecycleFactory = Callable[..., RequestLifecycle]


@dataclass
class OnceLog:
    """Log a configuration warning once per process, not once per delivery."""

    seen: set[str] = field(default_factory=set)

    def warning(self, key: str, message: str, *args: Any) -> None:
        if key not in self.seen:
            self.seen.add(key)
            log.warning(message, *args)


MAX_COMPLETED_CONFIGS = 4096


class DeclaredDefaults:
    """A config store whose every answer carries each declared parameter.

    Config files set only what they change; a parameter a queue's config leaves unset
    takes the default its machine declares. A store loaded with the declarations already
    answers complete configs; one built without them (a test's, a tolerant one) does
    not, so the services complete every answer and every condition and action reads a
    complete config whichever store the stage was given.
    """

    def __init__(self, store: ConfigStore, defaults: Mapping[str, Any]) -> None:
        self.store = store
        self.defaults = _declared_pairs(defaults)
        # Completed configs by the store's answer: a config is a hashable value and a
        # store answers the same few values again and again (once per delivery).
        self._completed: dict[QueueConfig, QueueConfig] = {}

    def get(self, queue: str) -> QueueConfig:
        config = self.store.get(queue)
        if not self.defaults:
            return config
        completed = self._completed.get(config)
        if completed is None:
            merged = dict(self.defaults)
            merged.update(config.parameters)
            completed = replace(config, parameters=tuple(sorted(merged.items())))
            if len(self._completed) >= MAX_COMPLETED_CONFIGS:
                self._completed.clear()
            self._completed[config] = completed
        return completed

    def configured_queues(self) -> tuple[str, ...]:
        return self.store.configured_queues()


_DECLARED_PAIRS: dict[tuple[tuple[str, Any], ...], tuple[tuple[str, Any], ...]] = {}


def _declared_pairs(defaults: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The declared defaults as config parameters, normalised once per distinct set.

    Services are built per world fork in ``check`` and ``simulate``, always from the
    same few declarations; normalising them (sorting, freezing values) each time costs
    more than the fork itself. A set with an unhashable default is normalised each time.
    """
    key = tuple(defaults.items())
    try:
        pairs = _DECLARED_PAIRS.get(key)
    except TypeError:
        return QueueConfig().with_parameters(defaults).parameters
    if pairs is None:
        if len(_DECLARED_PAIRS) >= MAX_COMPLETED_CONFIGS:
            _DECLARED_PAIRS.clear()
        pairs = _DECLARED_PAIRS[key] = QueueConfig().with_parameters(defaults).parameters
    return pairs


@dataclass(frozen=True)
class StageServices:
    """Everything a registered condition or action of the process stage may use."""

    roles: RequestRoles
    requests: RequestStore
    queues: QueueStore
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
    ) -> StageServices:
        """The one place the process stage's dependencies are put together."""
        return cls(
            roles=roles,
            requests=requests,
            queues=queues,
            config=DeclaredDefaults(config, parameter_defaults),
            source_control=source_control,
            publisher=publisher,
            clock=clock,
            lifecycle=lifecycle_factory(request_machine, roles, requests, queues, clock=clock),
            metrics=metrics or Metrics(),
            warnings=OnceLog(),
            trail=trail,
            policy_hash=policy_hash,
        )

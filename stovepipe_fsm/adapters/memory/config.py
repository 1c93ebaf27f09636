"""A fixed in-memory ConfigStore for unit tests and ``simulate``.

Content given as a mapping goes through exactly the validation a file gets (schema,
queue names, pattern ties), so a scenario cannot run with a policy the real service
would refuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...config.loader import MEMORY_SOURCE, Declarations, policy_from_mapping
from ...config.policy import QueuePolicy
from ...domain.entities import QueueConfig
from ...domain.queue_names import validate_stored_queue_name
from ...machine.parameters import as_json


class StaticConfigStore:
    """Serves one policy forever; raises SpecError at construction if content is invalid.

    ``source`` is a ready :class:`QueuePolicy`, content shaped like ``config/queues.yaml``,
    a :class:`QueueConfig` used as the ``defaults:`` of every queue, or None for the
    built-in defaults.
    """

    def __init__(
        self,
        source: QueuePolicy | QueueConfig | Mapping[str, Any] | None = None,
        *,
        name: str = MEMORY_SOURCE,
        parameters: Declarations = None,
    ) -> None:
        if source is None:
            self._policy = QueuePolicy()
        elif isinstance(source, QueuePolicy):
            self._policy = source
        elif isinstance(source, QueueConfig):
            defaults = {k: v for k, v in source.runtime_items() if v is not None}
            defaults.update((k, as_json(v)) for k, v in source.parameters)
            self._policy = policy_from_mapping(
                {"defaults": defaults}, source=name, parameters=parameters
            )
        else:
            self._policy = policy_from_mapping(source, source=name, parameters=parameters)

    @property
    def policy(self) -> QueuePolicy:
        return self._policy

    def get(self, queue: str) -> QueueConfig:
        """The resolved config for ``queue``; raises InvalidQueueName for a bad name."""
        validate_stored_queue_name(queue)
        return self._policy.resolve(queue)

    def configured_queues(self) -> tuple[str, ...]:
        return self._policy.configured_queues()

    def clone(self) -> StaticConfigStore:
        """The same store (it never changes), for model checkers that clone every adapter."""
        return self

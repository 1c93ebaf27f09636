"""A queue's effective config: the one value the stages read for it.

:func:`effective_config` is the one place it is put together, from three sources,
lowest first:

1. every parameter the machines declare, at its declared default;
2. what the policy (``config/queues.yaml``, a ``ConfigStore``) resolves for the queue;
3. a run's changes: the values a simulated run fixes for every queue (a timeline's
   ``config:`` block, the checker's bounds), then its ``config`` steps for that queue.

Two stores hand the stages that value. :class:`ResolvedConfigs` serves a policy fixed
for the run (``simulate``, ``check``, what-if, a simulated world): it resolves each queue
once and keeps the value until a ``config`` step changes that queue. :class:`LiveConfigs`
serves a store whose answers may change (the service's, which reloads its file and
applies operator pauses): it asks the store on every read and completes each distinct
answer once. :func:`stage_config` picks: a store that already answers effective
configs is read as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..domain.entities import QueueConfig, evolve
from ..ports.config import ConfigStore

Pairs = tuple[tuple[str, Any], ...]

#: How many distinct answers a :class:`LiveConfigs` keeps completed before it starts over.
MAX_COMPLETED_CONFIGS = 4096


def declared_pairs(defaults: Mapping[str, Any]) -> Pairs:
    """The declared defaults as config parameters (sorted, list values as tuples)."""
    return QueueConfig().with_parameters(defaults).parameters


def effective_config(
    resolved: QueueConfig, declared: Pairs, changes: Mapping[str, Any] | None = None
) -> QueueConfig:
    """``resolved`` with each ``declared`` parameter it leaves unset at its default, and
    ``changes`` (runtime keys and parameters) set over both."""
    config = resolved
    if declared:
        names = {name for name, _ in resolved.parameters}
        missing = tuple(pair for pair in declared if pair[0] not in names)
        if missing:
            parameters = tuple(sorted((*resolved.parameters, *missing), key=lambda pair: pair[0]))
            config = evolve(resolved, parameters=parameters)
    return config.with_values(changes) if changes else config


class ResolvedConfigs:
    """A fixed policy's effective configs, each queue resolved once.

    ``overrides`` apply to every queue for the whole run; :meth:`set` is a ``config``
    step: from then on the queue resolves those values over what it resolved before, as
    an edit of ``config/queues.yaml`` takes effect at the next delivery in ``serve``.
    Only for a ``policy`` whose answers never change during the run (a loaded file).

    A copy (:meth:`clone`) shares the policy and what was resolved: a queue's effective
    config is a function of its name and its steps' values, and the checker forks
    thousands of worlds that pause and resume the same queue.
    """

    def __init__(
        self,
        policy: ConfigStore,
        declared: Mapping[str, Any],
        overrides: Mapping[str, Any] | None = None,
    ) -> None:
        self.policy = policy
        self.declared = declared_pairs(declared)
        self.overrides: Mapping[str, Any] = dict(overrides or {})
        #: The values ``config`` steps set, per queue. Never changed in place: a step
        #: replaces it, with ``_current``, so a copy shares both until one of them steps.
        self.changes: Mapping[str, Mapping[str, Any]] = {}
        self._current: dict[str, QueueConfig] = {}  # each queue's value, as of its steps
        # Effective configs by queue and steps' values, shared by every copy.
        self._resolved: dict[tuple[str, tuple[tuple[str, Any], ...]], QueueConfig] = {}

    def get(self, queue: str) -> QueueConfig:
        config = self._current.get(queue)
        if config is None:
            config = self._current[queue] = self._resolve(queue)
        return config

    def _resolve(self, queue: str) -> QueueConfig:
        changes = self.changes.get(queue, {})
        try:
            key = (queue, tuple(changes.items()))
            config = self._resolved.get(key)
        except TypeError:  # a value that is not hashable: resolved each time
            key, config = None, None
        if config is None:
            values = {**self.overrides, **changes}
            config = effective_config(self.policy.get(queue), self.declared, values)
            if key is not None:
                self._resolved[key] = config
        return config

    def configured_queues(self) -> tuple[str, ...]:
        return self.policy.configured_queues()

    def set(self, queue: str, values: Mapping[str, Any]) -> None:
        """From now on ``queue`` resolves ``values`` over what it resolved before."""
        self.changes = {**self.changes, queue: {**self.changes.get(queue, {}), **values}}
        self._current = {name: c for name, c in self._current.items() if name != queue}

    def clone(self) -> ResolvedConfigs:
        """An independent copy; it shares everything until one of the two steps.

        Not ``copy.copy``: a world is cloned at every step of ``check``, and the generic
        copy protocol costs several times the two lines below."""
        twin = object.__new__(ResolvedConfigs)
        twin.__dict__.update(self.__dict__)
        return twin


class LiveConfigs:
    """A store's answers as effective configs, for a store whose answers may change.

    Every read asks ``store``; each distinct answer (a config is a hashable value, and a
    store answers the same few again and again) is completed once.
    """

    def __init__(self, store: ConfigStore, declared: Mapping[str, Any]) -> None:
        self.store = store
        self.declared = declared_pairs(declared)
        self._completed: dict[QueueConfig, QueueConfig] = {}

    def get(self, queue: str) -> QueueConfig:
        config = self.store.get(queue)
        if not self.declared:
            return config
        completed = self._completed.get(config)
        if completed is None:
            completed = effective_config(config, self.declared)
            if len(self._completed) >= MAX_COMPLETED_CONFIGS:
                self._completed.clear()
            self._completed[config] = completed
        return completed

    def configured_queues(self) -> tuple[str, ...]:
        return self.store.configured_queues()


def stage_config(store: ConfigStore, declared: Mapping[str, Any]) -> ConfigStore:
    """What the stages read: ``store`` itself when it already answers effective configs,
    else its answers completed (:class:`LiveConfigs`)."""
    if isinstance(store, ResolvedConfigs | LiveConfigs):
        return store
    return LiveConfigs(store, declared)

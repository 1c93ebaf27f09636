"""``config:`` steps of a timeline: change a queue's settings from that step on.

A config step sets runtime keys and parameters of one queue, or of every queue a glob
matches, for the rest of the timeline::

    - config: {set: {max_concurrent: 2}}                      # the timeline's queue
    - config: {queue: "mobile/*", set: {gate_wait_delay_ms: 500}}

``queue`` is an exact name or a pattern as ``config/queues.yaml`` writes them (default:
the timeline's queue); ``set`` names what changes. The keys are those the queue config
accepts under the policy the timeline runs on: the runtime's own (``max_attempts``,
``repository``, ``ref``) and the parameters its machines declare, each value checked
against its declaration. A timeline is checked against the machines before anything
runs, so an unknown key (listed with the allowed ones) or a value of the wrong type is a
located input error, never a mid-run failure.

Changes are layers over the timeline's config (:class:`LayeredConfigStore`): each step
adds one, later layers win key by key, and a queue no layer matches reads the policy as
it was. The next gate check reads the change: a delivery already decided is not
re-decided, as in ``serve`` after an edit of the config file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator

from ..config.checks import name_problem, pattern_problem
from ..config.globs import glob_match, is_pattern
from ..config.loader import settings_schema
from ..domain.entities import QueueConfig
from ..ports.config import ConfigStore
from ..spec.errors import Location, SpecIssue
from ..spec.model import ParameterSpec
from ..spec.yaml_source import JsonPath, SourceDocument


@dataclass(frozen=True)
class Setting:
    """One key of a config step's ``set:``, its value, and where it is written."""

    key: str
    value: Any
    location: Location  # of the key
    value_location: Location


@dataclass(frozen=True)
class ConfigChange:
    """A config step: the queue or pattern it applies to and the settings it changes."""

    queue: str
    settings: tuple[Setting, ...]

    def values(self) -> dict[str, Any]:
        return {s.key: s.value for s in self.settings}

    def describe(self) -> str:
        changes = ", ".join(f"{s.key}={s.value}" for s in self.settings)
        return f"config {self.queue}: {changes}"


def parse_config_change(
    doc: SourceDocument, index: int, default_queue: str
) -> tuple[ConfigChange, list[SpecIssue]]:
    """The config step ``steps[index]`` of a schema-valid ``doc``, and what is wrong with it.

    Only the queue can be checked here; the keys depend on the machines
    (:func:`config_issues`).
    """
    body: dict[str, Any] = doc.data["steps"][index]["config"]
    inner: JsonPath = ("steps", index, "config")
    queue = str(body.get("queue", default_queue))
    issues: list[SpecIssue] = []
    problem = pattern_problem(queue) if is_pattern(queue) else name_problem(queue)
    if problem is not None:
        where = doc.locate((*inner, "queue")) if "queue" in body else doc.locate(inner, key=True)
        issues.append(SpecIssue(where, problem))
    settings = tuple(
        Setting(
            str(key),
            value,
            doc.locate((*inner, "set", key), key=True),
            doc.locate((*inner, "set", key)),
        )
        for key, value in body["set"].items()
    )
    return ConfigChange(queue, settings), issues


def config_issues(change: ConfigChange, parameters: Mapping[str, ParameterSpec]) -> list[SpecIssue]:
    """Keys the policy's queue config does not accept, and values that do not fit.

    The check is the one ``config/queues.yaml`` gets under the same machines (the
    queues schema with the declared parameters), so a timeline cannot set what the
    file could not.
    """
    schema = settings_schema(parameters)
    properties: dict[str, Any] = schema["$defs"]["settings"]["properties"]
    issues: list[SpecIssue] = []
    for setting in change.settings:
        declaration = properties.get(setting.key)
        if declaration is None:
            issues.append(
                SpecIssue(
                    setting.location,
                    f"config step: unknown key {setting.key!r}; the keys a queue's config "
                    f"accepts under this policy: {', '.join(sorted(properties))}",
                )
            )
            continue
        for error in Draft202012Validator(declaration).iter_errors(setting.value):
            issues.append(
                SpecIssue(
                    setting.value_location,
                    f"config step: {setting.key}: {error.message}",
                )
            )
    return issues


class LayeredConfigStore:
    """A config store with the changes of config steps laid over it, in step order."""

    def __init__(self, base: ConfigStore) -> None:
        self.base = base
        self.layers: list[ConfigChange] = []

    def apply(self, change: ConfigChange) -> None:
        """From now on, queues ``change.queue`` names get its settings."""
        self.layers.append(change)

    def get(self, queue: str) -> QueueConfig:
        config = self.base.get(queue)
        for layer in self.layers:
            if _matches(layer.queue, queue):
                config = config.with_values(layer.values())
        return config

    def configured_queues(self) -> tuple[str, ...]:
        return self.base.configured_queues()


def _matches(key: str, queue: str) -> bool:
    return glob_match(key, queue) if is_pattern(key) else key == queue

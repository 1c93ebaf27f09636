"""Config port: per-queue knobs, read at decision time, never written by the pipeline."""

from __future__ import annotations

from typing import Protocol

from ..domain.entities import QueueConfig


class ConfigStore(Protocol):
    def get(self, queue: str) -> QueueConfig:
        """The resolved config for ``queue`` (defaults, then the best matching override)."""
        ...

    def configured_queues(self) -> tuple[str, ...]:
        """Exact queue names the config mentions (patterns excluded)."""
        ...

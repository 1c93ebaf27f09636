"""Counters and timings the stage reports; the service exposes them for Prometheus.

Kept dependency-free and in-memory: the core only increments; an adapter renders.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Metrics:
    counters: Counter[tuple[str, str]] = field(default_factory=Counter)
    latency_ms: list[float] = field(default_factory=list)
    max_latency_samples: int = 10_000

    def count(self, name: str, queue: str, amount: int = 1) -> None:
        self.counters[(name, queue)] += amount

    def observe_latency(self, millis: float) -> None:
        if len(self.latency_ms) >= self.max_latency_samples:
            del self.latency_ms[: self.max_latency_samples // 2]
        self.latency_ms.append(millis)

    def total(self, name: str) -> int:
        return sum(v for (n, _), v in self.counters.items() if n == name)

"""Counters and a latency histogram the stage reports; the service renders them.

Kept dependency-free and in-memory: the core only increments; an adapter renders.
The latency histogram has fixed buckets (cumulative, like Prometheus's), so a scrape
reads counts that only grow and p50/p99 can be computed by the monitoring system
instead of from a sample window that forgets.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

#: Upper bounds in milliseconds; a decision slower than the last lands in +Inf.
LATENCY_BUCKETS_MS: tuple[float, ...] = (
    0.5,
    1,
    2.5,
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1000,
    2500,
    5000,
    10000,
)


@dataclass
class LatencyHistogram:
    bounds: tuple[float, ...] = LATENCY_BUCKETS_MS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_MS) + 1))
    total: int = 0
    sum_ms: float = 0.0
    max_ms: float = 0.0

    def observe(self, millis: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, millis)] += 1
        self.total += 1
        self.sum_ms += millis
        self.max_ms = max(self.max_ms, millis)

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count of observations <= le) for each bound and +Inf."""
        out, running = [], 0
        for bound, count in zip((*map(_fmt, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


def _fmt(bound: float) -> str:
    return f"{bound:g}"


@dataclass
class Metrics:
    counters: Counter[tuple[str, str]] = field(default_factory=Counter)
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    def count(self, name: str, queue: str, amount: int = 1) -> None:
        self.counters[(name, queue)] += amount

    def observe_latency(self, millis: float) -> None:
        self.latency.observe(millis)

    def total(self, name: str) -> int:
        return sum(v for (n, _), v in self.counters.items() if n == name)

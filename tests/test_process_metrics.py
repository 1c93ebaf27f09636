"""The latency histogram the service exposes: cumulative buckets, sum and count."""

from __future__ import annotations

from stovepipe_fsm.process.metrics import LatencyHistogram, Metrics


def test_buckets_are_cumulative_and_bounds_inclusive() -> None:
    histogram = LatencyHistogram(bounds=(1, 10), counts=[0, 0, 0])
    for millis in (0.2, 1.0, 3.0, 10.0, 42.0):
        histogram.observe(millis)
    assert histogram.cumulative() == [("1", 2), ("10", 4), ("+Inf", 5)]
    assert histogram.total == 5
    assert histogram.sum_ms == 56.2
    assert histogram.max_ms == 42.0


def test_metrics_count_per_event_and_queue() -> None:
    metrics = Metrics()
    metrics.count("holds", "a")
    metrics.count("holds", "b", 2)
    metrics.count("supersedes", "a")
    metrics.observe_latency(3.0)
    assert metrics.total("holds") == 3
    assert metrics.counters[("supersedes", "a")] == 1
    assert metrics.latency.total == 1

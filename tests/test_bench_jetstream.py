"""bench.jetstream drives the real service, consumer and ingest on a real nats-server it
starts itself; a short run of every part must finish and report what each part
measured, so that a change to the stage cannot leave the bench broken unnoticed."""

from __future__ import annotations

import json

import pytest

from bench.jetstream import main

#: The bench starts a nats-server of its own.
pytestmark = pytest.mark.nats

TINY = [
    "--heads", "20", "--queues", "3", "--per-queue", "2", "--samples", "5",
    "--decisions", "5", "--rounds", "2", "--ingest-heads", "20", "--batch-queues", "2",
]  # fmt: skip


def test_every_part_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(TINY) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert [t["heads"] for t in summary["throughput"]] == [20, 6]
    for row in summary["throughput"]:
        assert row["admitted"] + row["superseded"] == row["heads"]
        assert row["left_in_process_stream"] == 0
    assert summary["latency_ms"]["samples"] == 5
    assert 0 < summary["latency_ms"]["ingest_p50"] <= summary["latency_ms"]["p50"]
    for path in ("admit", "supersede"):
        decisions = summary["decisions"][path]
        # every variant of a decision makes the same broker operations as ours
        assert decisions["ops_ours"] == decisions["ops_minimal"]
        for label in ("ours", "minimal", "minimal_json"):
            assert decisions[f"cpu_us_{label}"] > 0
        for label in ("minimal", "minimal_json"):
            ratios = decisions[f"ours_over_{label}_per_round"]
            assert len(ratios) == 2  # one per round
            assert min(ratios) <= decisions[f"ours_over_{label}_paired_median"] <= max(ratios)
    assert summary["ingest"]
    assert "processor time per decision" in out

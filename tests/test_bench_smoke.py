"""Every bench runs to the end on small figures and prints what it measures.

The benches are run by hand, so a change to the stage could break one unnoticed; these
runs are short (the figures themselves mean nothing at this size and are not checked,
only that each part ran and reported). bench.speculative and bench.jetstream have
tests of their own.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import pytest

from bench import __main__ as machine_bench
from bench import queues as queues_bench
from bench import status_page as status_page_bench
from bench import whatif as whatif_bench
from stovepipe_fsm.domain.settle import Attempt


def test_the_machine_layer_bench_compares_both_paths(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["-n", "200", "--rounds", "2", "--straight", "--calls"]
    assert machine_bench.main(argv) == 0
    out = capsys.readouterr().out
    for path in ("admit", "supersede"):
        row = re.search(rf"^{path}\s+[\d,]+\s+[\d,]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)x", out, re.M)
        assert row is not None, out
        assert float(row.group(1)) > 0
        straight = re.search(rf"^{path}\s+[\d.]+\s+[\d.]+\s+[\d.]+x .*the driver: ", out, re.M)
        assert straight is not None, out
        calls = re.search(rf"^{path}\s+(\d+)((?:\s+\d+ \([\d.]+x\)){{2}})$", out, re.M)
        assert calls is not None, out
        counts = dict(zip(re.findall(r"^path\s+reference\s+(.*)$", out, re.M)[0].split(),
                          map(int, re.findall(r"(\d+) \(", calls[2])), strict=True))
        # The steps written out by hand make fewer calls than the machine driving them.
        assert counts["straight"] < counts["machine"], counts
    assert "machine/reference cost: worst" in out


def test_a_flow_written_out_of_step_with_the_yaml_stops_the_bench_saying_where(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bench/straight.py is the shipped flow by hand: edited YAML makes it diverge, and
    the bench says which file to bring in line instead of timing something else."""
    async def acks_only(delivery: Any) -> Attempt:
        return Attempt.acked()

    monkeypatch.setattr(machine_bench, "straight_machine_handle", lambda _p, _d: acks_only)
    argv = ["-n", "20", "--rounds", "1", "--straight"]
    with pytest.raises(SystemExit) as stopped:
        machine_bench.main(argv)
    message = str(stopped.value.code)
    assert "straight diverges from the controller" in message, message
    assert "bench/straight.py" in message and "machines/queue_gate.yaml" in message, message


@pytest.mark.nats  # the bench starts a nats-server of its own
def test_the_status_page_bench_times_each_read(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["bench.status_page", "--queues", "10", "--requests-per-queue", "2", "--rounds", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    status_page_bench.main()
    out = capsys.readouterr().out
    for part in ("read:", "status read:", "render:"):
        assert re.search(rf"{part} best\s+[\d.]+ ms", out), out
    assert "status read / page read" in out


@pytest.mark.nats  # the bench starts a nats-server of its own
@pytest.mark.slow  # a service run per size
def test_the_queues_bench_measures_a_small_service(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--sizes", "10", "--window", "1", "--samples", "5", "--json"]
    assert queues_bench.main(argv) == 0
    out = capsys.readouterr().out
    rows = json.loads(out[out.index("\n[") + 1 :])
    assert rows and all(row["admits"] == 5 for row in rows)
    assert all(row["kib_per_queue"] > 0 and row["admit_p99_ms"] > 0 for row in rows)


@pytest.mark.nats  # the bench starts a nats-server of its own
@pytest.mark.slow  # a service run per size and replica count
def test_the_queues_bench_spreads_queues_past_an_accounts_consumer_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--sizes", "10", "--replicas-queues", "9", "--account-limit", "4"]
    argv += ["--window", "1", "--samples", "5", "--json"]
    assert queues_bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "the account caps each stream at 4 consumers" in out
    rows = json.loads(out[out.index("\n[") + 1 :])
    spread = {(row["queues"], row["replicas"]): row["partitions"] for row in rows}
    assert spread == {(10, 1): 3, (9, 2): 3}
    assert all(row["admits"] == 5 for row in rows)


def test_the_whatif_bench_loads_replays_and_runs_both_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--heads", "400", "--queues", "2", "--commits", "200", "--skip-yaml"]
    assert whatif_bench.main(argv) == 0
    out = capsys.readouterr().out
    assert re.findall(r"^\[(steady|piled)\] 400 heads over 2 queues", out, re.M) == [
        "steady",
        "piled",
    ]
    commands = re.findall(r"^(whatif|simulate --json) \(command, end to end.*; (.*)$", out, re.M)
    assert len(commands) == 4, out
    assert all(status == "ok" for _, status in commands), commands
    assert out.count("both replays:") == 2

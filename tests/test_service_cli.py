"""The service and operator commands as an operator runs them: real processes, real broker."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from nats_server import isolated_tag

from stovepipe_fsm.adapters.jetstream import NatsServer
from stovepipe_fsm.adapters.jetstream.server import free_port

CLI = [sys.executable, "-m", "stovepipe_fsm.apps.cli"]
TIMEOUT_S = 30.0
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def tag(nats_server: NatsServer):
    yield from isolated_tag(nats_server, "c")


def cli(*args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def status(url: str, tag: str) -> dict:
    done = cli("status", "--json", "--nats", url, "--topology-tag", tag)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def wait_until(check, what: str, timeout: float = TIMEOUT_S):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except OSError:
        return 0, ""


def test_serve_ingest_complete_status_metrics_and_sigterm(nats_server, tag, tmp_path) -> None:
    url, port = nats_server.url, free_port()
    config = tmp_path / "queues.yaml"
    config.write_text("defaults: {gate_wait_delay_ms: 200}\nqueues: {}\n", encoding="utf-8")
    common = ["--nats", url, "--topology-tag", tag, "--config", str(config)]
    serve = subprocess.Popen(
        [*CLI, "serve", *common, "--http-port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_until(lambda: http_get(port, "/healthz")[0] == 200, "healthz 200")
        done = cli("ingest", *common, "--queue", "team/app", "--uri", "A")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["request_id"] == "request/team/app/1"

        def processing() -> bool:
            return [r["state"] for r in status(url, tag)["requests"]] == ["processing"]

        wait_until(processing, "A processing (consumer started by discovery)")
        assert cli("ingest", *common, "--queue", "team/app", "--uri", "B").returncode == 0
        metrics = wait_until(
            lambda: (body := http_get(port, "/metrics")[1]) and 'event="held"' in body and body,
            "a hold in the metrics",
        )
        assert 'stovepipe_queue_in_flight{queue="team/app"} 1' in metrics
        assert 'stovepipe_queue_max_concurrent{queue="team/app"} 1' in metrics
        assert 'stovepipe_build_info{version="' in metrics
        assert 'stovepipe_policy_reloads_total{part="machines",result="failed"} 0' in metrics
        assert "stovepipe_policy_last_good_load_timestamp_seconds " in metrics
        # B waits behind A: its message is the queue's backlog, with an age.
        assert 'stovepipe_queue_backlog{queue="team/app"} 1' in metrics
        assert 'stovepipe_queue_oldest_waiting_seconds{queue="team/app"} ' in metrics
        assert "stovepipe_dead_letters_total 0" in metrics
        # One consumer (team/app) under the stream's limit; no account limit here.
        assert "stovepipe_process_consumers 1\n" in metrics
        assert "stovepipe_process_consumer_limit 10000\n" in metrics
        assert "stovepipe_account_consumer_limit -1\n" in metrics
        # A admitted and B held at least once: two or more decisions, all under +Inf.
        count = int(metrics.split("stovepipe_decision_latency_ms_count ")[1].split()[0])
        assert count >= 2
        assert f'stovepipe_decision_latency_ms_bucket{{le="+Inf"}} {count}' in metrics
        done = cli(
            "complete",
            *common,
            *("--queue", "team/app", "--uri", "A", "--outcome", "succeeded", "--wait", "20"),
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["request"]["state"] == "succeeded"

        def b_processing() -> dict | None:
            doc = status(url, tag)
            states = [r["state"] for r in doc["requests"]]
            return doc if states == ["succeeded", "processing"] else None

        doc = wait_until(b_processing, "B admitted")
        # as docs/service.md shows
        assert set(doc) == {"requests", "queues", "slot_holders", "queue_details", "policy"}
        policy_hash = doc["policy"]["hash"]
        assert f'stovepipe_policy_info{{hash="{policy_hash}"}} 1' in http_get(port, "/metrics")[1]
        assert doc["slot_holders"] == {"team/app": ["request/team/app/2"]}
        b = doc["requests"][1]
        times = {k: b.pop(k) for k in ("ingested_at_ms", "admitted_at_ms", "ended_at_ms")}
        assert b == {
            "id": "request/team/app/2",
            "queue": "team/app",
            "uri": "B",
            "state": "processing",
            "build_strategy": "full",  # no repository configured: ancestry unknown
            "base_uri": "",
            "superseded_by": "",
        }
        assert 0 < times["ingested_at_ms"] <= times["admitted_at_ms"] and times["ended_at_ms"] == 0
        a = doc["requests"][0]
        assert a["admitted_at_ms"] <= a["ended_at_ms"], "A ended after it was admitted"
        assert doc["queues"] == [
            {
                "name": "team/app",
                "in_flight_count": 1,
                "last_green_uri": "A",
                "latest_request_id": "request/team/app/2",
            }
        ]
        missing = cli(
            "complete", *common, "--queue", "team/app", "--uri", "Z", "--outcome", "failed"
        )
        assert missing.returncode == 2 and "no request" in missing.stderr
    finally:
        serve.send_signal(signal.SIGTERM)
        _out, err = serve.communicate(timeout=TIMEOUT_S)
    assert serve.returncode == 0, err
    records = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert records and all({"level", "message"} <= r.keys() for r in records)
    assert any(r.get("queue") == "team/app" and r.get("request_id") for r in records)
    assert "service stopped" in [r["message"] for r in records]
    assert f"policy {policy_hash} in force" in [r["message"] for r in records]


@pytest.mark.nats  # the child process starts the embedded broker
def test_demo_runs_the_walkthrough_and_exits_zero() -> None:
    done = cli("demo", timeout=60)
    assert done.returncode == 0, done.stderr
    final = done.stdout.split("requests:")[-1]
    rows = [line.split() for line in final.splitlines() if line.startswith("  request/")]
    assert [(r[1], r[2]) for r in rows] == [
        ("A", "succeeded"),
        ("B", "superseded"),
        ("C", "superseded"),
        ("D", "superseded"),
        ("E", "superseded"),
        ("F", "succeeded"),
    ]
    assert rows[-1][3:] == ["incremental_since_green", "A"]
    assert "held" in done.stdout
    # The final status names the policy the demo ran by its hash.
    [policy] = [line for line in done.stdout.splitlines() if line.startswith("policy:")]
    assert re.fullmatch(r"policy: [0-9a-f]{16} \(loaded \S+ by \S+\)", policy), policy


def test_serve_reports_a_machine_defect_before_reaching_for_the_broker(tmp_path) -> None:
    """No broker listens at the address: the defect is still what serve reports."""
    from fixture_policy import GATE_YAML, copy_policy

    policy = copy_policy(tmp_path / "policy")
    gate = policy / "machines" / GATE_YAML.name
    gate.write_text(gate.read_text().replace("initial: received\n", "initial: recieved\n", 1))
    line = gate.read_text().splitlines().index("initial: recieved") + 1
    done = subprocess.run(
        [
            *CLI,
            "serve",
            "--nats",
            f"nats://127.0.0.1:{free_port()}",
            "--connect-timeout",
            "2",
            "--machines",
            str(policy / "machines"),
            "--config",
            str(policy / "config" / "queues.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 2, done.stderr
    assert f"{gate}:{line}:10:" in done.stderr and "recieved" in done.stderr
    assert "cannot reach NATS" not in done.stderr

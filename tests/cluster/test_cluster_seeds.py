"""Every command starts while one seed of the cluster is down (real processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

from nats_cluster import NatsCluster
from test_service_cli import CLI, ROOT, cli, http_get, wait_until

from stovepipe_fsm.adapters.jetstream.server import free_port


def test_commands_start_with_one_seed_down(nats_cluster: NatsCluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "queues.yaml"
    config.write_text("defaults: {gate_wait_delay_ms: 200}\nqueues: {}\n", encoding="utf-8")
    common = ["--nats", nats_cluster.seeds, "--topology-tag", "seeds", "--config", str(config)]
    # The topology is created while every node is up (a 3-replica stream needs 3 peers).
    done = cli("ingest", *common, "--replicas", "3", "--queue", "team/app", "--uri", "A")
    assert done.returncode == 0, done.stderr
    down = nats_cluster.names[0]  # the first seed of the list
    nats_cluster.node(down).stop()
    try:
        done = cli("status", "--json", *common)
        assert done.returncode == 0, done.stderr
        assert [r["uri"] for r in json.loads(done.stdout)["requests"]] == ["A"]
        done = cli("ingest", *common, "--replicas", "3", "--queue", "team/app", "--uri", "B")
        assert done.returncode == 0, done.stderr
        port = free_port()
        serve = subprocess.Popen(
            [*CLI, "serve", *common, "--replicas", "3", "--http-port", str(port)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            wait_until(lambda: http_get(port, "/healthz")[0] == 200, "healthz 200")

            def admitted() -> bool:
                done = cli("status", "--json", *common)
                states = {r["uri"]: r["state"] for r in json.loads(done.stdout)["requests"]}
                return states.get("B") == "processing"

            wait_until(admitted, "B admitted by the service started with a seed down")
            done = cli("prune", *common, "--older-than", "1d")
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["kept_recent"] == 1  # A, superseded just now
        finally:
            serve.send_signal(signal.SIGTERM)
            _, stderr = serve.communicate(timeout=30)
        assert serve.returncode == 0, stderr
    finally:
        nats_cluster.start_node(down)

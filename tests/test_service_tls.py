"""Operator commands over TLS to a real nats-server that requires it (loopback only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tls_certs import make_certificates

from stovepipe_fsm.adapters.jetstream import NatsServer

CLI = [sys.executable, "-m", "stovepipe_fsm.apps.cli"]
ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.nats
def test_ingest_over_tls_with_a_client_certificate(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path)
    server_args = (
        "--tls",
        "--tlscert",
        str(certs.server_cert),
        "--tlskey",
        str(certs.server_key),
        "--tlscacert",
        str(certs.ca),
        "--tlsverify",  # the server demands a client certificate too
    )
    with NatsServer(tmp_path / "store", extra_args=server_args) as server:
        url = f"tls://127.0.0.1:{server.port}"
        base = ["ingest", "--nats", url, "--topology-tag", "tls", "--queue", "q/tls"]
        base += ["--connect-timeout", "3"]
        trusted = [
            "--tls-ca",
            str(certs.ca),
            "--tls-cert",
            str(certs.client_cert),
            "--tls-key",
            str(certs.client_key),
        ]

        done = cli(*base, "--uri", "A", *trusted)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["created"] is True

        # Without the CA the server's certificate is not trusted: a clean failure.
        untrusted = cli(*base, "--uri", "B")
        assert untrusted.returncode == 1
        assert "cannot reach NATS" in untrusted.stderr and "Traceback" not in untrusted.stderr
        assert "within 3 s" in untrusted.stderr

        # The server refuses a client without a certificate.
        no_client_cert = cli(*base, "--uri", "C", "--tls-ca", str(certs.ca))
        assert no_client_cert.returncode == 1
        assert "Traceback" not in no_client_cert.stderr


def test_unreadable_tls_files_are_usage_errors(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    done = cli("ingest", "--queue", "q", "--uri", "A", "--tls-ca", missing)
    assert done.returncode == 2
    assert f"--tls-ca {missing}" in done.stderr and "Traceback" not in done.stderr
    half = cli("serve", "--tls-cert", missing)
    assert half.returncode == 2
    assert "--tls-cert and --tls-key go together" in half.stderr

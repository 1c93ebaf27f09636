"""Secrets come from files and the environment, and never show up in what is printed.

The broker-facing cases run the real CLI against a real nats-server that requires a user
and password.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nkeys  # type: ignore[import-untyped]
import pytest
from test_service_cli import CLI, ROOT, cli

from stovepipe_fsm.adapters.jetstream import NatsServer
from stovepipe_fsm.apps.service.secrets import (
    ENV_PASSWORD,
    ENV_TOKEN,
    ENV_USER,
    redact,
    resolve_credentials,
)

SECRET = "s3cret-pa55"


def secret_file(tmp_path: Path, text: str, name: str = "password", mode: int = 0o600) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return str(path)


def test_redact_removes_user_info_from_every_url() -> None:
    text = "no connection to nats://alice:pw@10.0.0.1:4222, tls://tok@h:4443 or nats://h:1"
    assert redact(text) == "no connection to nats://***@10.0.0.1:4222, tls://***@h:4443 or nats://h:1"


def test_a_password_file_wins_over_the_environment(tmp_path: Path) -> None:
    path = secret_file(tmp_path, SECRET + "\n")
    env = {ENV_USER: "alice", ENV_PASSWORD: "from-env", ENV_TOKEN: "tok"}
    creds = resolve_credentials(password_file=path, environ=env)
    assert (creds.user, creds.password, creds.token, creds.warnings) == ("alice", SECRET, "tok", ())
    assert resolve_credentials(environ=env).password == "from-env"


def test_a_secret_on_the_command_line_works_with_a_warning_that_does_not_repeat_it() -> None:
    creds = resolve_credentials(password=SECRET, environ={})
    assert creds.password == SECRET
    assert len(creds.warnings) == 1 and SECRET not in creds.warnings[0]
    assert "--password-file" in creds.warnings[0]


@pytest.mark.parametrize(
    ("write", "message"),
    [
        ("", "is empty"),
        (None, "No such file"),
    ],
    ids=["empty", "missing"],
)
def test_a_bad_secret_file_is_a_usage_error_naming_it(
    tmp_path: Path, write: str | None, message: str
) -> None:
    path = secret_file(tmp_path, write) if write is not None else str(tmp_path / "absent")
    with pytest.raises(ValueError, match=message) as caught:
        resolve_credentials(token_file=path, environ={})
    assert "--token-file" in str(caught.value)


def test_a_secret_file_others_can_read_is_flagged(tmp_path: Path) -> None:
    path = secret_file(tmp_path, SECRET, mode=0o644)
    creds = resolve_credentials(password_file=path, environ={})
    assert creds.warnings == (f"--password-file {path} is readable by other users; chmod 600 it",)


def test_both_a_secret_and_its_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="give one"):
        resolve_credentials(password="x", password_file=secret_file(tmp_path, SECRET), environ={})


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    store = tmp_path_factory.mktemp("auth-nats")
    with NatsServer(store, extra_args=("--user", "alice", "--pass", SECRET)) as server:
        yield server


@pytest.mark.nats
def test_the_cli_connects_with_a_password_from_a_file_or_the_environment(
    auth_server: NatsServer, tmp_path: Path
) -> None:
    common = ("--nats", auth_server.url, "--user", "alice", "--topology-tag", "sec")
    password_file = secret_file(tmp_path, SECRET)
    by_file = cli("ingest", *common, "--queue", "q", "--uri", "A", "--password-file", password_file)
    assert by_file.returncode == 0, by_file.stderr
    by_env = subprocess.run(
        [*CLI, "status", *common],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, ENV_PASSWORD: SECRET},
        check=False,
    )
    assert by_env.returncode == 0, by_env.stderr


@pytest.mark.nats
def test_a_refused_connection_prints_no_secret(auth_server: NatsServer, tmp_path: Path) -> None:
    host_port = auth_server.url.removeprefix("nats://")
    wrong = "wr0ng-" + SECRET
    in_url = cli("status", "--nats", f"nats://alice:{wrong}@{host_port}", "--connect-timeout", "3")
    assert in_url.returncode == 1
    in_file = cli(
        *("status", "--nats", auth_server.url, "--user", "alice", "--connect-timeout", "3"),
        *("--password-file", secret_file(tmp_path, wrong)),
    )
    assert in_file.returncode == 1
    for done in (in_url, in_file):
        assert wrong not in done.stdout + done.stderr
        assert "error:" in done.stderr


@pytest.mark.nats
def test_the_cli_connects_as_an_nkey_user_and_never_shows_the_seed(tmp_path: Path) -> None:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    config = tmp_path / "nkey.conf"
    config.write_text(
        f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}\n',
        encoding="utf-8",
    )
    seed_file = secret_file(tmp_path, seed.decode(), name="user.nk")
    with NatsServer(tmp_path / "store", extra_args=("-c", str(config))) as server:
        common = ("--nats", server.url, "--topology-tag", "nkey")
        refused = cli("status", *common, "--connect-timeout", "3")
        assert refused.returncode == 1, refused.stderr
        done = cli("ingest", *common, "--nkey", seed_file, "--queue", "q", "--uri", "A")
        assert done.returncode == 0, done.stderr
        status = cli("status", *common, "--nkey", seed_file)
        assert status.returncode == 0, status.stderr
    for run in (done, status):
        assert seed.decode() not in run.stdout + run.stderr


@pytest.mark.nats  # the child process starts the embedded broker
def test_serve_embedded_prints_its_url_and_keeps_its_files_private(tmp_path: Path) -> None:
    data = tmp_path / "nats-data"
    serve = subprocess.Popen(
        [*CLI, "serve", "--embedded", "--data-dir", str(data), "--topology-tag", "private"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()
        assert line.startswith("embedded nats-server: nats://127.0.0.1:"), line
        url = line.split()[2]
        done = cli("status", "--nats", url, "--topology-tag", "private")
        assert done.returncode == 0, done.stderr
    finally:
        serve.send_signal(signal.SIGTERM)
        _out, err = serve.communicate(timeout=60)
    assert serve.returncode == 0, err
    created = [p for p in data.rglob("*")]
    assert created, "the embedded server stored nothing"
    shared = [p for p in created if p.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO)]
    assert shared == []


def test_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stovepipe_fsm.apps.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("stovepipe-fsm 0.")

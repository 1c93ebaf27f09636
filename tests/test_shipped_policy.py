"""The policy ships inside the package: commands run from any directory.

``--machines`` and ``--config`` default to ``machines/`` and ``config/queues.yaml`` of the
working directory when it has them, and to the installed copies otherwise. Run as a user
would, in fresh processes from an empty directory and from the repository.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stovepipe_fsm.shipped import SHIPPED_CONFIG, SHIPPED_MACHINES

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "stovepipe_fsm.apps.cli"]
WALKTHROUGH = ROOT / "examples" / "walkthrough.yaml"


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_shipped_copies_are_the_repository_policy() -> None:
    assert sorted(p.name for p in SHIPPED_MACHINES.glob("*.yaml")) == [
        "culprit.yaml",
        "queue_gate.yaml",
        "request.yaml",
    ]
    for shipped in (*SHIPPED_MACHINES.glob("*.yaml"), SHIPPED_CONFIG):
        source = ROOT / shipped.parent.name / shipped.name
        assert shipped.read_bytes() == source.read_bytes()


def test_commands_run_from_a_directory_without_a_policy(tmp_path: Path) -> None:
    done = run(tmp_path, "validate")
    assert done.returncode == 0, done.stderr
    anywhere = run(tmp_path, "simulate", str(WALKTHROUGH), "--json")
    here = run(ROOT, "simulate", str(WALKTHROUGH), "--json")
    assert anywhere.returncode == here.returncode == 0, anywhere.stderr + here.stderr
    assert json.loads(anywhere.stdout) == json.loads(here.stdout)


def test_a_policy_in_the_working_directory_wins(tmp_path: Path) -> None:
    (tmp_path / "machines").mkdir()
    (tmp_path / "machines" / "request.yaml").write_text("name: request\n", encoding="utf-8")
    done = run(tmp_path, "validate")
    assert done.returncode != 0
    assert "machines/request.yaml:1:1" in done.stdout + done.stderr

"""A policy directory is a unit: commands run inside it find its parts by default.

Each example policy is copied to a temporary directory and its README's commands are
run there, without paths, as a separate process (as a user types them): ``validate``
finds ``machines/`` and ``config/queues.yaml``, ``test`` finds ``timelines/``,
``diagram --check`` finds ``docs/``, and the plugin modules beside ``machines/`` are
imported from there. A config validated from elsewhere is checked against the machines
of its own policy directory, and the command says which.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stovepipe_fsm.apps.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "policies"
NAMES = sorted(p.name for p in EXAMPLES.iterdir() if (p / "machines").is_dir())
CLI = [sys.executable, "-I", "-m", "stovepipe_fsm.apps.cli"]  # -I: the cwd is not on sys.path


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def copied(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(EXAMPLES / name, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


@pytest.mark.parametrize("name", NAMES)
def test_the_short_commands_run_inside_a_copied_example(tmp_path: Path, name: str) -> None:
    policy = copied(tmp_path, name)
    validate = run(policy, "validate")
    assert validate.returncode == 0, validate.stdout + validate.stderr
    files = len(list((policy / "machines").glob("*.yaml"))) + 1  # and config/queues.yaml
    assert validate.stderr.strip() == f"validated {files} file(s): ok"
    test = run(policy, "test")
    timelines = len(list((policy / "timelines").glob("*.yaml")))
    assert test.returncode == 0, test.stdout + test.stderr
    assert f"{timelines} passed, 0 failed" in test.stderr
    diagrams = run(policy, "diagram", "--check")
    assert diagrams.returncode == 0, diagrams.stderr
    assert diagrams.stderr.strip() == "diagrams in docs are up to date"


@pytest.mark.parametrize("name", NAMES)
def test_each_readme_shows_the_short_commands(name: str) -> None:
    readme = (EXAMPLES / name / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"^\$ (stovepipe-fsm .*)$", readme, re.M)
    assert "stovepipe-fsm validate" in commands
    assert "stovepipe-fsm test" in commands
    for command in commands:  # what the policy directory gives is never spelled out
        assert "--machines machines" not in command and "config/queues.yaml" not in command


def test_test_outside_a_policy_says_where_it_looked(tmp_path: Path) -> None:
    result = run(tmp_path, "test")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: no timelines given, and no timelines/ or tests/timelines/ here"
    )


def test_a_config_validated_from_elsewhere_is_checked_against_its_policy_machines(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The embargo example's config sets `embargo`, which only its own machines declare.
    monkeypatch.chdir(ROOT)
    config = "examples/policies/embargo_plugin/config/queues.yaml"
    capsys.readouterr()
    assert main(["validate", config]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{config}: checked against the machines in examples/policies/embargo_plugin/machines",
        "validated 1 file(s): ok",
    ]
    # Against other machines, on request: named, and the key they do not declare refused.
    assert main(["validate", config, "--machines", "machines"]) == 1
    out, err = capsys.readouterr()
    assert "unknown key 'embargo'" in out
    assert err.splitlines()[0] == f"{config}: checked against the machines in machines"

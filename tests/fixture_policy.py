"""The tests' own policy: where it lives, and how a test takes a copy to edit.

``tests/fixtures/`` holds machines and a queue config that began as copies of the
shipped ones (``fixtures/README.md`` says which tests use them and which read the
shipped files). Tests of the framework (lint, schema, compiler, diagrams, validate,
check's mutants, renames) edit these, never ``machines/`` or ``config/``, so a user who
changes the shipped policy can still run them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MACHINES = FIXTURES / "machines"
CONFIG = FIXTURES / "config" / "queues.yaml"
REQUEST_YAML = MACHINES / "request.yaml"
GATE_YAML = MACHINES / "queue_gate.yaml"


def copy_policy(target: Path) -> Path:
    """``target/machines/`` and ``target/config/queues.yaml``, copied from the fixtures."""
    shutil.copytree(MACHINES, target / "machines")
    (target / "config").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(CONFIG, target / "config" / "queues.yaml")
    return target

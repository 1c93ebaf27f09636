"""The policy shipped with the package: ``machines/`` and ``config/queues.yaml``.

They are the repository's top-level ``machines/`` and ``config/`` (linked here), installed
as package data, so every command has a policy to fall back on when its working directory
holds none (:mod:`stovepipe_fsm.apps.options`).
"""

from pathlib import Path

SHIPPED = Path(__file__).resolve().parent
SHIPPED_MACHINES = SHIPPED / "machines"
SHIPPED_CONFIG = SHIPPED / "config" / "queues.yaml"

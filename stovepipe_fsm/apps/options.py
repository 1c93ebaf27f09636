"""What every command shares: exit codes, default policy paths, loading the policy.

The commands (``simulate``, ``check``, the service and its operator commands) are
independent of one another; what they have in common lives here, below all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..adapters.memory.config import StaticConfigStore
from ..config.loader import load_queue_config
from ..machine.model import ParameterSpec
from ..shipped import SHIPPED_CONFIG, SHIPPED_MACHINES

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


def installed_version() -> str:
    """The installed distribution's version (``unknown`` when run from an uninstalled tree)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("stovepipe-fsm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def here_or_shipped(relative: str, shipped: Path) -> str:
    """``relative`` when the working directory has it, else the copy installed with the
    package: every command runs from any directory, and a policy kept beside the
    deployment wins over the shipped one."""
    return relative if Path(relative).exists() else str(shipped)


DEFAULT_MACHINES = here_or_shipped("machines", SHIPPED_MACHINES)
DEFAULT_CONFIG = here_or_shipped("config/queues.yaml", SHIPPED_CONFIG)


def load_policy_store(
    config_path: str, parameters: Mapping[str, ParameterSpec] | None = None
) -> StaticConfigStore:
    """The queue policy in ``config_path``, validated, served for the life of a command.

    ``parameters`` are the policy's declarations: with them an unknown key or a value of
    the wrong type is a located error; without them any further key is accepted.
    """
    return StaticConfigStore(load_queue_config(config_path, parameters=parameters))

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
#: The help text of ``--machines`` and ``--config`` wherever a command takes them.
MACHINES_HELP = "the policy's machines directory (default: machines here, else the shipped one)"
CONFIG_HELP = (
    "the policy's queue config (default: config/queues.yaml here, else the shipped one)"
)

#: Where a policy directory keeps its timelines and its generated diagrams, in the order
#: they are looked for in the working directory (:func:`first_existing`): an example
#: policy's ``timelines/`` and ``docs/``, the repository's ``tests/timelines/`` and
#: ``docs/diagrams/``.
TIMELINE_DIRS = ("timelines", "tests/timelines")
DIAGRAM_DIRS = ("docs/diagrams", "docs")


def first_existing(candidates: tuple[str, ...]) -> str | None:
    """The first of ``candidates`` that is a directory here, or None."""
    return next((c for c in candidates if Path(c).is_dir()), None)


def machines_of_config(config_path: str | Path) -> Path | None:
    """The machines directory of the policy a config file belongs to: ``P/machines`` for
    ``P/config/queues.yaml``, when it exists; None for a config kept elsewhere."""
    config_dir = Path(config_path).parent
    machines = config_dir.parent / "machines"
    return machines if config_dir.name == "config" and machines.is_dir() else None


def load_policy_store(
    config_path: str, parameters: Mapping[str, ParameterSpec] | None = None
) -> StaticConfigStore:
    """The queue policy in ``config_path``, validated, served for the life of a command.

    ``parameters`` are the policy's declarations: with them an unknown key or a value of
    the wrong type is a located error; without them any further key is accepted.
    """
    return StaticConfigStore(load_queue_config(config_path, parameters=parameters))

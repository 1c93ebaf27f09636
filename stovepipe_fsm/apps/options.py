"""What every command shares: exit codes, default policy paths, loading the policy.

The commands (``simulate``, ``check``, the service and its operator commands) are
independent of one another; what they have in common lives here, below all of them.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..adapters.memory.config import StaticConfigStore
from ..config.loader import load_queue_config
from ..spec.model import ParameterSpec

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
DEFAULT_MACHINES = "machines"
DEFAULT_CONFIG = "config/queues.yaml"


def load_policy_store(
    config_path: str, parameters: Mapping[str, ParameterSpec] | None = None
) -> StaticConfigStore:
    """The queue policy in ``config_path``, validated, served for the life of a command.

    ``parameters`` are the policy's declarations: with them an unknown key or a value of
    the wrong type is a located error; without them any further key is accepted.
    """
    return StaticConfigStore(load_queue_config(config_path, parameters=parameters))

"""What every command shares: exit codes, default policy paths, loading the policy.

The commands (``simulate``, ``check``, the service and its operator commands) are
independent of one another; what they have in common lives here, below all of them.
"""

from __future__ import annotations

from ..adapters.memory.config import StaticConfigStore
from ..config.loader import load_queue_config

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
DEFAULT_MACHINES = "machines"
DEFAULT_CONFIG = "config/queues.yaml"


def load_policy_store(config_path: str) -> StaticConfigStore:
    """The queue policy in ``config_path``, validated, served for the life of a command."""
    return StaticConfigStore(load_queue_config(config_path))

"""Per-queue policy: ``config/queues.yaml`` loaded, validated and resolved per queue name.

The pipeline never writes this configuration; it reads it at decision time through the
``ConfigStore`` port (file-backed with hot reload in ``adapters/file``, static in
``adapters/memory``). See ``docs/config.md`` for the format and precedence rules.
"""

from .checks import key_issues, name_problem, pattern_problem
from .globs import common_match, glob_match, globs_overlap, is_pattern, specificity
from .loader import (
    DEFAULT_CONFIG_PATH,
    check_queue_config,
    document_issues,
    load_queue_config,
    policy_from_document,
    policy_from_mapping,
)
from .policy import SETTING_NAMES, PolicyEntry, QueuePolicy, Settings, tie_issues

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "SETTING_NAMES",
    "PolicyEntry",
    "QueuePolicy",
    "Settings",
    "check_queue_config",
    "common_match",
    "document_issues",
    "glob_match",
    "globs_overlap",
    "is_pattern",
    "key_issues",
    "load_queue_config",
    "name_problem",
    "pattern_problem",
    "policy_from_document",
    "policy_from_mapping",
    "specificity",
    "tie_issues",
]

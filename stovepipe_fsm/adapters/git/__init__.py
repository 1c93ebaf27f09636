"""Git adapter: ``SourceControl`` backed by a local repository (``git`` subprocesses).

Kept apart from the memory adapters because it launches processes; the core reaches it
only through ``stovepipe_fsm.ports.source_control``.
"""

from .cache import AncestryCache
from .commits import check_commitish, is_full_commit_id
from .runner import GitResult, git_environment, subprocess_runner
from .source_control import GitSourceControl, GitSourceControlProvider, rev_parse

__all__ = [
    "AncestryCache",
    "GitResult",
    "GitSourceControl",
    "GitSourceControlProvider",
    "check_commitish",
    "git_environment",
    "is_full_commit_id",
    "rev_parse",
    "subprocess_runner",
]

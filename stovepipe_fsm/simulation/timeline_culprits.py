"""A timeline's ``culprits:`` and ``flake_rate``: which commits broke the build, and how
flaky its builds are (what :mod:`.builds` ends builds with).

The schema checks their shape; what it cannot see is checked here, each at its
location: a culprit (and its fix) must be a commit of the history, a fix must descend
from its culprit on the first-parent line (elsewhere it would fix nothing), and both
keys need recorded builds, whose durations the builds they end take.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..located.errors import Location, SpecIssue
from .builds import Culprit

Locate = Callable[[tuple[str | int, ...], bool], Location]


def read_culprits(
    data: Mapping[str, Any],
    history: Mapping[str, Sequence[str]],
    locate: Locate,
    issues: list[SpecIssue],
) -> tuple[tuple[Culprit, ...] | None, float]:
    """The declared culprits (``None`` when the timeline declares none) and the flake
    rate of a timeline whose shape the schema accepted; problems go to ``issues``."""
    flake_rate = float(data.get("flake_rate", 0.0))
    culprits = None
    if "culprits" in data:
        listed = enumerate(data["culprits"])
        culprits = tuple(_culprit(raw, i, history, locate, issues) for i, raw in listed)
    for key in ("culprits", "flake_rate"):
        if key in data and not data.get("builds"):
            needs = "needs the timeline's recorded builds (builds:), whose durations the builds"
            issues.append(SpecIssue(locate((key,), True), f"{key}: {needs} it ends take"))
    return culprits, flake_rate


def _culprit(
    raw: str | Mapping[str, str],
    index: int,
    history: Mapping[str, Sequence[str]],
    locate: Locate,
    issues: list[SpecIssue],
) -> Culprit:
    commit = raw if isinstance(raw, str) else raw["commit"]
    fixed_by = "" if isinstance(raw, str) else raw.get("fixed_by", "")
    where = locate(("culprits", index), False)
    problem = ""
    if commit not in history:
        problem = f"{commit!r} is not a commit of the history"
    elif fixed_by and fixed_by not in history:
        problem = f"fixed_by {fixed_by!r} is not a commit of the history"
    elif fixed_by and not _on_first_parents(history, fixed_by, commit):
        problem = (
            f"fixed_by {fixed_by!r} does not descend from {commit!r} on its first-parent "
            "line, so it fixes nothing"
        )
    if problem:
        issues.append(SpecIssue(where, f"culprits[{index}]: {problem}"))
    return Culprit(commit, fixed_by, where)


def _on_first_parents(history: Mapping[str, Sequence[str]], head: str, commit: str) -> bool:
    """Whether ``commit`` is a strict first-parent ancestor of ``head``."""
    seen: set[str] = set()
    parents = history.get(head, ())
    while parents and parents[0] not in seen:
        first = parents[0]
        if first == commit:
            return True
        seen.add(first)
        parents = history.get(first, ())
    return False

"""The newest green ancestor: which recorded green an admission builds on.

A queue row keeps its recent greens, newest first (``Queue.greens``, bounded by the
policy's ``recent_greens``). The base of an incremental build is the newest of them that
is an ancestor of the head: source control is asked about one green at a time, newest
first, and the search stops at the first ancestor, so an admission costs at most as many
ancestry queries as the row lists greens (one when last green is an ancestor, the usual
fast-forward). With no green listed, none an ancestor, or a commit source control does
not know, there is no base and the build is full; :attr:`BaseChoice.full_cause` says
which.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..domain.entities import Green
from ..domain.errors import NotFound
from ..ports.config import ConfigStore
from ..ports.source_control import SourceControl
from .lifecycle import GreensKept

#: The gate's parameter: how many recent greens a queue keeps (queue_gate.yaml).
RECENT_GREENS = "recent_greens"

#: Why an admission builds in full (the trail's ``full_cause``).
COLD_START = "cold start"
NO_GREEN_ANCESTOR = "no recorded green is an ancestor"
ANCESTRY_UNKNOWN = "ancestry unknown"
PATH_RULE = "path rule"
NO_REPOSITORY = "no repository configured"


@dataclass(frozen=True)
class BaseChoice:
    """What the search over a queue's recent greens found for one head.

    ``green`` is the newest green that is an ancestor of the head (None: none is);
    ``passed`` the newer greens that are not; ``unknown`` those whose ancestry source
    control could not tell (a commit it does not know); ``asked`` how many ancestry
    queries the search made.
    """

    green: Green | None
    passed: tuple[Green, ...] = ()
    unknown: tuple[Green, ...] = ()
    asked: int = 0

    @property
    def descends_from_last_green(self) -> bool:
        """The chosen green is last green itself: nothing newer was passed over."""
        return self.green is not None and not self.passed and not self.unknown

    @property
    def full_cause(self) -> str:
        """Why there is no base ("" when there is one)."""
        if self.green is not None:
            return ""
        if self.unknown:
            return ANCESTRY_UNKNOWN
        return NO_GREEN_ANCESTOR if self.passed else COLD_START


async def newest_green_ancestor(
    source_control: SourceControl, greens: Sequence[Green], head: str
) -> BaseChoice:
    """The newest of ``greens`` (newest first) that is an ancestor of ``head``.

    One ``is_ancestor`` per green, stopping at the first ancestor. A green whose ancestry
    is unknown (``NotFound``) is passed over: an older one that is an ancestor is still a
    sound base. Any other error (``Retryable``) is raised: nothing is decided on a
    transient failure.
    """
    passed: list[Green] = []
    unknown: list[Green] = []
    for green in greens:
        try:
            is_ancestor = await source_control.is_ancestor(green.uri, head)
        except NotFound:
            unknown.append(green)
            continue
        if is_ancestor:
            return BaseChoice(green, tuple(passed), tuple(unknown), len(passed) + len(unknown) + 1)
        passed.append(green)
    return BaseChoice(None, tuple(passed), tuple(unknown), len(passed) + len(unknown))


def greens_kept_by(config: ConfigStore) -> GreensKept:
    """How many recent greens each queue keeps, as ``config`` says: its ``recent_greens``,
    or 1 (last green alone) when the policy does not declare the parameter."""

    def kept(queue: str) -> int:
        return int(dict(config.get(queue).parameters).get(RECENT_GREENS, 1))

    return kept


def greens_considered(greens: Sequence[Green], kept: int) -> tuple[Green, ...]:
    """The newest ``kept`` of ``greens``: a row written under a larger bound is read
    under the bound in force."""
    return tuple(greens[: max(1, kept)])

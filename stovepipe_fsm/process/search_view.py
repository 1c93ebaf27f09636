"""What a plugin's ``culprit`` condition or action receives: a view of one ended build.

:class:`SearchView` wraps the search machine's :class:`~.culprit.SearchContext` and shows
what a plugin may rely on: the request whose build ended and how (red, green), the
queue's search as this event has made it so far, the queue's parameters, the clock,
changed paths between commits, metrics and a per-event scratch dict. A plugin decides
with it, for instance, that a blamelist touching only documentation is not worth probe
builds; the search row itself is written only by the built-in steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ..domain.culprit_search import CulpritSearch
from ..domain.entities import Request
from .culprit import SearchContext
from .plugin_context import source_control_of


class SearchView:
    """One ended build of a queue, as a plugin's ``culprit`` step sees it."""

    __slots__ = ("_ctx", "_origin")

    def __init__(self, ctx: SearchContext, origin: str) -> None:
        self._ctx = ctx
        self._origin = origin

    @property
    def ended(self) -> Request:
        """The request whose build ended (a head, or a probe: its ``probe_of`` is set)."""
        return self._ctx.ended

    @property
    def red(self) -> bool:
        """It ended with an outcome the request machine declares red."""
        return self._ctx.outcome.red

    @property
    def green(self) -> bool:
        """It ended with the green outcome."""
        return self._ctx.outcome.green

    @property
    def search(self) -> CulpritSearch:
        """The queue's search as this event has made it so far (a frozen value: the red
        head, the blamelist oldest first, the results, the probes in flight)."""
        return self._ctx.row

    @property
    def parameters(self) -> Mapping[str, Any]:
        """The queue's parameters, resolved; list values are tuples. Read-only."""
        return MappingProxyType(dict(self._ctx.config.parameters))

    def param(self, name: str) -> Any:
        """Parameter ``name`` of the queue; ``KeyError`` naming the set ones if unset."""
        return self._ctx.config.param(name)

    def now_ms(self) -> int:
        """The clock (epoch milliseconds), simulated where the world is."""
        return self._ctx.services.clock.now_ms()

    @property
    def scratch(self) -> dict[str, Any]:
        """A dict for this event only: an action stores, a later condition reads."""
        return self._ctx.scratch

    async def changed_paths(self, base: str, head: str) -> frozenset[str]:
        """The paths whose content differs between commits ``base`` and ``head``.
        ``NotFound``: a commit (or the repository) is unknown; ``Retryable``: a
        transient failure."""
        source = source_control_of(self._ctx.services, self._ctx.ended.queue)
        return await source.changed_paths(base, head)

    def count(self, metric: str, amount: int = 1) -> None:
        """Add ``amount`` to the counter ``metric`` of the queue (``/metrics``)."""
        self._ctx.services.metrics.count(metric, self._ctx.ended.queue, amount)

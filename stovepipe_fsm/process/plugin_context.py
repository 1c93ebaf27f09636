"""What a plugin's ``queue_gate`` condition or action receives: a view of one delivery.

:class:`PluginContext` wraps the delivery's :class:`~.context.DeliveryContext` and shows
only what a plugin may rely on, under names that stay when the context's internals
change: the request, its queue's row (:class:`QueueView`), the queue's resolved
parameters, the clock, source control (ancestry and changed paths), the request
lifecycle's roles, metrics, trail notes and a per-delivery scratch dict.

Conditions are synchronous and do no I/O: they read the properties and ``scratch``.
The ``async`` methods (source control, trail notes) are for actions; an action that
runs before a condition stores what the condition needs in ``scratch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..domain.entities import Request
from ..domain.errors import NotFound
from ..domain.hooks import HookEvent, name_based_id
from ..ports.source_control import SourceControl
from .context import DeliveryContext
from .services import StageServices
from .trail_notes import note_plugin


@dataclass(frozen=True)
class QueueView:
    """The request's queue row, as this delivery loaded it (or last wrote it).

    ``last_green_uri``: the commit of the queue's last successful validation, and
    ``last_green_request_id`` the request that validated it ("" when none yet);
    ``latest_request_id``: the newest request ingested on the queue; ``slot_holders``:
    the requests holding a build slot now.
    """

    name: str
    last_green_uri: str
    last_green_request_id: str
    latest_request_id: str
    slot_holders: tuple[str, ...]


class PluginContext:
    """One delivery of one request, as a plugin's condition or action sees it."""

    __slots__ = ("_ctx", "_hooks", "_origin")

    def __init__(
        self, ctx: DeliveryContext, origin: str, hooks: frozenset[str] | set[str] = frozenset()
    ) -> None:
        self._ctx = ctx
        self._origin = origin
        self._hooks = hooks

    # --- what a condition may read -------------------------------------------------

    @property
    def request(self) -> Request:
        """The request being decided (a frozen value: id, queue, uri, state, ...)."""
        return self._ctx.request

    @property
    def queue(self) -> QueueView:
        """The request's queue row: last green, latest head, slot holders."""
        row = self._ctx.queue
        return QueueView(
            name=row.name,
            last_green_uri=row.last_green_uri,
            last_green_request_id=row.last_green_request_id,
            latest_request_id=row.latest_request_id,
            slot_holders=tuple(row.slot_holders),
        )

    @property
    def parameters(self) -> Mapping[str, Any]:
        """The queue's parameters, resolved (config over the machines' defaults); list
        values are tuples. Read-only."""
        return MappingProxyType(dict(self._ctx.config.parameters))

    def param(self, name: str) -> Any:
        """Parameter ``name`` of the queue; ``KeyError`` naming the set ones if unset.
        Declare it in the registration's ``parameters=`` so lint checks the machine
        declares it."""
        return self._ctx.config.param(name)

    def now_ms(self) -> int:
        """The clock (epoch milliseconds); simulated in ``simulate``, ``test`` and
        ``check``, so read time here, never from the ``time`` module."""
        return self._ctx.services.clock.now_ms()

    @property
    def is_terminal(self) -> bool:
        """The request is in a terminal state of the request machine."""
        return self._ctx.services.lifecycle.is_terminal(self._ctx.request)

    @property
    def is_admitted(self) -> bool:
        """The request is in a state the request machine's ``admit`` role leads to."""
        return self._ctx.services.lifecycle.is_admitted(self._ctx.request)

    @property
    def scratch(self) -> dict[str, Any]:
        """A dict for this delivery only: an action stores, a later condition reads.
        Empty at the start of every delivery; never persisted. Use it instead of
        module-level state, which would leak between deliveries and timelines."""
        return self._ctx.scratch

    # --- what an action may do ------------------------------------------------------

    @property
    def has_source_control(self) -> bool:
        """A repository is configured for the queue (else the source-control methods
        raise ``NotFound``)."""
        return self._ctx.services.source_control.for_queue(self._ctx.request.queue) is not None

    async def is_ancestor(self, ancestor: str, descendant: str | None = None) -> bool:
        """Commit ``ancestor`` is an ancestor of (or equal to) ``descendant`` (default:
        the request's commit). ``NotFound``: a commit (or the repository) is unknown;
        ``Retryable``: a transient failure."""
        source = self._source_control()
        return await source.is_ancestor(ancestor, descendant or self._ctx.request.uri)

    async def changed_paths(self, base: str, head: str | None = None) -> frozenset[str]:
        """The paths (repository-relative, ``/``-separated) whose content differs
        between commits ``base`` and ``head`` (default: the request's commit).
        ``NotFound``: a commit (or the repository) is unknown; ``Retryable``: a
        transient failure."""
        source = self._source_control()
        return await source.changed_paths(base, head or self._ctx.request.uri)

    async def changed_paths_since_green(self) -> frozenset[str]:
        """The paths changed from the queue's last green to the request's commit: the
        diff an incremental build reuses, never the previous head's. ``NotFound`` when
        the queue has no last green or its commit is unknown (treat as "everything
        changed")."""
        last_green = self._ctx.queue.last_green_uri
        if not last_green:
            raise NotFound(f"queue {self._ctx.queue.name!r} has no last green")
        return await self.changed_paths(last_green)

    async def changed_paths_since_parent(self) -> frozenset[str]:
        """The paths the request's commit itself changed: the diff from its first
        parent. ``NotFound`` for a root commit or an unknown one (treat as "everything
        changed")."""
        source = self._source_control()
        commit = self._ctx.request.uri
        parent = await source.first_parent(commit)
        if not parent:
            raise NotFound(f"commit {commit!r} is a root commit: it has no parent")
        return await source.changed_paths(parent, commit)

    def count(self, metric: str, amount: int = 1) -> None:
        """Add ``amount`` to the counter ``metric`` of the request's queue (``/metrics``)."""
        self._ctx.services.metrics.count(metric, self._ctx.request.queue, amount)

    async def note(self, what: str, **detail: object) -> None:
        """Write a trail note about the request that ``explain`` shows: ``what`` (a
        short phrase) and ``detail`` pairs. Idempotent: the same ``what`` for the same
        request version is one record, so a redelivery writes nothing twice."""
        await note_plugin(self._ctx, self._origin, what, **detail)

    async def end_as(self, role: str) -> Request:
        """End the waiting request by the trigger the request machine declares for
        ``role``: ``skip`` (no build needed) or ``withdraw`` (no longer wanted). Through
        the request lifecycle, as every write of a request: a compare-and-set on its
        version, a slot it holds freed. ``ValueError`` for another role or one the
        machine does not declare; the lifecycle's ``IllegalTransition`` when the machine
        refuses it (the request is no longer waiting); ``VersionMismatch`` when it
        changed meanwhile (the delivery is retried)."""
        lifecycle = self._ctx.services.lifecycle
        triggers = {"skip": lifecycle.roles.skip, "withdraw": lifecycle.roles.withdraw}
        if role not in triggers:
            raise ValueError(f"a plugin ends a waiting request as skip or withdraw, not {role!r}")
        if not triggers[role]:
            raise ValueError(f"the request machine declares no {role!r} role")
        ended = await lifecycle.apply(self._ctx.request, triggers[role])
        self._ctx.loaded_request = ended
        return ended

    async def announce(self, event_type: str, **payload: str) -> None:
        """Publish a hook event of a type the plugin declared (``plugin.hooks.declare``)
        about the request: its payload names the queue and the request, plus
        ``payload``. Its id is derived from the type, the request and its version, so a
        redelivery announces it again under the same id (consumers dedupe).
        ``ValueError`` for an undeclared type or a payload that would overwrite the
        queue or the request."""
        if event_type not in self._hooks:
            raise ValueError(
                f"hook type {event_type!r} is not declared by plugin {self._origin}; "
                "declare it in register(plugin) with plugin.hooks.declare"
            )
        request = self._ctx.request
        reserved = {"queue", "request_id"} & set(payload)
        if reserved:
            raise ValueError(f"a hook payload may not set {', '.join(sorted(reserved))}")
        event = HookEvent(
            id=name_based_id(f"{event_type}|{request.id}|{request.version}"),
            type=event_type,
            timestamp_ms=self._ctx.services.clock.now_ms(),
            payload={
                "queue": request.queue,
                "request_id": request.id,
                **{key: str(value) for key, value in payload.items()},
            },
        )
        await self._ctx.services.publisher.publish_hook(event)

    def _source_control(self) -> SourceControl:
        return source_control_of(self._ctx.services, self._ctx.request.queue)


def source_control_of(services: StageServices, queue: str) -> SourceControl:
    """The source control of ``queue``; ``NotFound`` when it has no repository."""
    source = services.source_control.for_queue(queue)
    if source is None:
        raise NotFound(f"queue {queue!r} has no repository configured")
    return source

"""How a plugin's ``register(plugin)`` adds conditions and actions to a policy.

Plugins import what they use from :mod:`stovepipe_fsm.plugin`, the public surface that
re-exports :class:`PluginRegistry` and :class:`~.plugin_context.PluginContext`; this
module is its implementation and may change.

``register`` is called once each time a policy that uses the plugin is loaded, with a
fresh :class:`PluginRegistry`: what it registers belongs to that policy only (a module in
the policy directory is even imported afresh for each load). It is found
through a machine file's ``plugins:`` list or an installed entry point (see
:mod:`stovepipe_fsm.machine.plugins` and docs/machines.md, "Plugins").

- ``queue_gate`` conditions and actions receive a :class:`PluginContext` over the
  delivery: each registered function is wrapped so it gets the view, never the
  delivery's internal context. Conditions must be synchronous (an ``async def``
  condition is refused when it is registered); actions may be ``async``.
- ``culprit`` conditions and actions receive a :class:`~.search_view.SearchView` over
  the build that ended and the queue's culprit search (the search row itself is
  written only by the built-in steps).
- ``request`` conditions get the :class:`~stovepipe_fsm.domain.entities.Request` being
  moved and guard its lifecycle triggers. The request machine runs no actions (its
  writes are the lifecycle's compare-and-set), so registering one is refused.
- ``plugin.invariants.state()`` / ``.transition()`` add a property ``check`` can prove
  for this policy (docs/check.md, "Adding an invariant").

The project's own tests reach the internal context through :func:`internal_gate`; it
is not part of the plugin surface.
"""

from __future__ import annotations

import inspect
import re
import traceback
from collections.abc import Callable, Mapping
from functools import wraps
from typing import Any, TypeVar

from ..domain.entities import Request
from ..domain.errors import PLUGIN_FRAME_NOTE
from ..domain.hooks import VALIDATION_EVENT_PREFIX
from ..machine.invariants import InvariantCatalog
from ..machine.plugins import ENTRY_POINT_GROUP, MachineVocabulary
from ..machine.registry import RegistrationRefused, Registry
from .context import DeliveryContext
from .culprit import SearchContext
from .gate import REQUEST_PROCESSING, SLOT_HELD, START_ANNOUNCED, STRATEGY_DERIVED
from .plugin_context import PluginContext
from .search_view import SearchView

__all__ = [
    "ENTRY_POINT_GROUP",
    "REQUEST_PROCESSING",
    "SLOT_HELD",
    "START_ANNOUNCED",
    "STRATEGY_DERIVED",
    "CulpritVocabulary",
    "DeliveryContext",
    "GateVocabulary",
    "InvariantCatalog",
    "MachineVocabulary",
    "PluginContext",
    "PluginRegistry",
    "Request",
    "SearchView",
    "internal_gate",
]

REQUEST_RUNS_NO_ACTIONS = (
    "the request machine runs no actions (its writes are the lifecycle's compare-and-set); "
    "register the step on queue_gate"
)


View = TypeVar("View", PluginContext, SearchView)


class _ViewedVocabulary(MachineVocabulary[View]):
    """Registers conditions and actions of one machine whose callables receive a view
    (``view(internal context)``), never the internal context itself.

    Same arguments and checks as the built-in registrations: an optional name (default:
    the function's name); ``provides`` / ``provides_unless`` facts for a condition,
    ``provides`` / ``requires`` facts and ``finishes`` for an action; ``parameters``: the
    machine parameters it reads (the machine must declare them). The first paragraph of
    the docstring is what the diagrams show.
    """

    def __init__(self, inner: MachineVocabulary[Any], view: Callable[[Any], View]) -> None:
        super().__init__(inner._registry, no_actions=inner._no_actions)
        self._view: Callable[[Any], View] = view

    def _wrap(self, fn: Callable[[View], Any]) -> Callable[[Any], Any]:
        return _viewed(fn, self._view)


class GateVocabulary(_ViewedVocabulary[PluginContext]):
    """Registers ``queue_gate`` conditions and actions that receive a PluginContext
    (the arguments of :class:`_ViewedVocabulary`)."""

    def __init__(
        self, inner: MachineVocabulary[DeliveryContext], origin: str, hooks: set[str]
    ) -> None:
        # The plugin's declared hook types, read when a step runs.
        super().__init__(inner, lambda ctx: PluginContext(ctx, origin, hooks))


class CulpritVocabulary(_ViewedVocabulary[SearchView]):
    """Registers ``culprit`` conditions and actions that receive a SearchView (the
    arguments of :class:`_ViewedVocabulary`)."""

    def __init__(self, inner: MachineVocabulary[SearchContext], origin: str) -> None:
        super().__init__(inner, lambda ctx: SearchView(ctx, origin))


#: A hook type a plugin may declare: dotted lower-case words, at least two.
HOOK_TYPE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")


class HookDeclarations:
    """The hook event types a plugin may announce (``ctx.announce``), declared in its
    ``register(plugin)``: what a consumer of the hook topic may expect of the policy is
    in its code, not discovered at run time. A type is dotted lower-case words
    (``team.embargo.held``); the stage's own ``validation.repository.*`` are reserved."""

    def __init__(self) -> None:
        self.types: set[str] = set()

    def declare(self, event_type: str) -> str:
        """Declare ``event_type``; ``RegistrationRefused`` for a malformed or reserved one."""
        if not HOOK_TYPE.match(event_type):
            raise RegistrationRefused(
                f"hook type {event_type!r} must be dotted lower-case words "
                f"({HOOK_TYPE.pattern}), e.g. 'team.embargo.held'"
            )
        if event_type.startswith(VALIDATION_EVENT_PREFIX):
            raise RegistrationRefused(
                f"hook type {event_type!r}: {VALIDATION_EVENT_PREFIX}* are the stage's own"
            )
        self.types.add(event_type)
        return event_type


def _viewed(fn: Callable[[View], Any], view: Callable[[Any], View]) -> Callable[[Any], Any]:
    """``fn`` called with ``view(ctx)`` over the machine's context; async if ``fn`` is
    (the registry refuses an async condition, the compiler awaits an async action).
    Name and docstring are ``fn``'s, for the diagrams and error messages. An exception
    from ``fn`` is noted with the plugin's own frame that raised it (the compiler adds
    the YAML step), so ``test`` and ``simulate`` name both."""
    home = getattr(getattr(fn, "__code__", None), "co_filename", "")
    if inspect.iscoroutinefunction(fn):

        @wraps(fn)
        async def run_async(ctx: Any) -> Any:
            try:
                return await fn(view(ctx))
            except Exception as exc:
                _note_frame(exc, home)
                raise

        return run_async

    @wraps(fn)
    def run(ctx: Any) -> Any:
        try:
            return fn(view(ctx))
        except Exception as exc:
            _note_frame(exc, home)
            raise

    return run


def _note_frame(exc: Exception, home: str) -> None:
    """Note where in the plugin ``exc`` was raised: the innermost frame of the plugin's
    module file (the line of plugin code that raised, or called what raised)."""
    if any(n.startswith(PLUGIN_FRAME_NOTE) for n in getattr(exc, "__notes__", ())):
        return
    frames = traceback.extract_tb(exc.__traceback__)[1:]  # [0] is the wrapper's own
    own = [f for f in frames if f.filename == home] or frames[:1]
    if own:
        frame = own[-1]
        exc.add_note(f"{PLUGIN_FRAME_NOTE}{frame.filename}:{frame.lineno} in {frame.name}")


class PluginRegistry:
    """What a plugin's ``register(plugin)`` receives: one vocabulary per machine.

    ``plugin.queue_gate``: conditions and actions of the delivery flow, which receive a
    :class:`PluginContext`. ``plugin.culprit``: conditions and actions of culprit
    finding, which receive a :class:`~.search_view.SearchView`. ``plugin.request``:
    conditions over the :class:`~stovepipe_fsm.domain.entities.Request` that guard its
    lifecycle triggers (no actions). All take the same arguments as the built-in registrations.
    ``plugin.invariants`` takes the invariants the plugin adds (``state`` /
    ``transition``, as docs/check.md shows).
    """

    def __init__(
        self, registries: Mapping[str, Registry], invariants: InvariantCatalog | None = None
    ) -> None:
        self.invariants = invariants if invariants is not None else InvariantCatalog()
        gate = registries["queue_gate"]
        self._gate: MachineVocabulary[DeliveryContext] = MachineVocabulary(gate)
        #: ``plugin.hooks.declare(type)``: the hook events its actions may announce.
        self.hooks = HookDeclarations()
        self.queue_gate = GateVocabulary(self._gate, gate.origin, self.hooks.types)
        self.request: MachineVocabulary[Request] = MachineVocabulary(
            registries["request"], no_actions=REQUEST_RUNS_NO_ACTIONS
        )
        culprit = registries["culprit"]
        self.culprit = CulpritVocabulary(MachineVocabulary(culprit), culprit.origin)


def internal_gate(plugin: PluginRegistry) -> MachineVocabulary[DeliveryContext]:
    """The ``queue_gate`` vocabulary over the internal DeliveryContext: for the project's
    own test plugins (mutants the model checker must catch), never for a policy's."""
    return plugin._gate

"""The API a plugin module uses to add conditions and actions to a policy.

A plugin is a module of your own with one function::

    from stovepipe_fsm.process.plugins import DeliveryContext, PluginRegistry

    def register(plugin: PluginRegistry) -> None:
        @plugin.queue_gate.condition()
        def queue_frozen(ctx: DeliveryContext) -> bool:
            \"\"\"The queue's name ends in '-frozen'.\"\"\"
            return ctx.queue.name.endswith("-frozen")

``register`` is called once each time a policy that uses the plugin is loaded, with a
fresh :class:`PluginRegistry`: what it registers belongs to that policy only (a module in
the policy directory is even imported afresh for each load). It is found
through a machine file's ``plugins:`` list or an installed entry point (see
:mod:`stovepipe_fsm.machine.plugins` and docs/machines.md, "Plugins").

What a callable receives is what the built-in ones receive:

- ``queue_gate`` conditions and actions get the delivery's :class:`DeliveryContext`.
  ``ctx.services`` (:class:`~.services.StageServices`) is everything they may touch:
  stores, config, source control, publisher, clock, the request lifecycle, metrics.
  Conditions must be synchronous and free of I/O (the machine may evaluate one for every
  candidate transition; an ``async def`` condition is refused when it is registered);
  they read what earlier actions loaded into the context. Actions may be ``async``.
- ``request`` conditions get the :class:`~stovepipe_fsm.domain.entities.Request` being
  moved and guard its lifecycle triggers. The request machine runs no actions (its
  writes are the lifecycle's compare-and-set), so registering one is refused.
- ``plugin.invariants.state()`` / ``.transition()`` add a property ``check`` can prove
  for this policy (docs/check.md, "Adding an invariant").

The facts the built-in steps establish (``REQUEST_PROCESSING``, ``SLOT_HELD``,
``STRATEGY_DERIVED``, ``START_ANNOUNCED``) are re-exported here for ``requires=``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..domain.entities import Request
from ..machine.invariants import InvariantCatalog
from ..machine.plugins import ENTRY_POINT_GROUP, MachineVocabulary
from ..machine.registry import Registry
from .context import DeliveryContext
from .gate import REQUEST_PROCESSING, SLOT_HELD, START_ANNOUNCED, STRATEGY_DERIVED

__all__ = [
    "ENTRY_POINT_GROUP",
    "REQUEST_PROCESSING",
    "SLOT_HELD",
    "START_ANNOUNCED",
    "STRATEGY_DERIVED",
    "DeliveryContext",
    "InvariantCatalog",
    "MachineVocabulary",
    "PluginRegistry",
    "Request",
]

REQUEST_RUNS_NO_ACTIONS = (
    "the request machine runs no actions (its writes are the lifecycle's compare-and-set); "
    "register the step on queue_gate"
)


class PluginRegistry:
    """What a plugin's ``register(plugin)`` receives: one vocabulary per machine.

    ``plugin.queue_gate.condition(...)`` / ``.action(...)`` take the same arguments as
    the built-in registrations in ``process/gate.py``: an optional name (default: the
    function's name), ``provides`` / ``provides_unless`` facts for a condition,
    ``provides`` / ``requires`` facts and ``finishes`` for an action. The first paragraph
    of the docstring is what the diagrams show. ``plugin.invariants`` takes the
    invariants the plugin adds (``state`` / ``transition``, as docs/check.md shows).
    """

    def __init__(
        self, registries: Mapping[str, Registry], invariants: InvariantCatalog | None = None
    ) -> None:
        self.invariants = invariants if invariants is not None else InvariantCatalog()
        self.queue_gate: MachineVocabulary[DeliveryContext] = MachineVocabulary(
            registries["queue_gate"]
        )
        self.request: MachineVocabulary[Request] = MachineVocabulary(
            registries["request"], no_actions=REQUEST_RUNS_NO_ACTIONS
        )

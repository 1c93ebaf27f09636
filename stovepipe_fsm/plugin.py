"""The plugin API: everything a policy's plugin module may import from stovepipe-fsm.

A plugin is a module of your own, beside the policy's ``machines/`` directory, listed
under ``plugins:`` in a machine file, with one function::

    from stovepipe_fsm.plugin import PluginContext, PluginRegistry

    def register(plugin: PluginRegistry) -> None:
        @plugin.queue_gate.condition(parameters=["embargo"])
        def embargoed(ctx: PluginContext) -> bool:
            \"\"\"R's uri matches a glob of the queue's embargo parameter.\"\"\"
            return any(fnmatchcase(ctx.request.uri, g) for g in ctx.param("embargo"))

The machine's transitions then name ``embargoed``. ``plugin.culprit`` registers the
same way for ``machines/culprit.yaml``; its steps receive a :class:`SearchView`.
Conditions are synchronous and do no I/O; actions may be ``async`` and reach source
control and the trail through the context. An action passes what a later condition
needs through ``ctx.scratch``, which lives for one delivery, and announces on the hook
topic only the event types the plugin declared (``plugin.hooks.declare``).

The facts the built-in steps establish (``REQUEST_PROCESSING``: the request is durably
admitted; ``SLOT_HELD``: the queue row lists it as a slot holder; ``STRATEGY_DERIVED``:
its build strategy is chosen; ``START_ANNOUNCED``: its start hook is published) are
exported for an action's ``requires=``, so lint refuses a machine that runs it too early.

Only the names in ``__all__`` are the API; every other module of the package is
internal and may change.
"""

from __future__ import annotations

from .domain.culprit_search import CulpritSearch, Probe, Tally
from .domain.entities import Request
from .domain.errors import NonRetryable, NotFound, Retryable, StovepipeError
from .process.plugin_context import PluginContext, QueueView
from .process.plugins import (
    REQUEST_PROCESSING,
    SLOT_HELD,
    START_ANNOUNCED,
    STRATEGY_DERIVED,
    CulpritVocabulary,
    GateVocabulary,
    HookDeclarations,
    MachineVocabulary,
    PluginRegistry,
)
from .process.search_view import SearchView

__all__ = [
    "REQUEST_PROCESSING",
    "SLOT_HELD",
    "START_ANNOUNCED",
    "STRATEGY_DERIVED",
    "CulpritSearch",
    "CulpritVocabulary",
    "GateVocabulary",
    "HookDeclarations",
    "MachineVocabulary",
    "NonRetryable",
    "NotFound",
    "PluginContext",
    "PluginRegistry",
    "Probe",
    "QueueView",
    "Request",
    "Retryable",
    "SearchView",
    "StovepipeError",
    "Tally",
]

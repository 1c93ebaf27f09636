"""Hold heads while their queue is in a maintenance window: a rule that needs code.

The queue's ``maintenance_windows`` parameter lists daily UTC windows (``02:00-04:00``;
``23:00-01:00`` spans midnight). A kept head that reaches the gate inside one is held,
with the reason ``in_maintenance_window``, and the trail notes the window; it is checked
again after the queue's ``gate_wait_delay_ms`` and admitted once the window has ended.
machines/queue_gate.yaml lists this module under ``plugins:`` and names its condition in
the ``gate`` transitions. Time comes from the context's clock, so ``test``, ``simulate``
and ``check`` replay it.
"""

from __future__ import annotations

from stovepipe_fsm.plugin import PluginContext, PluginRegistry

from . import windows

WINDOWS = "maintenance_windows"


def register(plugin: PluginRegistry) -> None:
    gate = plugin.queue_gate

    @gate.condition(parameters=[WINDOWS])
    def in_maintenance_window(ctx: PluginContext) -> bool:
        """The clock is inside one of the queue's maintenance windows."""
        return bool(windows.current(list(ctx.param(WINDOWS)), ctx.now_ms()))

    @gate.action(parameters=[WINDOWS])
    async def note_maintenance_window(ctx: PluginContext) -> None:
        """Note in the trail which window held R."""
        await ctx.note(
            "in maintenance window",
            window=windows.current(list(ctx.param(WINDOWS)), ctx.now_ms()),
        )

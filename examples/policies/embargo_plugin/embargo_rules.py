"""Hold heads whose commit is under embargo: a rule that needs code.

The queue's ``embargo`` parameter lists globs of commit uris (``*-wip``,
``refs/heads/experimental/*``); a head whose uri matches one is held at the gate, with
the reason ``embargoed``, instead of being admitted. A newer head supersedes it as
usual, so an embargoed head is built only if the embargo is lifted while it is still
the newest. machines/queue_gate.yaml lists this module under ``plugins:`` and names
``embargoed`` in its ``gate`` transitions.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from stovepipe_fsm.process.plugins import DeliveryContext, PluginRegistry

EMBARGO = "embargo"


def register(plugin: PluginRegistry) -> None:
    gate = plugin.queue_gate

    @gate.condition(parameters=[EMBARGO])
    def embargoed(ctx: DeliveryContext) -> bool:
        """R's uri matches a glob of the queue's embargo parameter."""
        return any(fnmatchcase(ctx.request.uri, glob) for glob in ctx.config.param(EMBARGO))

    @gate.action()
    def count_embargo_hold(ctx: DeliveryContext) -> None:
        """Count a head held by the embargo (metric embargo_holds)."""
        ctx.services.metrics.count("embargo_holds", ctx.request.queue)

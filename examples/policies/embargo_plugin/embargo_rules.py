"""Hold heads whose commit is under embargo: a rule that needs code.

The queue's ``embargo`` parameter lists globs of commit uris (``*-wip``,
``refs/heads/experimental/*``); a head whose uri matches one is held at the gate, with
the reason ``embargoed``, instead of being admitted, the trail notes which glob held
it, and the hook topic carries ``embargo.head.held`` for it. A newer head supersedes it
as usual, so an embargoed head is built only if the embargo is lifted while it is still
the newest. machines/queue_gate.yaml lists this module under ``plugins:`` and names
``embargoed`` in its ``gate`` transitions.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from stovepipe_fsm.plugin import PluginContext, PluginRegistry

EMBARGO = "embargo"
HELD_HOOK = "embargo.head.held"


def matching_glob(ctx: PluginContext) -> str:
    """The first embargo glob R's uri matches ("" when none)."""
    return next((g for g in ctx.param(EMBARGO) if fnmatchcase(ctx.request.uri, g)), "")


def register(plugin: PluginRegistry) -> None:
    gate = plugin.queue_gate
    plugin.hooks.declare(HELD_HOOK)

    @gate.condition(parameters=[EMBARGO])
    def embargoed(ctx: PluginContext) -> bool:
        """R's uri matches a glob of the queue's embargo parameter."""
        return bool(matching_glob(ctx))

    @gate.action(parameters=[EMBARGO])
    async def count_embargo_hold(ctx: PluginContext) -> None:
        """Count a head held by the embargo (metric embargo_holds), note the glob that
        held it in the trail and announce it on the hook topic."""
        ctx.count("embargo_holds")
        await ctx.note("embargoed", glob=matching_glob(ctx))
        await ctx.announce(HELD_HOOK, glob=matching_glob(ctx))

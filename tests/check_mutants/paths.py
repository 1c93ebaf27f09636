"""A mutation of the path rule the model checker must catch once it explores changed paths.

``ancestry_only`` replaces the gate's ``derive_strategy`` with a plugin action that
decides the strategy from ancestry alone: a head whose diff since last green touches a
``full_build_paths`` glob is still built incrementally. No built-in invariant speaks of
paths, so the property is an invariant registered on a copy of the catalogue
(:func:`path_catalog`), declared with the queue's globs as its parameter.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from stovepipe_fsm.apps.check.invariants import Rules
from stovepipe_fsm.apps.check.observe import Observation
from stovepipe_fsm.domain.entities import INCREMENTAL_SINCE_GREEN
from stovepipe_fsm.domain.path_globs import path_matches
from stovepipe_fsm.machine.invariants import INVARIANTS, InvariantCatalog

SHIPPED = Path(__file__).resolve().parent.parent.parent / "machines"
INVARIANT = "builds_full_on_paths"

ANCESTRY_PLUGIN = '''"""Derive the strategy from ancestry alone: full_build_paths is never read."""

from stovepipe_fsm.process.plugins import DeliveryContext, PluginRegistry, internal_gate


def register(plugin: PluginRegistry) -> None:
    @internal_gate(plugin).action(provides=["strategy_derived"])
    async def derive_strategy_by_ancestry(ctx: DeliveryContext) -> None:
        """Incremental on last green when it is an ancestor (the mistake: paths unread)."""
        request, last_green = ctx.request, ctx.queue.last_green_uri
        ctx.build_strategy, ctx.base_uri, ctx.rewrite = "full", "", False
        source = ctx.services.source_control.for_queue(request.queue)
        if not last_green or source is None:
            return
        if await source.is_ancestor(last_green, request.uri):
            ctx.build_strategy, ctx.base_uri = "incremental_since_green", last_green
        else:
            ctx.rewrite = True
'''


def _reach(history: Mapping[str, Any], commit: str) -> set[str]:
    seen: set[str] = set()
    todo = [commit]
    while todo:
        sha = todo.pop()
        if sha and sha not in seen:
            seen.add(sha)
            todo.extend(history.get(sha, ()))
    return seen


def builds_full_on_paths(
    obs: Observation, rules: Rules, params: Mapping[str, Any]
) -> Iterator[str]:
    """An incremental build's commits since its base change no path a glob of
    ``globs`` matches."""
    changes = dict(obs.changes)
    for request in obs.requests:
        if request.build_strategy != INCREMENTAL_SINCE_GREEN:
            continue
        since = _reach(rules.history, request.uri) - _reach(rules.history, request.base_uri)
        touched = sorted(
            path
            for commit in since
            for path in changes.get(commit, ())
            if any(path_matches(path, glob) for glob in params["globs"])
        )
        if touched:
            yield (
                f"{request.id} ({request.uri}) builds incrementally on {request.base_uri} "
                f"though {', '.join(touched)} changed since"
            )


def path_catalog() -> InvariantCatalog:
    """The shipped catalogue plus :func:`builds_full_on_paths`."""
    catalog = INVARIANTS.copy()
    schema = {"type": "array", "items": {"type": "string"}}
    catalog.state(INVARIANT, parameters={"globs": schema})(builds_full_on_paths)
    return catalog


def write_policy(policy_dir: Path, globs: list[str], *, mutant: bool) -> Path:
    """``policy_dir/machines``: the shipped machines declaring :data:`INVARIANT` for
    ``globs``, with the ancestry-only strategy when ``mutant``; returns that directory."""
    machines = policy_dir / "machines"
    shutil.copytree(SHIPPED, machines)
    path = machines / "queue_gate.yaml"
    gate = yaml.safe_load(path.read_text(encoding="utf-8"))
    gate["invariants"].append({"name": INVARIANT, "globs": globs})
    if mutant:
        (gate_step,) = [t for t in gate["transitions"] if t.get("after") == "derive_strategy"]
        gate_step["after"] = "derive_strategy_by_ancestry"
        gate["plugins"] = ["ancestry_rules"]
        (policy_dir / "ancestry_rules.py").write_text(ANCESTRY_PLUGIN, encoding="utf-8")
    path.write_text(yaml.safe_dump(gate, sort_keys=False), encoding="utf-8")
    return machines

"""Mutations of speculative validation the model checker must catch.

They are made from ``tests/fixtures/speculative/machines`` (a copy of the machines that
coalesce to the newest N, pin bases, run a rewrite alone and lease slots), like the
mutants of :mod:`.mutants` from the plain fixture policy. A mutant is a YAML edit where
the rule is a name in the YAML; the one rule that lives in the record stage (last green
advances by ingest order) is mutated as a lifecycle variant instead, as the bare counter
is, because no machine file names it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from stovepipe_fsm.domain.entities import Queue, Request
from stovepipe_fsm.process.lifecycle import QueueChange, RequestLifecycle

BASE = Path(__file__).resolve().parent.parent / "fixtures" / "speculative" / "machines"
CONFIG = BASE.parent / "config" / "queues.yaml"
Doc = dict[str, Any]

REPIN_PLUGIN = '''"""Re-derive and re-pin the base of a request that is already processing."""

from dataclasses import replace

from stovepipe_fsm.process.plugins import DeliveryContext, PluginRegistry, internal_gate


def register(plugin: PluginRegistry) -> None:
    @internal_gate(plugin).action()
    async def repin_base(ctx: DeliveryContext) -> None:
        """Pin the queue's current last green as R's base (the mistake)."""
        queue = await ctx.services.queues.get(ctx.request.queue)
        request = ctx.request
        if not queue.last_green_uri or request.base_uri == queue.last_green_uri:
            return
        source = ctx.services.source_control.for_queue(request.queue)
        if source is None or not await source.is_ancestor(queue.last_green_uri, request.uri):
            return
        moved = replace(
            request, build_strategy="incremental_since_green", base_uri=queue.last_green_uri
        )
        await ctx.services.requests.update(moved, request.version, request.version + 1)
        ctx.loaded_request = moved.with_version(request.version + 1)
'''


def _transitions(doc: Doc, trigger: str) -> list[Doc]:
    found = [t for t in doc["transitions"] if t["trigger"] == trigger]
    if not found:
        raise AssertionError(f"{doc['name']}: no transition with trigger {trigger!r}")
    return found


def _swap(value: Any, old: str, new: str) -> Any:
    if value == old:
        return new
    if isinstance(value, list) and old in value:
        return [new if v == old else v for v in value]
    return value


def coalesce_latest_one(gate: Doc, policy_dir: Path) -> None:
    """Coalesce to the single latest head whatever max_concurrent: nothing overlaps."""
    swapped = 0
    for t in _transitions(gate, "coalesce"):
        for key in ("conditions", "unless"):
            if key in t and _swap(t[key], "outside_newest_n", "newer_head_exists") != t[key]:
                t[key] = _swap(t[key], "outside_newest_n", "newer_head_exists")
                swapped += 1
    assert swapped == 3, swapped


def repin_on_redelivery(gate: Doc, policy_dir: Path) -> None:
    """A redelivery of a processing request re-pins its base to the current last green."""
    (reannounce,) = [t for t in _transitions(gate, "dispatch") if t["dest"] == "reannounced"]
    assert reannounce["after"] == "announce"
    reannounce["after"] = ["repin_base", "announce"]
    gate["plugins"] = ["repin_rules"]
    (policy_dir / "repin_rules.py").write_text(REPIN_PLUGIN, encoding="utf-8")


def rewrite_alongside(gate: Doc, policy_dir: Path) -> None:
    """A rewrite is admitted while other heads hold slots: the serial rule is gone."""
    waits, claims = _transitions(gate, "claim")
    assert waits["conditions"] == "rewrite_waits_for_drain"
    gate["transitions"].remove(waits)
    del claims["unless"]


def expiry_ignored(gate: Doc, policy_dir: Path) -> None:
    """Expired slot leases are never reclaimed: a stuck request wedges its queue."""
    (accepted,) = [t for t in _transitions(gate, "dispatch") if t["dest"] == "queue_loaded"]
    assert "reclaim_expired_leases" in accepted["after"]
    accepted["after"] = [a for a in accepted["after"] if a != "reclaim_expired_leases"]


MUTANTS: dict[str, Callable[[Doc, Path], None]] = {
    "coalesce_latest_one": coalesce_latest_one,
    "repin_on_redelivery": repin_on_redelivery,
    "rewrite_alongside": rewrite_alongside,
    "expiry_ignored": expiry_ignored,
}


def write_mutant(name: str, policy_dir: Path) -> Path:
    """Write ``policy_dir/machines`` with mutation ``name`` applied; return that directory."""
    machines = policy_dir / "machines"
    machines.mkdir(parents=True, exist_ok=True)
    for source in BASE.glob("*.yaml"):
        shutil.copy(source, machines / source.name)
    gate = yaml.safe_load((BASE / "queue_gate.yaml").read_text(encoding="utf-8"))
    MUTANTS[name](gate, policy_dir)
    text = yaml.safe_dump(gate, sort_keys=False)
    (machines / "queue_gate.yaml").write_text(f"# mutant: {name}\n{text}", encoding="utf-8")
    return machines


class GreenByArrival(RequestLifecycle):
    """Record moves last green to every green as it arrives, newer or not (the mistake
    rule 2 forbids): a late green of an older head moves the bookmark back."""

    def end_change(self, request: Request) -> QueueChange | None:
        if super().end_change(request) is None:
            return None  # not a green end

        def arrival(queue: Queue) -> Queue:
            return replace(queue, last_green_uri=request.uri, last_green_request_id=request.id)

        return arrival

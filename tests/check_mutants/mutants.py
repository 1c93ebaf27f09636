"""Mutations of the machines the model checker must catch, each a copy in a directory.

The mutants are made from the tests' own machines (``tests/fixtures/machines``, which
began as the shipped ones), so a changed shipped policy does not move their targets.
Every mutant is a small, plausible edit of that YAML - the kind a policy change
could make by accident - applied to the parsed document so it cannot silently miss its
target: an edit that finds nothing to change raises instead of writing an unchanged copy.
Some mutants are rejected by lint (that is lint doing its job); the checker loads those
with ``--no-lint`` to show it catches them independently.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from fixture_policy import MACHINES as BASE

Doc = dict[str, Any]


def _transitions(doc: Doc, trigger: str) -> list[Doc]:
    found = [t for t in doc["transitions"] if t["trigger"] == trigger]
    if not found:
        raise AssertionError(f"{doc['name']}: no transition with trigger {trigger!r}")
    return found


def publish_before_persist(gate: Doc, request: Doc) -> None:
    """The admit step hands the request to build before writing it processing."""
    (admit,) = [t for t in _transitions(gate, "admit") if t.get("unless") == "slot_conflict"]
    assert admit["after"] == [
        "mark_processing",
        "release_lost_claim",
        "announce",
        "publish_build",
        "ack",
    ]
    admit["after"] = ["publish_build", "mark_processing", "release_lost_claim", "announce", "ack"]


def no_coalesce(gate: Doc, request: Doc) -> None:
    """The loaded request goes straight to ``latest``: backlogs are never coalesced."""
    gate["transitions"] = [t for t in gate["transitions"] if t["trigger"] != "coalesce"]
    gate["transitions"].append({"trigger": "coalesce", "source": "queue_loaded", "dest": "latest"})


def no_gate(gate: Doc, request: Doc) -> None:
    """The latest head is always admitted: the concurrency gate is gone."""
    closed, opened = _transitions(gate, "gate")
    assert closed["conditions"] == "gate_closed" and opened["unless"] == "gate_closed"
    gate["transitions"].remove(closed)
    del opened["unless"]


def terminal_holds_slot(gate: Doc, request: Doc) -> None:
    """``succeeded`` declared slot-holding (lint's slot-terminal rule rejects this)."""
    (succeeded,) = [s for s in request["states"] if s["name"] == "succeeded"]
    succeeded["holds_slot"] = True


MUTANTS: dict[str, Callable[[Doc, Doc], None]] = {
    "publish_before_persist": publish_before_persist,
    "no_coalesce": no_coalesce,
    "no_gate": no_gate,
    "terminal_holds_slot": terminal_holds_slot,
}


def write_mutant(name: str, directory: Path) -> Path:
    """Write the machines with mutation ``name`` applied into ``directory``; return it."""
    directory.mkdir(parents=True, exist_ok=True)
    for source in BASE.glob("*.yaml"):
        shutil.copy(source, directory / source.name)
    gate = yaml.safe_load((BASE / "queue_gate.yaml").read_text(encoding="utf-8"))
    request = yaml.safe_load((BASE / "request.yaml").read_text(encoding="utf-8"))
    MUTANTS[name](gate, request)
    for filename, doc in (("queue_gate.yaml", gate), ("request.yaml", request)):
        text = yaml.safe_dump(doc, sort_keys=False)
        (directory / filename).write_text(f"# mutant: {name}\n{text}", encoding="utf-8")
    return directory

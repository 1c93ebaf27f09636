"""``whatif`` over more than two policies: one column per policy (docs/whatif.md).

The policies of a run, in column order: the one of ``--machines``/``--config``; the one
of ``--vs-machines``/``--vs-config`` when given; each ``--policy DIR`` (a policy
directory: ``DIR/machines`` and ``DIR/config/queues.yaml``); then, for each ``--vary
PARAM=V1,V2,...``, the first policy with ``PARAM`` set to each value on every queue
(``max_concurrent=1,2,3``, ``max_validation_ms=0,600000``), over what the timeline's
own ``config:`` sets. Each replays the same
timeline on its own; the figures come from :mod:`.compare`, and the rows shown are the
caller's, so this module lays out whatever figures a run has.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from ...adapters.memory.config import StaticConfigStore
from ...config.loader import load_queue_config
from ...located.yaml_source import read_yaml
from ...machine.parameters import as_json
from ...ports.config import ConfigStore
from ...simulation.timeline import Timeline
from .compare import RunSummary, differences
from .culprits import culprit_rows
from .figures import EMPTY, TOTAL
from .table import at, table

POLICY_CONFIG = Path("config") / "queues.yaml"

Rows = Sequence[tuple[str, tuple[str, ...]]]


class ColumnsError(ValueError):
    """A ``--policy`` or ``--vary`` that names no policy: the command says why, exit 2."""


@dataclass(frozen=True)
class PolicyColumn:
    """One policy of the run: its label (the column's heading), its files, and the
    parameters ``--vary`` set on every queue of its config."""

    label: str
    machines: str
    config: str
    settings: tuple[tuple[str, Any], ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "machines": self.machines,
            "config": self.config,
            "set": {k: as_json(v) for k, v in self.settings},
        }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="DIR",
        help="one more policy directory (DIR/machines, DIR/config/queues.yaml); repeat it",
    )
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="PARAM=V1,V2,...",
        help="one more column of the first policy per value, PARAM set on every queue",
    )


def columns_of(args: argparse.Namespace) -> list[PolicyColumn]:
    """The run's policies in column order; :class:`ColumnsError` for a ``--policy`` that
    is not a policy directory or a ``--vary`` that is not ``PARAM=V1,V2,...``."""
    columns = [PolicyColumn("policy", args.machines, args.config)]
    if args.vs_machines is not None:
        columns.append(PolicyColumn("vs policy", args.vs_machines, args.vs_config))
    for directory in args.policy:
        columns.append(_directory_column(directory))
    for spec in args.vary:
        name, values = _vary(spec)
        for text, value in values:
            label = f"{name}={text}"
            columns.append(PolicyColumn(label, args.machines, args.config, ((name, value),)))
    return _unique_labels(columns)


def _directory_column(directory: str) -> PolicyColumn:
    root = Path(directory)
    machines, config = root / "machines", root / POLICY_CONFIG
    if not machines.is_dir() or not config.is_file():
        raise ColumnsError(
            f"--policy {directory}: not a policy directory (it needs machines/ and "
            "config/queues.yaml)"
        )
    return PolicyColumn(root.name or directory, str(machines), str(config))


def _vary(spec: str) -> tuple[str, list[tuple[str, Any]]]:
    """``PARAM`` and each value of ``PARAM=V1,V2,...``, as written and as YAML reads it."""
    name, sep, text = spec.partition("=")
    values = [v.strip() for v in text.split(",")] if sep else []
    if not name.strip() or not values or not all(values):
        raise ColumnsError(f"--vary {spec!r}: write PARAM=V1,V2,... (max_concurrent=1,2,3)")
    return name.strip(), [(v, yaml.safe_load(v)) for v in values]


def _unique_labels(columns: list[PolicyColumn]) -> list[PolicyColumn]:
    seen: dict[str, int] = {}
    out = []
    for column in columns:
        n = seen[column.label] = seen.get(column.label, 0) + 1
        label = column.label if n == 1 else f"{column.label} #{n}"
        out.append(replace(column, label=label))
    return out


def config_store(column: PolicyColumn, parameters: Mapping[str, Any]) -> ConfigStore:
    """The column's queue config, with its ``--vary`` settings on every queue (defaults
    and each entry), checked against the policy's declared parameters."""
    if not column.settings:
        return StaticConfigStore(load_queue_config(column.config, parameters=parameters))
    settings = dict(column.settings)
    shown = ", ".join(f"{k}={v}" for k, v in column.settings)
    # Each value checked once, where it was given, before it is set on every entry.
    StaticConfigStore({"defaults": settings}, name=f"--vary {shown}", parameters=parameters)
    data = read_yaml(Path(column.config)).data or {}
    changed: dict[str, Any] = dict(data)
    changed["defaults"] = {**dict(data.get("defaults") or {}), **settings}
    entries = dict(data.get("queues") or {})
    changed["queues"] = {name: {**dict(v or {}), **settings} for name, v in entries.items()}
    return StaticConfigStore(changed, name=f"{column.config} with {shown}", parameters=parameters)


def timeline_for(column: PolicyColumn, timeline: Timeline) -> Timeline:
    """``timeline`` with the column's ``--vary`` settings over its own ``config:``, so a
    value the timeline sets for its queue does not hide the one being varied."""
    if not column.settings:
        return timeline
    return replace(timeline, config={**timeline.config, **dict(column.settings)})


def columns_json(
    timeline: str, columns: Sequence[PolicyColumn], runs: Sequence[RunSummary], seed: int = 0
) -> dict[str, Any]:
    """The ``whatif --json`` document of a run with more than two policies."""
    names = sorted({q for run in runs for q in run.figures} - {TOTAL})
    return {
        "timeline": timeline,
        "seed": seed,
        "policies": [c.as_json() for c in columns],
        "queues": [
            {"queue": q, "figures": [run.figures.get(q, EMPTY).as_json() for run in runs]}
            for q in names
        ],
        "total": [run.figures[TOTAL].as_json() for run in runs],
        "completes": [dict(run.completes) for run in runs],
        **culprits_json(runs),
        "differences": differences(runs),
    }


def culprits_json(runs: Sequence[RunSummary]) -> dict[str, Any]:
    """``{"culprits": [figures, ...]}`` when some run searched for culprits, else ``{}``."""
    if not any(run.culprits.reported for run in runs):
        return {}
    return {"culprits": [run.culprits.as_json() for run in runs]}


def render_columns(doc: dict[str, Any], rows: Rows) -> str:
    """The document as two tables: a column of figures per policy, then the heads whose
    final state differs."""
    labels = [p["label"] for p in doc["policies"]]
    lines = [f"timeline: {doc['timeline']}"]
    for policy in doc["policies"]:
        settings = ", ".join(f"{k}={v}" for k, v in policy["set"].items())
        more = f" ({settings} on every queue)" if settings else ""
        lines.append(f"{policy['label']}: {policy['machines']} + {policy['config']}{more}")
    lines.append(f"seed: {doc['seed']} (draws build durations for commits never built live)")
    blocks = [(q["queue"], q["figures"]) for q in doc["queues"]] + [(TOTAL, doc["total"])]
    body = figure_rows(rows, blocks, doc["completes"], doc.get("culprits"))
    lines += ["", *table(("queue", "figure", *labels), body), ""]
    found = doc["differences"]
    lines.append(f"requests whose final outcome differs: {len(found) or 'none'}")
    if found:
        header = ("queue", "uri", "request", *labels)
        cells = [(d["queue"], d["uri"], d["request_id"], *d["outcomes"]) for d in found]
        lines += table(header, cells)
    return "\n".join(lines)


def figure_rows(
    rows: Rows,
    blocks: Sequence[tuple[str, Sequence[dict[str, Any]]]],
    completes: Sequence[dict[str, int]],
    culprits: Sequence[dict[str, Any]] | None,
) -> list[tuple[str, ...]]:
    """A table's figure rows, a cell per run: ``rows`` of each queue's (then the total's)
    figures, the fate of the outcomes, and the culprit rows when some run searched."""
    body: list[tuple[str, ...]] = []
    for name, figures in blocks:
        for i, (label, path) in enumerate(rows):
            body.append((name if i == 0 else "", label, *(at(f, path) for f in figures)))
    for key in completes[0]:  # in :func:`.compare.summarize`'s order
        body.append(("", f"outcomes {key}", *(str(c[key]) for c in completes)))
    if culprits is not None:
        body += [("", label, *cells) for label, cells in culprit_rows(culprits)]
    return body

"""``stovepipe-fsm whatif``: replay one timeline under two policies and compare them.

Both runs read the same timeline file and are timed on its clock
(:mod:`stovepipe_fsm.simulation.timed`), side by side in two processes for a long
timeline on a machine with the cores (:mod:`.parallel`); the figures and the requests that end
differently are shown side by side (docs/whatif.md). Input is checked as ``simulate``
checks it: a bad timeline or policy is reported at ``file:line:column``, exit 2. With
``--policy`` or ``--vary`` there are more than two policies, a column each
(:mod:`.columns`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ...process.catalog import load_process_machines
from ...simulation.collector import settled_heap
from ...simulation.timed import replay_timed
from ...simulation.timeline import Timeline, load_timeline
from ..options import DEFAULT_CONFIG, DEFAULT_MACHINES, EXIT_OK, EXIT_USAGE
from . import columns
from .columns import PolicyColumn
from .compare import RunSummary, differences, summarize
from .figures import EMPTY, TOTAL
from .parallel import PARALLEL_FROM_STEPS, can_fork, replay_both
from .table import table

SIDES = ("policy", "vs_policy")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("whatif", help="replay a timeline under two policies or more, side by side")
    p.add_argument("timeline", help="the timeline file every policy replays")
    p.add_argument("--machines", default=DEFAULT_MACHINES, help="the policy's machines")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="the policy's queue config")
    p.add_argument("--vs-machines", help="the other policy's machines (default: --machines)")
    p.add_argument("--vs-config", help="the other policy's queue config (default: --config)")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds the build durations drawn for commits never built live, and the "
        "timeline's flakes (default 0)",
    )
    columns.add_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=cmd_whatif)


def cmd_whatif(args: argparse.Namespace, *, parallel: bool | None = None) -> int:
    """Replay, compare, print. ``parallel`` (default: for a long timeline on a machine
    with the cores, :mod:`.parallel`) runs the two replays side by side."""
    if args.policy or args.vary:
        try:
            return _whatif_columns(args)
        except columns.ColumnsError as exc:
            return _usage(str(exc))
    if args.vs_machines is None and args.vs_config is None:
        return _usage(
            "nothing to compare: give --vs-config or --vs-machines (the other defaults to "
            "this policy's), or --policy DIR or --vary PARAM=V1,V2,... (docs/whatif.md)"
        )
    args.vs_machines = args.machines if args.vs_machines is None else args.vs_machines
    args.vs_config = args.config if args.vs_config is None else args.vs_config
    timeline = load_timeline(args.timeline)
    if parallel is None:
        parallel = len(timeline.steps) >= PARALLEL_FROM_STEPS and can_fork()
    with settled_heap():  # frozen before the fork: the child does not copy the timeline
        mine = PolicyColumn("policy", args.machines, args.config)
        theirs = PolicyColumn("vs policy", args.vs_machines, args.vs_config)
        run, vs = replay_both(
            lambda: _replay(timeline, mine, args.seed),
            lambda: _replay(timeline, theirs, args.seed),
            parallel=parallel,
        )
        doc = whatif_json(args, run, vs)
    print(json.dumps(doc, indent=2) if args.json else render(doc))
    return EXIT_OK


def _usage(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _whatif_columns(args: argparse.Namespace) -> int:
    """A column per policy (:mod:`.columns`), each replayed in turn."""
    chosen = columns.columns_of(args)
    timeline = load_timeline(args.timeline)
    with settled_heap():
        runs = [_replay(timeline, column, args.seed) for column in chosen]
    doc = columns.columns_json(args.timeline, chosen, runs, args.seed)
    print(json.dumps(doc, indent=2) if args.json else columns.render_columns(doc, ROWS))
    return EXIT_OK


def _replay(timeline: Timeline, column: PolicyColumn, seed: int) -> RunSummary:
    """The replay of ``timeline`` under ``column``'s policy, summed up for comparison."""
    machines = load_process_machines(column.machines)
    config = columns.config_store(column, machines.parameters)
    timeline = columns.timeline_for(column, timeline)
    return summarize(replay_timed(timeline, machines, config, seed=seed))


def whatif_json(args: argparse.Namespace, run: RunSummary, vs: RunSummary) -> dict[str, Any]:
    """The ``whatif --json`` document (docs/whatif.md describes every key)."""
    mine, theirs = run.figures, vs.figures
    queues = sorted((mine.keys() | theirs.keys()) - {TOTAL})
    return {
        "timeline": args.timeline,
        "policy": {"machines": args.machines, "config": args.config},
        "vs_policy": {"machines": args.vs_machines, "config": args.vs_config},
        "seed": args.seed,
        "queues": [
            {
                "queue": q,
                "policy": mine.get(q, EMPTY).as_json(),
                "vs_policy": theirs.get(q, EMPTY).as_json(),
            }
            for q in queues
        ],
        "total": {"policy": mine[TOTAL].as_json(), "vs_policy": theirs[TOTAL].as_json()},
        "completes": {side: r.completes for side, r in zip(SIDES, (run, vs), strict=True)},
        **culprits_json(dict(zip(SIDES, (run, vs), strict=True))),
        "differences": [_two_sided(found) for found in differences((run, vs))],
    }


def _two_sided(found: dict[str, Any]) -> dict[str, Any]:
    """A head that ends differently, its two outcomes as ``outcome`` and ``vs_outcome``."""
    outcome, vs_outcome = found.pop("outcomes")
    return {**found, "outcome": outcome, "vs_outcome": vs_outcome}


def culprits_json(runs: dict[str, RunSummary]) -> dict[str, Any]:
    """``{"culprits": {side: figures}}`` when either run searched for culprits, else ``{}``."""
    if not any(r.culprits.reported for r in runs.values()):
        return {}
    return {"culprits": {side: r.culprits.as_json() for side, r in runs.items()}}


# --- text -----------------------------------------------------------------------------

ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("builds full", ("builds", "full")),
    ("builds incremental", ("builds", "incremental")),
    ("builds skipped", ("builds", "skipped")),
    ("wasted speculative builds", ("wasted_speculative_builds",)),
    ("slot-hours", ("slot_hours",)),
    ("supersedes", ("supersedes",)),
    ("preempted", ("preempted",)),
    ("holds", ("holds",)),
    ("went green", ("ingest_to_green_ms", "count")),
    ("ingest->green p50 ms", ("ingest_to_green_ms", "p50")),
    ("ingest->green p95 ms", ("ingest_to_green_ms", "p95")),
    ("ingest->green max ms", ("ingest_to_green_ms", "max")),
    ("longest wait for slot ms", ("longest_wait_for_slot_ms",)),
)


def render(doc: dict[str, Any]) -> str:
    """The document as two tables: figures side by side, then the differing requests."""
    header: tuple[str, ...] = ("queue", "figure", "policy", "vs policy")
    blocks = [(q["queue"], q) for q in doc["queues"]] + [(TOTAL, doc["total"])]
    rows = columns.figure_rows(
        ROWS,
        [(name, [block[s] for s in SIDES]) for name, block in blocks],
        [doc["completes"][s] for s in SIDES],
        [doc["culprits"][s] for s in SIDES] if "culprits" in doc else None,
    )
    lines = [
        f"timeline: {doc['timeline']}",
        f"policy:    {doc['policy']['machines']} + {doc['policy']['config']}",
        f"vs policy: {doc['vs_policy']['machines']} + {doc['vs_policy']['config']}",
        f"seed:      {doc['seed']} (draws build durations for commits never built live)",
        "",
        *table(header, rows),
        "",
    ]
    found: list[dict[str, str]] = doc["differences"]
    lines.append(f"requests whose final outcome differs: {len(found) or 'none'}")
    if found:
        header = ("queue", "uri", "request", "policy", "vs policy")
        keys = ("queue", "uri", "request_id", "outcome", "vs_outcome")
        lines += table(header, [tuple(d[k] for k in keys) for d in found])
    return "\n".join(lines)

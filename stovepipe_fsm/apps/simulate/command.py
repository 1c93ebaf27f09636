"""``stovepipe-fsm simulate``: replay a timeline on in-memory adapters.

A timeline's expect steps are evaluated and shown (a row per failed check, ``ok`` for
the rest, and a count under the final table or in ``--json``), but do not change the
exit code: ``simulate`` shows what happened; ``stovepipe-fsm test`` is the command that
judges it.
"""

from __future__ import annotations

import argparse
import json

from ...process.catalog import load_process_machines
from ...simulation.collector import settled_heap
from ...simulation.replay import render_table, result_json, simulate
from ...simulation.timeline import load_timeline
from .. import options


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("simulate", help="replay a timeline on in-memory adapters")
    p.add_argument("timeline", help="the timeline file to replay (YAML or JSON lines)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--machines", default=options.DEFAULT_MACHINES, help=options.MACHINES_HELP)
    p.add_argument("--config", default=options.DEFAULT_CONFIG, help=options.CONFIG_HELP)
    p.set_defaults(handler=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    timeline = load_timeline(args.timeline)
    machines = load_process_machines(args.machines)
    config = options.load_policy_store(args.config, machines.parameters)
    with settled_heap():
        sim = simulate(timeline, machines, config)
        if args.json:
            print(json.dumps(result_json(sim.world, sim), indent=2))
        else:
            print(render_table(sim))
    return options.EXIT_OK

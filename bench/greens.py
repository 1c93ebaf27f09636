"""What keeping recent greens costs and buys: ancestry questions and full builds.

Run from the repository root: ``python -m bench.greens`` (``--heads``, ``--seed``,
``--rewrites``).

The synthetic trunk of :mod:`bench.speculative` (force-pushes onto the head three back)
is replayed through the real process stage on the simulated world, one slot, under
``recent_greens`` 1 (last green alone: the base rule before recent greens were kept) and
the shipped default. Reported: admissions, full and incremental builds, and the
questions asked of source control per admission (every one an ``is_ancestor``: the
shipped config sets no path globs, so no diff is asked).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.speculative import MINUTE, Outcome, Policy, run, synthetic_trunk
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.process.greens import RECENT_GREENS


def table(outcomes: list[Outcome]) -> str:
    lines = [
        "| policy | admissions | full | incremental | ancestry questions | per admission |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        per = o.ancestry_queries / o.builds if o.builds else 0.0
        lines.append(
            f"| {o.policy.label} | {o.builds} | {o.full} | {o.incremental} "
            f"| {o.ancestry_queries} | {per:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.greens", description=__doc__)
    parser.add_argument("--heads", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rewrites", type=float, default=0.05, help="share of rewrite heads")
    parser.add_argument("--machines", default="machines")
    args = parser.parse_args(argv)
    machines = load_process_machines(Path(args.machines))
    kept = int(machines.parameter_defaults[RECENT_GREENS])
    trunk = synthetic_trunk(args.heads, args.seed, 12.0, 30.0, args.rewrites, 0.0)
    rewrites = sum(1 for i, h in enumerate(trunk[1:]) if h.parents != (trunk[i].uri,))
    print(f"{args.heads} heads, seed {args.seed}: {rewrites} rewrites (force-pushes)")
    policies = [Policy("recent_greens 1", 1, recent_greens=1), Policy(f"recent_greens {kept}", 1)]
    print(table([run(p, trunk, machines, 240 * MINUTE) for p in policies]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What speculative validation and slot leases buy, on a synthetic trunk.

Run from the repository root: ``python -m bench.speculative`` (``--heads``, ``--seed``).

One queue, driven through the real process stage on the simulated world (the same
machines, stores and settle policy as ``simulate``), with a clock that jumps from event
to event. The trunk is drawn once from the seed and replayed under every policy, so the
rows differ only by the policy:

- heads arrive as a Poisson process (mean gap ``--gap-min`` minutes);
- a full build takes a log-normal time (median ``--build-min`` minutes, sigma 0.9: a
  long tail), an incremental one a third of the same draw;
- a few heads are rewrites (a force-push onto the head three back), and the heads
  after one build on it;
- a few builds hang: they never report, until an operator fails them after
  ``--operator-min`` minutes. Without a lease a hung build holds its slot that long;
  with ``max_validation_ms`` the slot is reclaimed at expiry (the build's late outcome
  is still recorded).

Reported per policy: time from a head's ingest until last green reaches it or a newer
head (p50, p95; heads never reached are counted at the end of the run), builds run
(full and incremental), and wasted speculative builds: greens that landed behind the
bookmark (moot) plus builds of a head that an already-adopted newer green had made
moot before they finished.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.domain.entities import FULL, INCREMENTAL_SINCE_GREEN
from stovepipe_fsm.domain.hooks import VALIDATION_LEASE_EXPIRED
from stovepipe_fsm.domain.ids import parse_request_id
from stovepipe_fsm.process.catalog import ProcessMachines, load_process_machines
from stovepipe_fsm.simulation.broker import run_sync
from stovepipe_fsm.simulation.world import World

Q = "monorepo/main"
MINUTE = 60_000
HOLD_DELAY_MS = MINUTE


@dataclass(frozen=True)
class Head:
    """One commit the poller reports: when, its parents, and how its build would go."""

    uri: str
    arrives_ms: int
    parents: tuple[str, ...]
    full_ms: int
    red: bool
    hangs: bool


@dataclass(frozen=True)
class Policy:
    label: str
    max_concurrent: int
    max_validation_ms: int = 0
    recent_greens: int = 0  # 0: the machines' default

    def config(self) -> dict[str, int]:
        values = {"max_concurrent": self.max_concurrent, "gate_wait_delay_ms": HOLD_DELAY_MS}
        if self.max_validation_ms:
            values["max_validation_ms"] = self.max_validation_ms
        if self.recent_greens:
            values["recent_greens"] = self.recent_greens
        return values


POLICIES = (
    Policy("N=1", 1),
    Policy("N=2", 2),
    Policy("N=3", 3),
    Policy("N=1, lease 90 min", 1, max_validation_ms=90 * MINUTE),
    Policy("N=2, lease 90 min", 2, max_validation_ms=90 * MINUTE),
)


def synthetic_trunk(
    heads: int, seed: int, gap_min: float, build_min: float, rewrites: float, hangs: float
) -> list[Head]:
    """The heads of one run, all drawn from ``seed``."""
    rng = random.Random(seed)
    trunk: list[Head] = []
    now = 0.0
    tip: list[str] = []  # the current linear history, newest last
    for i in range(1, heads + 1):
        now += rng.expovariate(1.0 / (gap_min * MINUTE))
        uri = f"c{i}"
        if len(tip) > 4 and rng.random() < rewrites:
            tip = tip[:-3]  # a force-push: the last three commits leave the ref
        parents = (tip[-1],) if tip else ()
        tip.append(uri)
        full = build_min * MINUTE * math.exp(rng.gauss(0.0, 0.9))
        trunk.append(
            Head(
                uri=uri,
                arrives_ms=int(now),
                parents=parents,
                full_ms=max(int(full), MINUTE),
                red=rng.random() < 0.05,
                hangs=rng.random() < hangs,
            )
        )
    return trunk


@dataclass
class Outcome:
    """What one policy did with the trunk."""

    policy: Policy
    to_green_ms: list[int] = field(default_factory=list)
    full: int = 0
    incremental: int = 0
    moot_greens: int = 0
    overtaken: int = 0
    leases_expired: int = 0
    #: Questions asked of source control (ancestry; no policy here asks for a diff).
    ancestry_queries: int = 0

    @property
    def builds(self) -> int:
        return self.full + self.incremental

    @property
    def wasted(self) -> int:
        return self.moot_greens + self.overtaken


def run(policy: Policy, trunk: list[Head], machines: ProcessMachines, operator_ms: int) -> Outcome:
    """Replay ``trunk`` under ``policy`` until every build has reported."""
    history = {h.uri: list(h.parents) for h in trunk}
    config = StaticConfigStore({"defaults": policy.config()}, parameters=machines.parameters)
    world = World(machines, config, history)
    by_uri = {h.uri: h for h in trunk}
    arrivals = list(reversed(trunk))
    finishing: list[tuple[int, str]] = []  # (when, request id) of builds that will report
    built: set[str] = set()
    ingested_at: dict[int, int] = {}  # counter -> ingest time
    reached: dict[int, int] = {}  # counter -> when last green first reached it
    green_counter = 0
    outcome = Outcome(policy)
    while arrivals or finishing or world.broker.messages:
        now = world.clock.now_ms()
        while arrivals and arrivals[-1].arrives_ms <= now:
            head = arrivals.pop()
            result = world.ingest(Q, head.uri)
            ingested_at[parse_request_id(result.request_id).counter] = now
        while world.deliver_next() is not None:
            pass
        for record in world.published.builds():
            if record.request_id in built:
                continue
            built.add(record.request_id)
            request = run_sync(world.requests.get(record.request_id))
            head = by_uri[request.uri]
            if request.build_strategy == FULL:
                outcome.full += 1
                took = head.full_ms
            else:
                assert request.build_strategy == INCREMENTAL_SINCE_GREEN
                outcome.incremental += 1
                took = max(head.full_ms // 3, MINUTE)
            finishing.append((now + (operator_ms if head.hangs else took), record.request_id))
        finishing.sort()
        while finishing and finishing[0][0] <= now:
            _, request_id = finishing.pop(0)
            head = by_uri[run_sync(world.requests.get(request_id)).uri]
            counter = parse_request_id(request_id).counter
            green = not head.red and not head.hangs
            if green and counter < green_counter:
                outcome.moot_greens += 1
            elif counter < green_counter:
                outcome.overtaken += 1
            world.complete(request_id, "succeeded" if green else "failed")
            row = run_sync(world.queues.get(Q))
            if row.last_green_request_id:
                newest = parse_request_id(row.last_green_request_id).counter
                for n in range(green_counter + 1, newest + 1):
                    reached.setdefault(n, now)
                green_counter = max(green_counter, newest)
        times = [t for t, _ in finishing[:1]]
        if arrivals:
            times.append(arrivals[-1].arrives_ms)
        due = world.broker.next_due_ms()
        if due is not None:
            times.append(due)
        if not times:
            break
        world.advance(max(min(times) - now, 0) or 1)
    outcome.leases_expired = sum(
        1 for r in world.published.unique("hook") if r.event_type == VALIDATION_LEASE_EXPIRED
    )
    outcome.ancestry_queries = world.graph.calls
    end = world.clock.now_ms()
    outcome.to_green_ms = [reached.get(n, end) - at for n, at in sorted(ingested_at.items())]
    return outcome


def _minutes(ms: float) -> str:
    return f"{ms / MINUTE:.0f}"


def percentile(values: list[int], fraction: float) -> float:
    ordered = sorted(values)
    index = min(round(fraction * (len(ordered) - 1)), len(ordered) - 1)
    return float(ordered[index])


def table(outcomes: list[Outcome]) -> str:
    lines = [
        "| policy | head to green p50 (min) | p95 (min) | builds | full | incremental "
        "| wasted speculative | leases expired |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.policy.label} | {_minutes(statistics.median(o.to_green_ms))} "
            f"| {_minutes(percentile(o.to_green_ms, 0.95))} | {o.builds} | {o.full} "
            f"| {o.incremental} | {o.wasted} | {o.leases_expired} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.speculative", description=__doc__)
    parser.add_argument("--heads", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--gap-min", type=float, default=12.0, help="mean minutes between heads")
    parser.add_argument("--build-min", type=float, default=30.0, help="median full build")
    parser.add_argument("--rewrites", type=float, default=0.02, help="share of rewrite heads")
    parser.add_argument("--hangs", type=float, default=0.02, help="share of hung builds")
    parser.add_argument("--operator-min", type=float, default=240.0)
    parser.add_argument("--machines", default="machines")
    args = parser.parse_args(argv)
    quiet = logging.getLogger("stovepipe_fsm")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the stage logs a line per reclaimed lease
    try:
        return _run(args)
    finally:
        quiet.setLevel(level)


def _run(args: argparse.Namespace) -> int:
    machines = load_process_machines(Path(args.machines))
    trunk = synthetic_trunk(
        args.heads, args.seed, args.gap_min, args.build_min, args.rewrites, args.hangs
    )
    rewrites = sum(1 for i, h in enumerate(trunk[1:]) if h.parents != (trunk[i].uri,))
    print(
        f"{args.heads} heads, seed {args.seed}: a head every {args.gap_min:g} min on average, "
        f"full build median {args.build_min:g} min (incremental a third), {rewrites} "
        f"rewrites, {sum(h.hangs for h in trunk)} hung builds (failed by an operator after "
        f"{args.operator_min:g} min), {sum(h.red for h in trunk)} red builds"
    )
    outcomes = [run(p, trunk, machines, int(args.operator_min * MINUTE)) for p in POLICIES]
    print(table(outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())

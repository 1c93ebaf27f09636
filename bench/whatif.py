"""bench.whatif: how fast ``stovepipe-fsm whatif`` replays a large synthetic timeline.

The timeline is generated (:func:`generate`): heads arrive on every queue at a
Poisson-ish rate per tick of the clock, each on its queue's linear history, and every
head's build outcome (mostly green) is given a build time after its ingest. The same
seed gives the same timeline, byte for byte. The bench writes it to a temporary file,
then times the command's two parts separately: loading the timeline (YAML with source
locations, schema, checks) and the replay under each of the two policies. Each is shown
in wall-clock seconds and in the process's CPU seconds: on a machine shared with other
work the CPU figure is the one that compares between runs.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.config.loader import load_queue_config
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.timed import replay_timed
from stovepipe_fsm.simulation.timeline import load_timeline

TICK_MS = 1000


def generate(
    heads: int = 100_000,
    queues: int = 10,
    *,
    seed: int = 1,
    rate: float = 0.5,
    build_ticks: tuple[int, int] = (2, 6),
    green: float = 0.9,
) -> dict[str, Any]:
    """A timeline document: ``heads`` heads over ``queues`` queues.

    Each tick every queue receives a number of heads drawn from a Poisson distribution
    of mean ``rate``; each head's outcome (green with probability ``green``) is recorded
    between ``build_ticks`` ticks after its ingest. Ticks advance the clock by
    :data:`TICK_MS`, the queues' gate delay.
    """
    rng = random.Random(seed)
    names = [f"repo{i}/main" for i in range(queues)]
    tips: dict[str, str] = {}
    history: dict[str, list[str]] = {}
    due: dict[int, list[dict[str, Any]]] = {}
    steps: list[Any] = []
    made = tick = 0
    while made < heads or due:
        if tick:
            steps.append({"advance_ms": TICK_MS})
        for step in due.pop(tick, []):
            steps.append({"complete": step})
        for queue in names:
            for _ in range(_poisson(rng, rate)):
                if made >= heads:
                    break
                made += 1
                uri = f"c{made}"
                history[uri] = [tips[queue]] if queue in tips else []
                tips[queue] = uri
                steps.append({"ingest": {"uri": uri, "queue": queue}})
                outcome = "succeeded" if rng.random() < green else "failed"
                at = tick + rng.randint(*build_ticks)
                due.setdefault(at, []).append({"uri": uri, "queue": queue, "outcome": outcome})
        steps.append("run")
        tick += 1
    return {
        "description": f"{heads} heads over {queues} queues, seed {seed}",
        "queue": names[0],
        "config": {"max_concurrent": 1, "gate_wait_delay_ms": TICK_MS},
        "history": history,
        "steps": steps,
    }


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method: plenty for the small means of a queue's arrivals per tick."""
    limit, k, p = pow(2.718281828459045, -mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def write_timeline(doc: dict[str, Any], path: Path) -> None:
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    path.write_text(yaml.dump(doc, Dumper=dumper, sort_keys=False, width=1000))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.whatif", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--heads", type=int, default=100_000)
    parser.add_argument("--queues", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--machines", default="machines")
    parser.add_argument("--config", default="config/queues.yaml")
    parser.add_argument("--vs-machines", default="examples/policies/serial_every_head/machines")
    parser.add_argument(
        "--vs-config", default="examples/policies/serial_every_head/config/queues.yaml"
    )
    parser.add_argument("--profile", action="store_true", help="print the cProfile top 25")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    doc = generate(args.heads, args.queues, seed=args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "timeline.yaml"
        write_timeline(doc, path)
        generated = time.perf_counter() - started
        size = path.stat().st_size
        started, cpu = time.perf_counter(), time.process_time()
        timeline = load_timeline(path)
        loaded, loaded_cpu = time.perf_counter() - started, time.process_time() - cpu
    print(
        f"python {sys.version.split()[0]}; {args.heads} heads over {args.queues} queues, "
        f"seed {args.seed}: {len(timeline.steps)} steps, {size / 1e6:.1f} MB of YAML"
    )
    print(f"generate {generated:.1f} s; load {loaded:.1f} s (cpu {loaded_cpu:.1f} s)")
    total, total_cpu = loaded, loaded_cpu
    replays = replays_cpu = 0.0
    profiler = cProfile.Profile() if args.profile else None
    for label, machines_dir, config_path in (
        ("policy", args.machines, args.config),
        ("vs policy", args.vs_machines, args.vs_config),
    ):
        machines = load_process_machines(machines_dir)
        config = StaticConfigStore(load_queue_config(config_path, parameters=machines.parameters))
        started, cpu = time.perf_counter(), time.process_time()
        with profiler or contextlib.nullcontext():
            run = replay_timed(timeline, machines, config)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        total, total_cpu = total + seconds, total_cpu + cpu
        replays, replays_cpu = replays + seconds, replays_cpu + cpu
        print(
            f"replay {label} ({machines_dir}): {seconds:.1f} s, {args.heads / seconds:,.0f} "
            f"heads/s (cpu {cpu:.1f} s, {args.heads / cpu:,.0f} heads/cpu-s); "
            f"{len(run.world.published.builds())} builds, {run.world.holds} holds"
        )
    print(
        f"both replays: {replays:.1f} s, {args.heads / replays:,.0f} heads/s "
        f"(cpu {replays_cpu:.1f} s, {args.heads / replays_cpu:,.0f} heads/cpu-s)"
    )
    print(
        f"load + both replays: {total:.1f} s, {args.heads / total:,.0f} heads/s "
        f"(cpu {total_cpu:.1f} s, {args.heads / total_cpu:,.0f} heads/cpu-s)"
    )
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())

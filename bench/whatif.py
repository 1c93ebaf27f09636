"""bench.whatif: how fast ``whatif`` and ``simulate`` load and replay a large timeline.

The timeline is generated (:func:`generate`): heads arrive on every queue at a
Poisson-ish rate per tick of the clock, each on its queue's linear history, and every
head's build outcome (mostly green) is given a build time after its ingest. The same
seed gives the same timeline, byte for byte. Two shapes (:data:`SHAPES`): ``steady``
(short builds, a head or two waiting per queue) and ``piled`` (a slow CI, dozens of heads
waiting per queue). For each, the bench writes the timeline as YAML and as JSON lines,
times loading each (``--located`` adds the located YAML path, the previous loader), then
the replay under each of the two policies, and the whole of what ``whatif`` does on the
JSON-lines file. Then the commands themselves, as a user runs them, each in its own
process: ``stovepipe-fsm whatif`` on the JSON-lines file (its two replays side by side
on two cores) and ``stovepipe-fsm simulate --json`` on it without its outcomes (they were
drawn for no policy in particular), wall clock and the CPU seconds of every process the
command ran (``--skip-commands`` leaves them out); ``--simulate`` also times simulate
in this process. First of all, while the heap is small, a history of ``--commits``
commits is loaded listed oldest-first and newest-first. Each figure is
shown in wall-clock seconds and in the process's CPU seconds: on a machine shared with
other work the CPU figure is the one that compares between runs.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import gc
import io
import json
import pstats
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from stovepipe_fsm.adapters.memory import MemorySourceControl
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.config.loader import load_queue_config
from stovepipe_fsm.located.yaml_source import parse_yaml
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.collector import settled_heap
from stovepipe_fsm.simulation.replay import result_json, simulate
from stovepipe_fsm.simulation.timed import replay_timed
from stovepipe_fsm.simulation.timeline import Timeline, load_timeline, located_timeline
from stovepipe_fsm.simulation.timeline_lines import timeline_lines

TICK_MS = 1000


def generate(
    heads: int = 100_000,
    queues: int = 10,
    *,
    seed: int = 1,
    rate: float = 0.5,
    build_ticks: tuple[int, int] = (2, 6),
    green: float = 0.9,
    burst: tuple[int, int] | None = None,
    names: tuple[str, ...] = (),
    config: dict[str, Any] | None = None,
    tail_ticks: int = 0,
    recorded_builds: bool = False,
    culprits: tuple[Any, ...] = (),
    flake_rate: float = 0.0,
) -> dict[str, Any]:
    """A timeline document: ``heads`` heads over ``queues`` queues.

    Each tick every queue receives a number of heads drawn from a Poisson distribution
    of mean ``rate``; each head's outcome (green with probability ``green``) is recorded
    between ``build_ticks`` ticks after its ingest. Ticks advance the clock by
    :data:`TICK_MS`, the queues' gate delay. ``burst`` (``(on, off)`` ticks) makes the
    arrivals bursty: heads arrive during ``on`` ticks, then none for ``off`` ticks, in
    turn. ``names`` names the queues (``repo<i>/main`` otherwise); ``config`` is the
    timeline's own ``config:`` (max_concurrent 1 and the gate delay otherwise);
    ``tail_ticks`` more ticks follow the last outcome, for a backlog to drain.

    ``recorded_builds``: instead of outcomes at fixed times, every head's build is listed
    (``builds:``, its duration and outcome, drawn the same way) and the clock moves by
    ``run_ms`` steps, so each policy's replay ends the builds it starts after their
    duration and its latency shows what its slots and its gate buy; the last step runs
    until every build has ended.

    ``culprits`` and ``flake_rate`` (with ``recorded_builds``) are the timeline's own:
    the commits that break the build, and the chance a green build flakes red.
    """
    rng = random.Random(seed)
    names_list = list(names) or [f"repo{i}/main" for i in range(queues)]
    tips: dict[str, str] = {}
    history: dict[str, list[str]] = {}
    due: dict[int, list[dict[str, Any]]] = {}
    steps: list[Any] = []
    builds: list[dict[str, Any]] = []
    made = tick = 0
    while made < heads or due:
        if tick and not recorded_builds:
            steps.append({"advance_ms": TICK_MS})
        for step in due.pop(tick, []):
            steps.append({"complete": step})
        arriving = burst is None or tick % sum(burst) < burst[0]
        for queue in names_list if arriving else ():
            for _ in range(_poisson(rng, rate)):
                if made >= heads:
                    break
                made += 1
                uri = f"c{made}"
                history[uri] = [tips[queue]] if queue in tips else []
                tips[queue] = uri
                steps.append({"ingest": {"uri": uri, "queue": queue}})
                outcome = "succeeded" if rng.random() < green else "failed"
                ticks = rng.randint(*build_ticks)
                if recorded_builds:
                    duration_ms = ticks * TICK_MS
                    builds.append(
                        {"uri": uri, "queue": queue, "duration_ms": duration_ms, "outcome": outcome}
                    )
                    continue
                due.setdefault(tick + ticks, []).append(
                    {"uri": uri, "queue": queue, "outcome": outcome}
                )
        steps.append({"run_ms": TICK_MS} if recorded_builds else "run")
        tick += 1
    if recorded_builds:
        total_ms = sum(b["duration_ms"] for b in builds) + tail_ticks * TICK_MS
        steps.append({"run_ms": total_ms})  # time enough for every build, one at a time
    else:
        steps += [{"advance_ms": TICK_MS}, "run"] * tail_ticks
    shape = f", bursts of {burst[0]} ticks every {sum(burst)}" if burst else ""
    if config is None:
        config = {"max_concurrent": 1, "gate_wait_delay_ms": TICK_MS}
    doc: dict[str, Any] = {
        "description": f"{heads} heads over {len(names_list)} queues, seed {seed}{shape}",
        "queue": names_list[0],
        "config": config,
    }
    if culprits:
        doc["culprits"] = list(culprits)
    if flake_rate:
        doc["flake_rate"] = flake_rate
    doc["history"] = history
    if recorded_builds:
        doc["description"] += f", builds of {build_ticks[0]}-{build_ticks[1]} s"
        doc["builds"] = builds
    doc["steps"] = steps
    return doc


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method: plenty for the small means of a queue's arrivals per tick."""
    limit, k, p = pow(2.718281828459045, -mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


#: The generated trunk docs/whatif.md compares the peer policies on
#: (``examples/bursty_trunk.yaml``, written by ``python -m bench.whatif --write-bursty``):
#: one queue, pushes in bursts of 3 ticks every 30, builds of 8-14 ticks, so a burst
#: lands while a build runs and the queue drains between bursts. Every head's build is
#: listed with its duration, so each policy's builds take the time they would. The
#: timeline sets only the gate delay, so each policy's own max_concurrent applies.
BURSTY_TRUNK: dict[str, Any] = {
    "heads": 60,
    "queues": 1,
    "seed": 7,
    "rate": 1.2,
    "build_ticks": (8, 14),
    "burst": (3, 27),
    "names": ("monorepo/main",),
    "config": {"gate_wait_delay_ms": TICK_MS},
    "tail_ticks": 30,
    "recorded_builds": True,
}

#: The red trunk docs/whatif.md finds culprits on (``examples/red_trunk.yaml``, written by
#: ``python -m bench.whatif --write-red``): the bursty trunk's builds, larger bursts 90
#: ticks apart, c28 in the middle of the fourth burst breaking the build until c45 (in
#: the sixth) fixes it, and 5 % of green builds flaking red.
RED_TRUNK: dict[str, Any] = {
    **BURSTY_TRUNK,
    "rate": 3.0,
    "burst": (3, 87),
    "tail_ticks": 90,
    "culprits": ({"commit": "c28", "fixed_by": "c45"},),
    "flake_rate": 0.05,
}

SHAPES = {
    # Builds of 2-6 ticks at half a head per tick per queue: a head or two waits per queue.
    "steady": {"build_ticks": (2, 6)},
    # A slow CI (builds of 40-120 ticks): dozens of heads pile up behind each build, and
    # hundreds wait on the topic at once.
    "piled": {"build_ticks": (40, 120)},
}


def write_timeline(doc: dict[str, Any], path: Path) -> None:
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    path.write_text(yaml.dump(doc, Dumper=dumper, sort_keys=False, width=1000))


def write_lines(doc: dict[str, Any], path: Path) -> None:
    path.write_text("".join(f"{line}\n" for line in timeline_lines(doc)), encoding="utf-8")


class Clock:
    """Wall and CPU seconds of a block: the CPU figure compares across a busy machine."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *_: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu

    def __str__(self) -> str:
        return f"{self.wall:.1f} s (cpu {self.cpu:.1f} s)"


def located_load(path: Path) -> Timeline:
    """The located path alone (every value with its place, the JSON schema): what every
    YAML timeline took before the fast path, and what a defective one still takes."""
    text = path.read_text(encoding="utf-8")
    return located_timeline(parse_yaml(text, str(path), max_values=len(text) + 100_000))


#: The collector paces a replay is timed at: the interpreter's default, and the settled
#: heap of simulate and whatif (simulation/collector.py); ``both`` prints their ratio.
COLLECTOR_PACES = {"both": ("default", "settled"), "default": ("default",), "settled": ("settled",)}


def bench_shape(args: argparse.Namespace, shape: str, tmp: Path) -> None:
    doc = generate(args.heads, args.queues, seed=args.seed, **SHAPES[shape])  # type: ignore[arg-type]
    yaml_path, lines_path = tmp / f"{shape}.yaml", tmp / f"{shape}.jsonl"
    write_timeline(doc, yaml_path)
    write_lines(doc, lines_path)
    print(
        f"\n[{shape}] {args.heads} heads over {args.queues} queues, seed {args.seed}: "
        f"{len(doc['steps'])} steps; YAML {yaml_path.stat().st_size / 1e6:.1f} MB, "
        f"JSON lines {lines_path.stat().st_size / 1e6:.1f} MB"
    )
    with Clock() as lines_clock:
        timeline = load_timeline(lines_path)
    print(f"load JSON lines: {lines_clock}")
    if not args.skip_yaml:
        with Clock() as yaml_clock:
            from_yaml = load_timeline(yaml_path)
        same = len(from_yaml.steps) == len(timeline.steps) and from_yaml.history == timeline.history
        print(f"load YAML (fast path): {yaml_clock}; same timeline as JSON lines: {same}")
    if args.located:
        with Clock() as located_clock:
            located_load(yaml_path)
        print(f"load YAML (located path, the previous loader): {located_clock}")
    replays_wall = replays_cpu = 0.0
    profiler = cProfile.Profile() if args.profile else None
    for label, machines_dir, config_path in (
        ("policy", args.machines, args.config),
        ("vs policy", args.vs_machines, args.vs_config),
    ):
        machines = load_process_machines(machines_dir)
        config = StaticConfigStore(load_queue_config(config_path, parameters=machines.parameters))
        cpu_by_pace: dict[str, float] = {}
        for pace in COLLECTOR_PACES[args.collector]:
            # "settled": what simulate and whatif do (simulation/collector.py)
            pacing = settled_heap() if pace == "settled" else contextlib.nullcontext()
            with pacing, Clock() as clock, profiler or contextlib.nullcontext():
                run = replay_timed(timeline, machines, config)
            cpu_by_pace[pace] = clock.cpu
            print(
                f"replay {label} ({machines_dir}), {pace} collector: {clock}, "
                f"{args.heads / clock.cpu:,.0f} heads/cpu-s; "
                f"{len(run.world.published.builds())} builds, {run.world.holds} holds"
            )
        replays_wall, replays_cpu = replays_wall + clock.wall, replays_cpu + clock.cpu
        if len(cpu_by_pace) == 2:
            ratio = cpu_by_pace["default"] / cpu_by_pace["settled"]
            print(f"  default / settled collector (cpu): {ratio:.2f}x")
    if args.simulate:
        machines = load_process_machines(args.machines)
        config = StaticConfigStore(load_queue_config(args.config, parameters=machines.parameters))
        # simulate records outcomes literally, and these were drawn for no policy in
        # particular (a head the policy superseded cannot go green): replay without them,
        # every queue's first build running to the end while newer heads coalesce.
        acting = [s for s in timeline.steps if s.kind != "complete"]
        without = dataclasses.replace(timeline, steps=tuple(acting))
        with settled_heap(), Clock() as clock:
            sim = simulate(without, machines, config)
            size = len(json.dumps(result_json(sim.world, sim), indent=2))
        print(
            f"simulate --json ({args.machines}, without the outcomes; decision trail, log "
            f"rows, the document; {len(acting)} steps): "
            f"{clock}; with the load: {clock.wall + lines_clock.wall:.1f} s "
            f"(cpu {clock.cpu + lines_clock.cpu:.1f} s); {size / 1e6:.1f} MB of JSON"
        )
    if not args.skip_commands:
        bench_commands(args, doc, lines_path)
    total_wall, total_cpu = lines_clock.wall + replays_wall, lines_clock.cpu + replays_cpu
    print(
        f"both replays: {replays_wall:.1f} s (cpu {replays_cpu:.1f} s); "
        f"whatif end to end (load JSON lines + both replays): {total_wall:.1f} s "
        f"(cpu {total_cpu:.1f} s), {args.heads / total_cpu:,.0f} heads/cpu-s"
    )
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())


def bench_commands(args: argparse.Namespace, doc: dict[str, Any], lines_path: Path) -> None:
    """``whatif`` and ``simulate --json`` run as commands, end to end (load, replay,
    comparison or document, output to /dev/null)."""
    command = [
        sys.executable,
        "-c",
        "import sys; from stovepipe_fsm.apps.cli import main; sys.exit(main())",
    ]
    whatif = [
        *command,
        "whatif",
        str(lines_path),
        "--machines",
        args.machines,
        "--config",
        args.config,
        "--vs-machines",
        args.vs_machines,
        "--vs-config",
        args.vs_config,
    ]
    run_command("whatif (command, end to end)", whatif)
    acting = [step for step in doc["steps"] if not (isinstance(step, dict) and "complete" in step)]
    without = lines_path.with_name(f"{lines_path.stem}-without-outcomes.jsonl")
    write_lines({**doc, "steps": acting}, without)
    simulate_json = [
        *command,
        "simulate",
        str(without),
        "--json",
        "--machines",
        args.machines,
        "--config",
        args.config,
    ]
    run_command(f"simulate --json (command, end to end, {len(acting)} steps)", simulate_json)


def run_command(label: str, argv: list[str]) -> None:
    """Run ``argv`` with its output discarded; print its wall clock and the CPU seconds of
    every process it ran (a forked replay included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    status = "ok" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr[-300:]}"
    print(f"{label}: {wall:.1f} s (cpu {cpu:.1f} s in all its processes); {status}")


def bench_history(commits: int, tmp: Path) -> None:
    """Loading a history listed oldest-first against newest-first (``git rev-list
    --parents`` order): the timeline's checks and the in-memory source control."""
    oldest_first = {f"h{i}": [f"h{i - 1}"] if i else [] for i in range(commits)}
    newest_first = dict(reversed(list(oldest_first.items())))
    print(f"\n[history] {commits} commits, one timeline step")
    clocks = []
    for label, history in (("oldest-first", oldest_first), ("newest-first", newest_first)):
        path = tmp / f"history-{label}.jsonl"
        write_lines({"history": history, "steps": ["run"]}, path)
        # Each order starts from a collected heap: the loader is measured, not a full
        # collection that the previous load happened to bring due.
        gc.collect()
        with Clock() as clock:
            timeline = load_timeline(path)
            MemorySourceControl(timeline.history)
        clocks.append(clock)
        print(f"load {label}: {clock}")
    print(f"newest-first / oldest-first (cpu): {clocks[1].cpu / max(clocks[0].cpu, 1e-9):.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.whatif", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--heads", type=int, default=100_000)
    parser.add_argument("--queues", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shape", choices=[*SHAPES, "both"], default="both")
    parser.add_argument("--commits", type=int, default=8_000, help="history-order comparison")
    parser.add_argument("--machines", default="machines")
    parser.add_argument("--config", default="config/queues.yaml")
    parser.add_argument("--vs-machines", default="examples/policies/serial_every_head/machines")
    parser.add_argument(
        "--vs-config", default="examples/policies/serial_every_head/config/queues.yaml"
    )
    parser.add_argument("--skip-yaml", action="store_true", help="load JSON lines only")
    parser.add_argument(
        "--located", action="store_true", help="also time the located YAML path (minutes)"
    )
    parser.add_argument(
        "--simulate", action="store_true", help="also time simulate --json under the policy"
    )
    parser.add_argument("--profile", action="store_true", help="print the cProfile top 25")
    parser.add_argument(
        "--collector",
        choices=list(COLLECTOR_PACES),
        default="both",
        help="replay at the collector's default pace, the settled heap the commands use, or both",
    )
    parser.add_argument(
        "--skip-commands", action="store_true", help="do not run whatif and simulate as commands"
    )
    parser.add_argument(
        "--write-bursty",
        metavar="PATH",
        help="only write the generated bursty trunk (BURSTY_TRUNK) to PATH as YAML",
    )
    parser.add_argument(
        "--write-red",
        metavar="PATH",
        help="only write the generated red trunk (RED_TRUNK) to PATH as YAML",
    )
    args = parser.parse_args(argv)
    if args.write_bursty or args.write_red:
        if args.write_bursty:
            write_timeline(generate(**BURSTY_TRUNK), Path(args.write_bursty))
        if args.write_red:
            write_timeline(generate(**RED_TRUNK), Path(args.write_red))
        return 0
    print(f"python {sys.version.split()[0]}; libyaml: {yaml.__with_libyaml__}")
    shapes = list(SHAPES) if args.shape == "both" else [args.shape]
    with tempfile.TemporaryDirectory() as tmp:
        # First, while the heap is small: after the shapes, what they leave alive makes
        # any collection during the short history loads cost seconds.
        bench_history(args.commits, Path(tmp))
        for shape in shapes:
            bench_shape(args, shape, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())

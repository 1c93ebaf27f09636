"""bench.check_split: where splitting an exploration of ``check`` over two cores pays.

``check --split`` (``stovepipe_fsm/apps/check/split.py``) forks an exploration into two
processes: both inherit the search as it stands, the frontier is cut into runs of
breadth-first order, and each process claims the next run when it is free. Nothing is
shared after the fork, so a state both processes reach is explored by each.

This bench runs the real exploration once, keeps every explored edge, and computes for
each depth what a fork there does: the frontier cut in half (the states explored before
the fork, what each half reaches, the states at depth ``d`` or above, already known at
the fork, excepted; the total work against the exploration's own; the share of its wall
time left), the cut balanced for the best depths, and the frontier claimed in 4 to 32
pieces by whichever process has explored less (:func:`claimed_split`, what ``check``
does). It then estimates ``check``'s wall time on two cores with the largest
exploration cut at its best depth and the others run beside it, at each exploration's
own measured seconds per state. It changes nothing; it exits 0.

    .venv/bin/python -m bench.check_split                      # check's default bounds
    .venv/bin/python -m bench.check_split --heads 2 --max-concurrent 2
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stovepipe_fsm.apps.check.command import Job
from stovepipe_fsm.apps.check.explorer import Explorer
from stovepipe_fsm.apps.check.model import Bounds
from stovepipe_fsm.apps.check.split import cut
from stovepipe_fsm.process.catalog import ProcessMachines, load_process_machines

#: Depths whose frontier is smaller than this are not worth a fork.
MIN_FRONTIER = 16


@dataclass(frozen=True)
class Split:
    """One exploration forked at ``depth`` into two parts of its frontier."""

    depth: int
    before: int  # states shallower than ``depth``: explored once, before the fork
    halves: tuple[int, int]  # states each part explores (its own frontier states included)
    total: int  # states of the exploration unsplit
    cut: int = 0  # frontier states (in breadth-first order) that went to the first part

    @property
    def work(self) -> float:
        """States explored in all, against the exploration unsplit."""
        return (self.before + sum(self.halves)) / self.total

    @property
    def wall(self) -> float:
        """The share of the unsplit exploration's time left with the parts side by side."""
        return (self.before + max(self.halves)) / self.total


def frontier_at(depths: Sequence[int], depth: int) -> list[int]:
    """The states at ``depth``, in id order (the order breadth-first search found them)."""
    return [sid for sid, d in enumerate(depths) if d == depth]


def split_at(
    depths: Sequence[int], successors: Sequence[Sequence[int]], depth: int, cut: int | None = None
) -> Split:
    """What forking at ``depth`` does: the frontier cut after its first ``cut`` states
    (default: half of them), each part explored to the end on its own."""
    frontier = frontier_at(depths, depth)
    at = len(frontier) // 2 if cut is None else cut
    first = _reach(frontier[:at], depths, successors, depth)
    second = _reach(frontier[at:], depths, successors, depth)
    before = sum(1 for d in depths if d < depth)
    return Split(depth, before, (first, second), len(depths), at)


def balanced_split(depths: Sequence[int], successors: Sequence[Sequence[int]], depth: int) -> Split:
    """The cut of the frontier at ``depth`` whose larger part is smallest: the first part
    reaches more as the cut moves on and the second less, so a bisection finds it."""
    size = len(frontier_at(depths, depth))
    low, high = 1, max(1, size - 1)
    best = split_at(depths, successors, depth, low)
    while low <= high:
        middle = (low + high) // 2
        split = split_at(depths, successors, depth, middle)
        if max(split.halves) < max(best.halves):
            best = split
        if split.halves[0] < split.halves[1]:
            low = middle + 1
        else:
            high = middle - 1
    return best


def _reach(
    starts: Sequence[int], depths: Sequence[int], successors: Sequence[Sequence[int]], depth: int
) -> int:
    """States one half explores: its starts and what they reach, the states known at the
    fork (depth <= ``depth``) excepted."""
    return _grow(starts, set(), depths, successors, depth)


def claimed_split(
    depths: Sequence[int], successors: Sequence[Sequence[int]], depth: int, chunks: int
) -> Split:
    """What two processes claiming the frontier at ``depth`` in ``chunks`` pieces do: the
    frontier cut into that many runs of breadth-first order; whichever process has
    explored fewer states claims the next piece, and explores what it reaches that this
    process has not seen yet (the states known at the fork excepted)."""
    frontier = frontier_at(depths, depth)
    pieces = cut(frontier, chunks)
    seen: tuple[set[int], set[int]] = (set(), set())
    explored = [0, 0]
    for piece in pieces:
        worker = 0 if explored[0] <= explored[1] else 1
        explored[worker] += _grow(piece, seen[worker], depths, successors, depth)
    before = sum(1 for d in depths if d < depth)
    return Split(depth, before, (explored[0], explored[1]), len(depths), chunks)


def _grow(
    starts: Sequence[int],
    seen: set[int],
    depths: Sequence[int],
    successors: Sequence[Sequence[int]],
    depth: int,
) -> int:
    """Adds to ``seen`` what ``starts`` reach past ``depth`` (and ``starts``); how many."""
    todo = deque(sid for sid in starts if sid not in seen)
    added = len(todo)
    seen.update(todo)
    while todo:
        for dst in successors[todo.popleft()]:
            if dst not in seen and depths[dst] > depth:
                seen.add(dst)
                todo.append(dst)
                added += 1
    return added


def splits_by_depth(depths: Sequence[int], successors: Sequence[Sequence[int]]) -> list[Split]:
    """Every depth worth a fork, its frontier cut in half (see :func:`split_at`)."""
    deepest = max(depths, default=0)
    counts = [0] * (deepest + 1)
    for d in depths:
        counts[d] += 1
    return [split_at(depths, successors, d) for d in range(1, deepest) if counts[d] >= MIN_FRONTIER]


#: Depths (those of least wall share when cut in half) whose cut is then balanced.
BALANCED = 3
#: Pieces the frontier is cut into when two processes claim them (:func:`claimed_split`).
CHUNKS = (4, 8, 16, 32)


@dataclass(frozen=True)
class Explored:
    max_concurrent: int
    seconds: float
    splits: list[Split]  # the frontier cut in half, at every depth worth a fork
    balanced: list[Split]  # the best depths, their cut balanced
    claimed: list[Split]  # at every depth worth a fork, its frontier claimed in pieces
    states: int
    edges: int
    at_depth: tuple[int, ...] = ()  # states at each depth

    def best(self) -> Split | None:
        return min((*self.splits, *self.balanced), key=lambda s: s.wall, default=None)


def explore(job: Job, machines: ProcessMachines) -> Explored:
    """Run the exploration with every edge kept, then the splits of its graph."""
    found: list[tuple[int, int]] = []
    explorer = Explorer(job.setup(machines), on_edge=lambda src, dst: found.append((src, dst)))
    result = explorer.run()
    if not result.ok:
        sys.exit(f"bench.check_split: the exploration did not pass: {result}")
    successors: list[list[int]] = [[] for _ in explorer.depth]
    for src, dst in found:
        successors[src].append(dst)
    edges = len(found)
    splits = splits_by_depth(explorer.depth, successors)
    balanced = [
        balanced_split(explorer.depth, successors, split.depth)
        for split in sorted(splits, key=lambda s: s.wall)[:BALANCED]
    ]
    claimed = [
        claimed_split(explorer.depth, successors, split.depth, chunks)
        for split in splits
        for chunks in CHUNKS
    ]
    at_depth = [0] * (max(explorer.depth, default=0) + 1)
    for d in explorer.depth:
        at_depth[d] += 1
    return Explored(
        job.max_concurrent,
        result.seconds,
        splits,
        balanced,
        claimed,
        result.states,
        edges,
        tuple(at_depth),
    )


def two_cores(runs: list[Explored]) -> tuple[float, float, float]:
    """``check``'s wall time on two cores: as measured (its largest exploration); with the
    largest one split at its best depth while the others run on the other core; and the
    floor of any such split, every exploration's work with its best split's duplicates
    spread evenly over both cores."""
    ordered = sorted(runs, key=lambda r: r.seconds)
    largest, others = ordered[-1], ordered[:-1]
    unsplit = largest.seconds
    best = largest.best()
    if best is None:
        return unsplit, unsplit, unsplit
    per_state = largest.seconds / largest.states if largest.states else 0.0
    before = best.before * per_state
    big, small = max(best.halves) * per_state, min(best.halves) * per_state
    beside = sum(r.seconds for r in others)
    split = max(before + big, max(beside, before) + small)
    work = sum(r.seconds * (b.work if (b := r.best()) is not None else 1.0) for r in runs)
    return unsplit, split, work / 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.check_split", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--machines", default="machines")
    parser.add_argument("--config", default="config/queues.yaml")
    parser.add_argument("--heads", type=int, default=Bounds().heads)
    parser.add_argument("--no-rewrite", action="store_true")
    parser.add_argument("--max-concurrent", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args(argv)
    machines = load_process_machines(Path(args.machines))
    bounds = Bounds(heads=args.heads, rewrite=not args.no_rewrite)
    print(f"python {sys.version.split()[0]}; check's bounds with heads {args.heads}")
    runs: list[Explored] = []
    for k in sorted(set(args.max_concurrent)):
        job = Job(args.machines, True, args.config, bounds, k, progress=False)
        started = time.perf_counter()
        run = explore(job, machines)
        runs.append(run)
        print(
            f"max_concurrent={k}: {run.states} states, {run.edges} edges, explored in "
            f"{run.seconds:.1f} s (graph kept and split in {time.perf_counter() - started:.1f} s)"
        )
        print("  fork at depth | before | half 1 | half 2 | work vs unsplit | wall share")
        for split in run.splits:
            print(
                f"  {split.depth:13d} | {split.before:6d} | {split.halves[0]:6d} | "
                f"{split.halves[1]:6d} | {split.work:15.2f} | {split.wall:10.2f}"
            )
        for split in run.balanced:
            print(
                f"  balanced at depth {split.depth}: cut after {split.cut} frontier states, "
                f"parts {split.halves[0]} | {split.halves[1]}, work {split.work:.2f}, "
                f"wall share {split.wall:.2f}"
            )
        print(
            "  claimed in pieces: fork at depth | frontier | pieces | part 1 | part 2 | wall share"
        )
        for split in run.claimed:
            print(
                f"  {split.depth:31d} | {run.at_depth[split.depth]:8d} | {split.cut:6d} | "
                f"{split.halves[0]:6d} | "
                f"{split.halves[1]:6d} | {split.wall:10.2f}"
            )
        best = run.best()
        if best is not None:
            print(
                f"  best: fork at depth {best.depth}, {1 / best.wall:.2f}x faster alone, "
                f"{100 * (best.work - 1):.0f} % more states explored"
            )
    unsplit, forked, floor = two_cores(runs)
    print(
        f"two cores, every exploration: {unsplit:.2f} s as check runs them; {forked:.2f} s "
        f"with the largest split at its best depth ({unsplit / forked:.2f}x); no less than "
        f"{floor:.2f} s with any such split ({unsplit / floor:.2f}x), at each exploration's "
        f"measured seconds per state"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What finding a culprit costs: builds, rounds and accuracy of each way to choose probes.

Run from the repository root: ``python -m bench.culprits`` (``--trials``, ``--git-trials``,
``--sizes``, ``--flakes``, ``--seed``).

A generated trunk: a green base, a blamelist of ``m`` commits, the culprit drawn
uniformly among them (the same culprits for every way and flake rate), every commit from
it on red, every commit below it red with chance ``f`` (a flake). The search knows the
red head's own result and runs round by round: start the probes the way chooses (at most
its slots), wait for all their results, until a commit is named or the budget of builds
is spent. Every way confirms with 2 reds; the likelihood also asks a weight of 0.99
under the true flake rate. Reported per way: builds (probes started, mean and p95),
rounds (mean), how often the commit named is the culprit, and how often the search
ended without naming one.

Beside them, the floors. ``git bisect`` (sequential, no reruns) runs on a real
repository generated per trial: one commit per blamelist entry, the culprit adding a
marker file; ``git bisect run`` calls a shell script that is red when the marker is
there and otherwise red with chance ``f`` (a flake list drawn per trial from the seed),
and the script's invocations are its builds. And the fewest rounds any way could take
with ``n`` probes a round: ceil(log base n+1 of m).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stovepipe_fsm.apps.whatif.figures import percentile
from stovepipe_fsm.domain.culprit_search import (
    Tally,
    likelihood_probes,
    named,
    section_probes,
)

CONFIRM = 2
CONFIDENCE = 0.99
GIT = "git bisect"


@dataclass(frozen=True)
class Way:
    """A way to choose probes: ``sections`` (1 slot: bisection) or ``likelihood``."""

    label: str
    kind: str
    slots: int


WAYS = (
    Way("bisection", "sections", 1),
    Way("2-section", "sections", 2),
    Way("4-section", "sections", 4),
    Way("likelihood x1", "likelihood", 1),
    Way("likelihood x4", "likelihood", 4),
)


@dataclass(frozen=True)
class Trial:
    """One search's end: the position named (0: none), builds started, rounds run."""

    culprit: int
    named: int
    builds: int
    rounds: int


def budget(m: int) -> int:
    """The builds a search may start: three times the halvings and the reruns."""
    return 3 * (math.ceil(math.log2(m)) + CONFIRM) if m > 1 else 3 * CONFIRM


def search(way: Way, m: int, trunk: FlakyTrunk) -> Trial:
    """One search, round by round, over a blamelist of ``m`` whose head went red; the
    likelihood weighs under the trunk's true flake rate."""
    flake_rate = trunk.flake_rate

    def choose(tallies: list[Tally], room: int) -> tuple[int, ...]:
        slots = min(way.slots, room)
        if way.kind == "sections":
            return section_probes(tallies, (), slots, CONFIRM)
        return likelihood_probes(tallies, (), slots, CONFIRM, flake_rate, CONFIDENCE)

    def name(tallies: list[Tally]) -> int:
        if way.kind == "sections":
            return named(tallies, CONFIRM)
        return named(tallies, CONFIRM, flake_rate=flake_rate, confidence=CONFIDENCE)

    tallies = [Tally()] * (m - 1) + [Tally(reds=1)]
    builds = rounds = 0
    limit = budget(m)
    while not (found := name(tallies)) and builds < limit:
        probes = choose(tallies, limit - builds)
        if not probes:
            break
        builds += len(probes)
        rounds += 1
        for p in probes:
            tallies[p - 1] = tallies[p - 1].with_result(not trunk.red(p))
    return Trial(trunk.culprit, found, builds, rounds)


@dataclass
class FlakyTrunk:
    """Results on a trunk whose culprit is ``culprit``: red from it on, and red with
    chance ``flake_rate`` below it (drawn from ``rng``)."""

    culprit: int
    flake_rate: float
    rng: random.Random

    def red(self, position: int) -> bool:
        return position >= self.culprit or self.rng.random() < self.flake_rate


def culprits(m: int, trials: int, seed: int) -> list[int]:
    rng = random.Random(f"{seed}/culprits/{m}")
    return [rng.randint(1, m) for _ in range(trials)]


def run_way(way: Way, m: int, flake_rate: float, seed: int, trials: int) -> list[Trial]:
    runs = []
    for i, culprit in enumerate(culprits(m, trials, seed)):
        rng = random.Random(f"{seed}/{way.label}/{m}/{flake_rate}/{i}")
        runs.append(search(way, m, FlakyTrunk(culprit, flake_rate, rng)))
    return runs


# --- the floor: git bisect on a real repository ----------------------------------------

#: No user or system configuration: the commits name their committer in the import
#: stream, and bisect writes no commit.
ENV = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}

#: Red when the culprit's marker is in the tree; otherwise the next line of the flake
#: list says (1: a flaky red). Every call counts one build.
TEST_SCRIPT = """#!/bin/sh
n=$(($(cat "$BUILDS") + 1))
echo "$n" > "$BUILDS"
[ -e broken ] && exit 1
[ "$(sed -n "${n}p" "$FLAKES")" = 1 ] && exit 1
exit 0
"""


def git(repo: Path, *args: str, stdin: bytes | None = None) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], input=stdin, env=ENV, capture_output=True, check=True
    )
    return done.stdout.decode().strip()


def generate_repository(repo: Path, m: int, culprit: int) -> list[str]:
    """A repository whose first commit is the green base and whose next ``m`` are the
    blamelist, the culprit adding the marker file; returns the commit ids, base first."""
    git(repo, "init", "-q", "-b", "trunk")
    stream = []
    for position in range(m + 1):
        text = f"{position}\n".encode()
        stream.append(b"commit refs/heads/trunk\n")
        stream.append(f"mark :{position + 1}\n".encode())
        stamp = 1_700_000_000 + position
        stream.append(f"committer gen <gen@example.invalid> {stamp} +0000\n".encode())
        stream.append(f"data {len(text)}\n".encode() + text)
        if position:
            stream.append(f"from :{position}\n".encode())
        stream.append(f"M 100644 inline position\ndata {len(text)}\n".encode() + text + b"\n")
        if position == culprit:
            stream.append(b"M 100644 inline broken\ndata 0\n\n")
    git(repo, "fast-import", "--quiet", stdin=b"".join(stream))
    git(repo, "checkout", "-q", "trunk")
    return git(repo, "rev-list", "--reverse", "trunk").split()


def git_bisect(m: int, culprit: int, flake_rate: float, rng: random.Random) -> Trial:
    """``git bisect run`` from the red head to the green base; builds are the script's
    calls, and the commit it names is read from ``refs/bisect/bad``."""
    with tempfile.TemporaryDirectory(prefix="culprits-") as tmp:
        root = Path(tmp)
        repo = root / "repo"
        repo.mkdir()
        commits = generate_repository(repo, m, culprit)
        script, builds, flakes = root / "test.sh", root / "builds", root / "flakes"
        script.write_text(TEST_SCRIPT)
        script.chmod(0o755)
        builds.write_text("0\n")
        draws = (int(rng.random() < flake_rate) for _ in range(4 * m + 8))
        flakes.write_text("".join(f"{d}\n" for d in draws))
        env = {**ENV, "BUILDS": str(builds), "FLAKES": str(flakes)}
        subprocess.run(
            ["git", "-C", str(repo), "bisect", "start", commits[-1], commits[0]],
            env=env, capture_output=True, check=True,
        )
        subprocess.run(
            ["git", "-C", str(repo), "bisect", "run", str(script)],
            env=env, capture_output=True, check=True,
        )
        bad = git(repo, "rev-parse", "refs/bisect/bad")
        calls = int(builds.read_text())
    found = commits.index(bad) if bad in commits else 0
    return Trial(culprit, found, calls, calls)


def run_git_bisect(m: int, flake_rate: float, seed: int, trials: int) -> list[Trial]:
    runs = []
    for i, culprit in enumerate(culprits(m, trials, seed)):
        rng = random.Random(f"{seed}/{GIT}/{m}/{flake_rate}/{i}")
        run = git_bisect(m, culprit, flake_rate, rng)
        if flake_rate == 0.0 and run.named != culprit:
            sys.exit(f"bench: git bisect named {run.named}, not {culprit}, without flakes")
        runs.append(run)
    return runs


# --- the tables -----------------------------------------------------------------------


def round_limit(m: int, slots: int) -> int:
    """The fewest rounds that can tell ``m`` positions apart with ``slots`` probes each."""
    rounds = 0
    while (slots + 1) ** rounds < m:
        rounds += 1
    return rounds


def rows(m: int, columns: dict[str, tuple[int, list[Trial]]]) -> list[list[str]]:
    """Six rows of figures for blamelist size ``m``, a cell per column."""

    def mean(runs: list[Trial], of: Callable[[Trial], int]) -> str:
        return f"{sum(map(of, runs)) / len(runs):.1f}"

    def share(runs: list[Trial], hit: Callable[[Trial], bool]) -> str:
        return f"{100 * sum(map(hit, runs)) / len(runs):.1f} %"

    def p95(runs: list[Trial]) -> str:
        return str(percentile(tuple(sorted(t.builds for t in runs)), 95))

    figures: list[tuple[str, Callable[[int, list[Trial]], str]]] = [
        ("builds, mean", lambda _s, r: mean(r, lambda t: t.builds)),
        ("builds, p95", lambda _s, r: p95(r)),
        ("rounds, mean", lambda _s, r: mean(r, lambda t: t.rounds)),
        ("rounds, limit", lambda s, _r: str(round_limit(m, s))),
        ("named right", lambda _s, r: share(r, lambda t: t.named == t.culprit)),
        ("none named", lambda _s, r: share(r, lambda t: t.named == 0)),
    ]
    return [
        [str(m), label, *(cell(slots, runs) for slots, runs in columns.values())]
        for label, cell in figures
    ]


def table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.culprits", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--flakes", type=float, nargs="+", default=[0.0, 0.01, 0.05])
    parser.add_argument("--trials", type=int, default=400, help="searches per way and cell")
    parser.add_argument("--git-trials", type=int, default=30, help="git bisect runs per cell")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    print(
        f"seed {args.seed}; {args.trials} searches per way and cell, {args.git_trials} "
        f"git bisect runs; confirm {CONFIRM}, likelihood confidence {CONFIDENCE}; "
        f"budget 3 x (ceil(log2 m) + {CONFIRM}) builds"
    )
    header = ["m", "figure", *(w.label for w in WAYS), GIT]
    for flake_rate in args.flakes:
        body = []
        for m in args.sizes:
            columns = {
                w.label: (w.slots, run_way(w, m, flake_rate, args.seed, args.trials))
                for w in WAYS
            }
            columns[GIT] = (1, run_git_bisect(m, flake_rate, args.seed, args.git_trials))
            body += rows(m, columns)
        print(f"\nflake rate {flake_rate:.0%}\n")
        print(table(header, body))
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

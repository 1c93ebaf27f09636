"""``stovepipe-fsm test``: run timelines with expect steps against a policy.

Each timeline is replayed exactly as ``simulate`` replays it, on the policy given by
``--machines`` and ``--config``; every failed check is one line,
``file:line:column: expected X, got Y``, at the key of the expect step that failed,
followed by what deliveries raised on the way (each led by the YAML step that raised
it). A timeline passes when all its checks pass. Timelines without expect steps are still run
(a step that cannot apply is bad input) but counted apart: they assert nothing.

Exit codes: 0 every timeline with expectations passed; 1 a check failed; 2 bad input (an
unreadable or invalid timeline, machine or config, each reported at its location, or no
timeline with expect steps at all, so a mistyped path never passes a CI run). Bad input
in one timeline does not stop the others from running.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from ...located.errors import SpecError
from ...ports.config import ConfigStore
from ...process.catalog import ProcessMachines, load_process_machines
from ...simulation.replay import simulate
from ...simulation.timeline import has_expectations, load_timeline
from .. import options

SUFFIXES = (".yaml", ".yml")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "test",
        help="run timelines with expect steps against the policy",
        description=(
            "Replay every timeline (files, or directories of *.yaml) on the policy and "
            "report each failed expect check as file:line:column: expected X, got Y."
        ),
    )
    p.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="timeline files or directories (default: the first of "
        f"{', '.join(options.TIMELINE_DIRS)} that exists)",
    )
    p.add_argument("--machines", default=options.DEFAULT_MACHINES, help=options.MACHINES_HELP)
    p.add_argument("--config", default=options.DEFAULT_CONFIG, help=options.CONFIG_HELP)
    p.set_defaults(handler=cmd_test)


@dataclass
class Tally:
    """What a run found, timeline by timeline."""

    passed: int = 0
    failed: int = 0
    without_expectations: int = 0
    invalid: int = 0

    def summary(self) -> str:
        text = f"{self.passed} passed, {self.failed} failed"
        if self.without_expectations:
            text += f"; {self.without_expectations} without expect steps"
        if self.invalid:
            text += f"; {self.invalid} invalid"
        return text

    def exit_code(self) -> int:
        if self.invalid or not (self.passed or self.failed):
            return options.EXIT_USAGE
        return options.EXIT_FAIL if self.failed else options.EXIT_OK


def cmd_test(args: argparse.Namespace) -> int:
    found = args.paths or [options.first_existing(options.TIMELINE_DIRS)]
    if found == [None]:
        looked = " or ".join(f"{d}/" for d in options.TIMELINE_DIRS)
        print(f"error: no timelines given, and no {looked} here", file=sys.stderr)
        return options.EXIT_USAGE
    paths = timeline_paths([str(path) for path in found])
    machines = load_process_machines(args.machines)
    config = options.load_policy_store(args.config)
    tally = Tally()
    for path in paths:
        run_one(path, machines, config, tally)
    print(tally.summary(), file=sys.stderr)
    if not (tally.passed or tally.failed or tally.invalid):
        print("no timeline has expect steps: nothing was tested", file=sys.stderr)
    return tally.exit_code()


def run_one(path: Path, machines: ProcessMachines, config: ConfigStore, tally: Tally) -> None:
    """Replay one timeline; print its failures (stdout) or why it is invalid (stderr)."""
    try:
        timeline = load_timeline(path)
        sim = simulate(timeline, machines, config)
    except SpecError as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        tally.invalid += 1
        return
    if not has_expectations(timeline):
        tally.without_expectations += 1
        return
    for result in sim.failures:
        print(result.issue)
    if sim.failures:
        # The causes, not only their consequences: what deliveries raised on the way.
        for request_id, error in dict.fromkeys(sim.world.raised):
            print(f"{path}: {request_id} raised {error}")
        tally.failed += 1
    else:
        tally.passed += 1


def timeline_paths(raw: list[str]) -> list[Path]:
    """The files named, and the ``*.yaml``/``*.yml`` files of the directories named.

    A path that does not exist, or a directory without timelines, is bad input: an
    ``OSError`` the command line reports as ``error: ...`` with exit code 2.
    """
    paths: list[Path] = []
    for name in raw:
        path = Path(name)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
            if not found:
                raise FileNotFoundError(2, "no timeline files (*.yaml) in directory", name)
            paths += found
        elif path.is_file():
            paths.append(path)
        else:
            raise FileNotFoundError(2, "No such file or directory", name)
    return paths

"""``stovepipe-fsm check``: the command line of the model checker.

One exploration per queue (``--queue``) and ``max_concurrent`` value (``--max-concurrent``,
else the queue's configured one when ``--queue`` names it, else 1 and 2); with more than
one exploration and more than one ``--jobs``, they run in parallel processes (each loads
the machines itself: compiled machines hold callables and are not sent between
processes). With more than one job, an exploration still running when a core is idle
forks into two processes (``--split``, :mod:`.split`). The report is printed in queue
and ``max_concurrent`` order whatever finished first, and the counterexample written is
the one of the first exploration in that order that has one, so a run is
deterministic. A passing run then names the transitions of the delivery flow that no
exploration took (:mod:`.coverage`).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ...adapters.memory.config import StaticConfigStore
from ...domain.queue_names import InvalidQueueName, validate_queue_name
from ...located.errors import Location, SpecError, SpecIssue
from ...machine.invariants import policy_invariants
from ...machine.lint import UNKNOWN_INVARIANT
from ...process.catalog import ProcessMachines, load_process_machines
from ...process.culprit import PROBE_SLOTS
from ...process.gate import PAUSED
from ...simulation.replay import render_table
from ...simulation.timeline import DEFAULT_QUEUE, load_timeline
from ...simulation.world import STALL_POINTS
from ..options import DEFAULT_CONFIG, DEFAULT_MACHINES, EXIT_FAIL, EXIT_OK, load_policy_store
from .coverage import describe_step, tracker
from .culprits import (
    DEFAULT_COMMITS,
    CulpritBounds,
    CulpritExplorer,
    CulpritResult,
    CulpritSetup,
    policy_specs,
)
from .explorer import (
    DEFAULT_MAX_STATES,
    SPLIT_FRONTIER,
    Explorer,
    Result,
    Setup,
    Tuning,
    rate,
    stderr_progress,
)
from .invariants import Proof, Scopes, Violation
from .model import Bounds
from .split import Cores, PartKilled, can_fork
from .trace import DEFAULT_OUT, Replay, as_timeline, replay, step_notes, write_counterexample
from .variants import Variant

DEFAULT_MAX_CONCURRENT = (1, 2)
OVERLAPS_BY_DEFAULT = False
DEFAULT_MAX_CANCELS = 0
DEFAULT_MAX_RETRIES = 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "check",
        help="explore every bounded interleaving and check the invariants",
        description=(
            "Breadth-first exploration of the real process stage on in-memory adapters: "
            "every interleaving of ingests, deliveries, clock advances, build outcomes, "
            "crashes, duplicates, dead-letters and source-control outages (retried, and "
            "dead-lettered at --max-attempts) within the bounds, checking the invariants the "
            "machines declare; with culprit.yaml, every bounded way a culprit search can go "
            "under a culprit-and-flake model. Exit 0: every declared invariant holds in every "
            "explored state; 1: a counterexample (written as a replayable timeline) or an "
            "incomplete run."
        ),
    )

    def count(flag: str, help: str, default: int = 1) -> None:
        p.add_argument(flag, type=_count, default=default, help=help)

    def positive(flag: str, help: str, default: int) -> None:
        p.add_argument(flag, type=_positive, default=default, help=help)

    def values(flag: str, help: str) -> None:
        p.add_argument(flag, type=_positive, nargs="+", metavar="K", help=help)

    def switch(flag: str, help: str, default: bool = True) -> None:
        p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help)

    p.add_argument("--machines", default=DEFAULT_MACHINES, help="machine directory")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="queue policy file")
    p.add_argument(
        "--queue",
        nargs="+",
        type=_queue_name,
        metavar="Q",
        help=f"queues to check, each with its own policy from --config: its max_concurrent "
        f"and the invariants declared for it (default {DEFAULT_QUEUE}, at max_concurrent "
        "1 and 2)",
    )
    positive("--heads", "linear heads A1..AN ingested (default 3)", 3)
    switch("--rewrite", "ingest a rewrite head R (parent A1) after the linear heads (default on)")
    values(
        "--max-concurrent",
        "explore with each of these max_concurrent values, whatever the config says "
        "(default: with --queue, each queue's own; else 1 2)",
    )
    switch("--crashes", "crash at each crash point of the admit path (default on)")
    count("--max-crashes", "crashes per path (default 1)")
    count("--max-duplicates", "duplicate messages per path (default 1)")
    count("--max-dead-letters", "dead-letter reconciles per path")
    count(
        "--max-cancels",
        "operator cancels per path, of a head not yet ended, when the policy declares "
        f"the withdraw role (default {DEFAULT_MAX_CANCELS})",
        DEFAULT_MAX_CANCELS,
    )
    count(
        "--max-retries",
        "operator retries per path, of a head that ended failed or cancelled, when "
        f"the policy declares retryable outcomes (default {DEFAULT_MAX_RETRIES})",
        DEFAULT_MAX_RETRIES,
    )
    count(
        "--max-outages",
        "source-control outages per path; an outage goes on over the consecutive "
        "deliveries of the message it failed, up to its dead letter (default 1)",
    )
    positive(
        "--max-attempts",
        "the queue's failure budget during the check (overrides the config), small "
        "so that a delivery exhausts it and is dead-lettered within the bounds (default 2)",
        2,
    )
    switch(
        "--overlaps",
        "stall a delivery in hand after an action while its message is redelivered "
        "and the queue moves on (a stale ack, docs/jetstream.md fact H) "
        f"(default {'on' if OVERLAPS_BY_DEFAULT else 'off'})",
        OVERLAPS_BY_DEFAULT,
    )
    count("--max-overlaps", "stalled deliveries per path (default 1)")
    p.add_argument(
        "--stall-at",
        nargs="+",
        choices=STALL_POINTS,
        default=list(STALL_POINTS),
        metavar="POINT",
        help=f"where a delivery may stall (default all: {' '.join(STALL_POINTS)})",
    )
    switch(
        "--pauses",
        "pause and resume the queue, when the policy declares the paused parameter (default on)",
    )
    values(
        "--probe-slots",
        "explore culprit finding with each of these probe_slots values, when the policy "
        "declares culprit.yaml (default: the checked queue's own; none when culprit "
        "finding is off there)",
    )
    positive(
        "--culprit-commits",
        "commits after the green base up to the red head whose culprit is searched "
        f"for (default {DEFAULT_COMMITS}); a newer head follows them",
        DEFAULT_COMMITS,
    )
    count("--max-flakes", "flaky reds per path of the culprit exploration (default 1)")
    positive(
        "--max-states",
        f"give up (exit 1, incomplete) beyond this many states (default {DEFAULT_MAX_STATES})",
        DEFAULT_MAX_STATES,
    )
    p.add_argument(
        "--out", default=DEFAULT_OUT, help=f"counterexample timeline (default {DEFAULT_OUT})"
    )
    positive(
        "--jobs",
        "processes exploring at once: explorations side by side, and with --split the "
        "second process of an exploration once a core is idle (default: the number of CPUs)",
        os.cpu_count() or 1,
    )
    switch(
        "--split",
        "with more than one job, an exploration still running when a core is idle "
        f"forks into two processes, once {SPLIT_FRONTIER} states wait to be expanded "
        "(default on)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument(
        "--no-lint",
        dest="lint",
        action="store_false",
        help="load machines without lint; for mutation testing of the checker itself",
    )
    p.add_argument(
        "--bare-counter",
        action="store_true",
        help="run on the seed's bare in_flight_count instead of slot holders "
        "(demonstrates the wedge that holders prevent)",
    )
    p.add_argument(
        "--replay",
        metavar="TIMELINE",
        help="replay a timeline with every invariant checked after each step, then exit",
    )
    p.set_defaults(handler=cmd_check)


def _queue_name(text: str) -> str:
    """A queue name as ingest accepts it: a pattern names no queue to explore."""
    try:
        validate_queue_name(text)
    except InvalidQueueName as exc:
        hint = "; name one queue the pattern matches" if "*" in text else ""
        raise argparse.ArgumentTypeError(f"{exc}{hint}") from None
    return text


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


@dataclass(frozen=True)
class Job:
    """One exploration, as plain data a worker process can rebuild everything from."""

    machines: str
    lint: bool
    config: str
    bounds: Bounds
    max_concurrent: int
    variant: Variant = field(default_factory=Variant)
    tuning: Tuning = field(default_factory=Tuning)
    progress: bool = True

    def setup(self, machines: ProcessMachines | None = None) -> Setup:
        loaded = machines or load_process_machines(self.machines, lint=self.lint)
        store = load_policy_store(self.config, loaded.parameters)
        return Setup(
            loaded, store, self.bounds, self.max_concurrent, self.variant, scopes=scopes_of(store)
        )


def scopes_of(store: StaticConfigStore) -> Scopes:
    """The config's ``invariants:``, as the checker takes them."""
    return tuple((scope.name, scope.queues) for scope in store.policy.invariant_scopes)


def check_scopes(store: StaticConfigStore, machines: ProcessMachines) -> None:
    """Refuse a config that scopes an invariant the machines do not declare: a typo
    would otherwise leave the invariant proved for every queue, silently."""
    declared = [ref.name for ref in policy_invariants(policy_specs(machines))]
    issues = [
        SpecIssue(
            scope.location or Location(store.policy.source, 1, 1),
            f"invariants: {scope.name!r} is not declared by the machines; they declare: "
            f"{', '.join(declared) or 'none'}",
            UNKNOWN_INVARIANT,
        )
        for scope in store.policy.invariant_scopes
        if scope.name not in declared
    ]
    if issues:
        raise SpecError(issues)


_cores: Cores | None = None  # this run's idle cores, in each process of the pool


def _share(cores: Cores | None) -> None:
    global _cores
    _cores = cores


def run_job(job: Job, machines: ProcessMachines | None = None) -> Result:
    progress = stderr_progress if job.progress else None
    explorer = Explorer(
        job.setup(machines),
        job.tuning,
        progress=progress,
        cores=_cores,
        abandoned=_command_gone() if multiprocessing.parent_process() else None,
    )
    try:
        return explorer.run()
    finally:
        if _cores is not None:
            _cores.give()  # this exploration's core is idle now


def _command_gone() -> Callable[[], bool]:
    """In a pool worker: whether the ``check`` process that started it is gone (killed
    outright, so its pool could not end the worker), leaving no one to read its result."""
    command = os.getppid()
    return lambda: os.getppid() != command


def cmd_check(args: argparse.Namespace) -> int:
    machines = load_process_machines(args.machines, lint=args.lint)
    variant = Variant(bare_counter=args.bare_counter)
    store = load_policy_store(args.config, machines.parameters)
    check_scopes(store, machines)
    if args.replay:
        queue = load_timeline(args.replay).queue
        proof = Proof.declared_by(machines, queue=queue, scopes=scopes_of(store))
        print(describe_proof(proof, queue if proof.out_of_scope else None))
        return _replay(args, machines, variant, proof)
    queues = list(dict.fromkeys(args.queue or [DEFAULT_QUEUE]))
    searches = _culprit_setups(args, machines, store, queues)
    # An exploration forks once a core is idle (the others ended) and its frontier is wide.
    split = args.split and args.jobs > 1 and can_fork()
    tuning = Tuning(max_states=args.max_states, split_at=SPLIT_FRONTIER if split else None)
    jobs: list[Job] = []
    for queue in queues:
        bounds = _bounds(args, queue)
        first = Job(args.machines, args.lint, args.config, bounds, 1, variant, tuning)
        setup = first.setup(machines)
        values = _max_concurrent(args, setup)
        jobs += [replace(first, max_concurrent=k, progress=not args.quiet) for k in values]
        shown = " ".join(map(str, values))
        print(f"check: {describe_setup(setup, machines)}; max_concurrent {shown}")
        proof = setup.rules().proof
        print(describe_proof(proof, queue if len(queues) > 1 or proof.out_of_scope else None))
    for line in describe_culprit_setups(searches):
        print(line)
    cores = Cores(args.jobs - len(jobs)) if split else None
    started = time.perf_counter()
    try:
        results = _run_all(jobs, machines, min(args.jobs, len(jobs)), cores)
    except PartKilled as exc:
        print(
            f"check: {exc}: nothing is proved (--no-split keeps each exploration in one "
            "process, and needs less memory)",
            file=sys.stderr,
        )
        return EXIT_FAIL
    culprits = [CulpritExplorer(s, max_states=args.max_states).run() for s in searches]
    elapsed = time.perf_counter() - started
    for job, result in zip(jobs, results, strict=True):
        print(_result_line(result, job.bounds.queue if len(queues) > 1 else ""))
    for search, found in zip(searches, culprits, strict=True):
        print(_culprit_line(found, search.bounds.queue if len(queues) > 1 else ""))
    for job, result in zip(jobs, results, strict=True):
        if result.counterexample:
            return _report(args, job.setup(machines), result)
    for search, found in zip(searches, culprits, strict=True):
        if found.counterexample:
            return _report_culprit(search, found)
    if not all(r.complete for r in results) or not all(r.complete for r in culprits):
        print(
            "incomplete: --max-states reached before the bounded space was exhausted; "
            "raise --max-states or lower the bounds",
        )
        return EXIT_FAIL
    for line in never_taken(machines, results):
        print(line)
    for line in raised_while_exploring(results):
        print(line)
    states = sum(r.states for r in results) + sum(r.states for r in culprits)
    transitions = sum(r.transitions for r in results) + sum(r.transitions for r in culprits)
    cpu = sum(r.cpu_seconds for r in results) + sum(r.cpu_seconds for r in culprits)
    print(
        f"ok: every invariant holds - {states} states, {transitions} transitions in "
        f"{elapsed:.1f} s ({rate(states, elapsed):.0f} states/s, cpu {cpu:.1f} s)"
    )
    return EXIT_OK


def _culprit_setups(
    args: argparse.Namespace, machines: ProcessMachines, store: StaticConfigStore, queues: list[str]
) -> list[CulpritSetup]:
    """One culprit exploration per queue and probe_slots value, when the policy declares
    culprit.yaml: the values given; else the queue's own (none when culprit finding is
    off there: nothing searches, so there is nothing to prove)."""
    if machines.culprit is None:
        return []
    setups: list[CulpritSetup] = []
    for queue in queues:
        bounds = CulpritBounds(
            commits=args.culprit_commits,
            max_flakes=args.max_flakes,
            max_crashes=args.max_crashes if args.crashes else 0,
            max_repeats=args.max_duplicates,
            queue=queue,
        )
        variant = Variant(bare_counter=args.bare_counter)
        first = CulpritSetup(machines, store, bounds, 0, variant, scopes_of(store))
        values = sorted(set(args.probe_slots)) if args.probe_slots else [first.param(PROBE_SLOTS)]
        setups += [replace(first, probe_slots=k) for k in values if k]  # 0: finding is off
    return setups


def describe_culprit_setups(setups: list[CulpritSetup]) -> list[str]:
    """The header lines of the culprit explorations: bounds, probe_slots, what is proved."""
    lines: list[str] = []
    queues = list(dict.fromkeys(s.bounds.queue for s in setups))
    for queue in queues:
        mine = [s for s in setups if s.bounds.queue == queue]
        slots = " ".join(str(s.probe_slots) for s in mine)
        lines.append(f"check culprit: {mine[0].bounds.describe()}; probe_slots {slots}")
        names = mine[0].rules().checks
        where = f" for {queue}" if len(queues) > 1 else ""
        lines.append(f"proves culprit{where}: {', '.join(names) if names else 'nothing'}")
    return lines


def _report_culprit(setup: CulpritSetup, result: CulpritResult) -> int:
    """Print the culprit exploration's counterexample: the broken property and the path."""
    counterexample = result.counterexample
    assert counterexample is not None
    _print_violation(counterexample.violation)
    trace = counterexample.trace
    print(
        f"culprit probe_slots={setup.probe_slots}; shortest trace ({len(trace)} steps) "
        f"from {setup.start()}:"
    )
    for number, move in enumerate(trace, 1):
        print(f"  {number:>3}  {move.describe()}")
    return EXIT_FAIL


def _bounds(args: argparse.Namespace, queue: str) -> Bounds:
    return Bounds(
        heads=args.heads,
        rewrite=args.rewrite,
        max_crashes=args.max_crashes if args.crashes else 0,
        max_duplicates=args.max_duplicates,
        max_dead_letters=args.max_dead_letters,
        max_outages=args.max_outages,
        max_attempts=args.max_attempts,
        queue=queue,
        max_overlaps=args.max_overlaps if args.overlaps else 0,
        stall_points=tuple(p for p in STALL_POINTS if p in args.stall_at),
        pauses=args.pauses,
        max_cancels=args.max_cancels,
        max_retries=args.max_retries,
    )


def _max_concurrent(args: argparse.Namespace, setup: Setup) -> list[int]:
    """The values explored: those given; else, for a queue named with ``--queue``, the
    one its config gives (no other value can occur on it); else 1 and 2."""
    if args.max_concurrent:
        return sorted(set(args.max_concurrent))
    if args.queue:
        return [int(setup.queue_config.param("max_concurrent"))]
    return list(DEFAULT_MAX_CONCURRENT)


def describe_proof(proof: Proof, queue: str | None = None) -> str:
    """The line saying what this run proves: the invariants the policy declares (for
    ``queue``: those declared for it, and which are not)."""
    where = f" for {queue}" if queue else ""
    left = ""
    if queue and proof.out_of_scope:
        left = f" (not declared for {queue}: {', '.join(proof.out_of_scope)})"
    if not proof.names:
        return (
            f"proves{where}: nothing - the machines declare no invariants"
            f"{' for it' if queue else ''} (docs/check.md); only that every step applies{left}"
        )
    return f"proves{where}: {', '.join(proof.names)}{left}"


#: How many distinct errors raised during a search are printed.
RAISED_SHOWN = 10


def raised_while_exploring(results: list[Result]) -> list[str]:
    """The errors deliveries raised anywhere in the search (a plugin that fails, a step
    that cannot run), each led by the YAML step that raised it: the invariants may all
    hold while a step fails and its delivery is retried, then dead-lettered."""
    raised = sorted(frozenset().union(*(r.raised for r in results)))
    lines = [f"raised while exploring: {error}" for error in raised[:RAISED_SHOWN]]
    if len(raised) > RAISED_SHOWN:
        lines.append(f"raised while exploring: ... and {len(raised) - RAISED_SHOWN} more")
    return lines


def never_taken(machines: ProcessMachines, results: list[Result]) -> list[str]:
    """A line for each transition of the delivery flow no exploration of the run took."""
    flow = machines.queue_gate
    taken = frozenset().union(*(r.taken for r in results))
    return [
        f"never taken: {describe_step(flow.spec.name, step)}"
        for step in tracker(flow).never_taken(taken)
    ]


def describe_setup(setup: Setup, machines: ProcessMachines) -> str:
    """The bounds of an exploration, and what its heads may change."""
    bounds = setup.bounds
    heads = " ".join(bounds.ingest_order())
    overlaps = (
        f", {bounds.max_overlaps} stalled delivery(ies) at {' '.join(bounds.stall_points)}"
        if bounds.max_overlaps
        else ""
    )
    if PAUSED in machines.parameters and bounds.pauses:
        overlaps += ", pause and resume"
    if machines.roles.withdrawn_states and bounds.max_cancels:
        overlaps += f", {bounds.max_cancels} operator cancel(s)"
    if bounds.max_retries:
        overlaps += f", {bounds.max_retries} operator retry(ies)"
    shown = (
        f"queue {bounds.queue}, heads {heads}; per path at most {bounds.max_crashes} crash(es), "
        f"{bounds.max_duplicates} duplicate(s), {bounds.max_dead_letters} dead-letter(s), "
        f"{bounds.max_outages} source-control outage(s){overlaps}; "
        f"max_attempts {bounds.max_attempts}"
    )
    classes = setup.path_classes()
    if classes:
        shown += "; heads change " + ", ".join(f"{c.name} ({' '.join(c.paths)})" for c in classes)
    return shown


def _run_all(
    jobs: list[Job], machines: ProcessMachines, workers: int, cores: Cores | None = None
) -> list[Result]:
    if workers <= 1:
        _share(cores)
        try:
            return [run_job(job, machines) for job in jobs]
        finally:
            _share(None)
    context = multiprocessing.get_context("fork" if sys.platform != "win32" else "spawn")
    with context.Pool(workers, initializer=_share, initargs=(cores,)) as pool:
        return pool.map(run_job, jobs, chunksize=1)


def _verdict(result: Result | CulpritResult) -> str:
    """How a result line opens: ok, the broken invariant, or incomplete."""
    if result.counterexample:
        return f"VIOLATED {result.counterexample.violation.invariant}"
    return "ok" if result.complete else "INCOMPLETE"


def _culprit_line(found: CulpritResult, queue: str = "") -> str:
    where = f"{queue} " if queue else ""
    return (
        f"  {where}culprit probe_slots={found.probe_slots}: {_verdict(found)} - {found.states} "
        f"states ({found.named} named, {found.unresolved} unresolved), {found.transitions} "
        f"transitions, depth {found.depth}, {found.seconds:.1f} s, "
        f"{rate(found.states, found.seconds):.0f} states/s, cpu {found.cpu_seconds:.1f} s"
    )


def _result_line(result: Result, queue: str = "") -> str:
    how = ""
    if result.processes > 1:
        how = ", split over 2 processes"
    elif result.searched_again:
        how = ", searched again unsplit for the shortest counterexample"
    where = f"{queue} " if queue else ""
    return (
        f"  {where}max_concurrent={result.max_concurrent}: {_verdict(result)} - "
        f"{result.states} states ({result.covered} covered), {result.transitions} transitions, "
        f"depth {result.depth}, {result.seconds:.1f} s, "
        f"{rate(result.states, result.seconds):.0f} states/s, cpu {result.cpu_seconds:.1f} s{how}"
    )


def replay_command(args: argparse.Namespace, out: str) -> str:
    """The command that re-runs the written counterexample with the same machinery."""
    where = []
    if args.machines != DEFAULT_MACHINES:
        where += ["--machines", args.machines]
    if args.config != DEFAULT_CONFIG:
        where += ["--config", args.config]
    if args.lint and not args.bare_counter:
        return " ".join(["stovepipe-fsm", "simulate", out, *where])
    flags = [*where, *([] if args.lint else ["--no-lint"])]
    flags += ["--bare-counter"] if args.bare_counter else []
    return " ".join(["stovepipe-fsm", "check", "--replay", out, *flags])


def _report(args: argparse.Namespace, setup: Setup, result: Result) -> int:
    counterexample = result.counterexample
    assert counterexample is not None
    violation = counterexample.violation
    timeline = as_timeline(setup, counterexample)
    confirmed = replay(
        timeline,
        setup.machines,
        setup.config,
        variant=setup.variant,
        catalog=setup.catalog,
        scopes=setup.scopes,
    )
    _print_violation(violation)
    print(f"max_concurrent={setup.max_concurrent}; shortest trace ({len(timeline.steps)} steps):")
    notes = step_notes(confirmed, len(timeline.steps))
    _print_trace(confirmed, notes)
    command = replay_command(args, args.out)
    path = write_counterexample(args.out, setup, counterexample, command, notes)
    print(f"wrote {path}")
    print(f"replay: {command}")
    if confirmed.violation is None or confirmed.violation.invariant != violation.invariant:
        print(
            "warning: replaying the trace did not break the same invariant "
            f"(replay found {confirmed.violation.invariant if confirmed.violation else 'none'})",
            file=sys.stderr,
        )
    return EXIT_FAIL


def _print_violation(violation: Violation) -> None:
    print()
    print(f"invariant {violation.invariant}: {violation.summary}")
    print(f"  {violation.detail}")


def _print_trace(result: Replay, notes: list[str]) -> None:
    described: dict[int, str] = {row.step: row.action for row in result.rows}
    for number in range(1, len(notes) + 1):
        action = described.get(number, "")
        print(f"  {number:>3}  {action:<34} {notes[number - 1]}")


def _replay(
    args: argparse.Namespace, machines: ProcessMachines, variant: Variant, proof: Proof
) -> int:
    timeline = load_timeline(args.replay)
    store = load_policy_store(args.config, machines.parameters)
    result = replay(timeline, machines, store, variant=variant, scopes=scopes_of(store))
    print(render_table(result.simulation()))
    print()
    if result.violation is None:
        finish = " and the work can finish" if proof.progress else ""
        print(f"{Path(args.replay)}: every invariant holds{finish}")
        return EXIT_OK
    where = f"after step {result.step}" if result.step else "in the initial state"
    print(f"{Path(args.replay)}: {where}, invariant {result.violation.invariant} is broken")
    print(f"  {result.violation.summary}")
    print(f"  {result.violation.detail}")
    return EXIT_FAIL

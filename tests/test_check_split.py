"""One exploration split over two processes: the same verdicts as the unsplit search,
the shortest counterexample, and a second process that fails loudly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from check_mutants.mutants import write_mutant
from check_mutants.speculative import BASE as SPECULATIVE
from check_mutants.speculative import CONFIG as SPECULATIVE_CONFIG
from check_mutants.speculative import write_mutant as write_speculative_mutant
from fixture_policy import CONFIG

from stovepipe_fsm.apps.check import actions
from stovepipe_fsm.apps.check import command as command_module
from stovepipe_fsm.apps.check import explorer as explorer_module
from stovepipe_fsm.apps.check import split as split_module
from stovepipe_fsm.apps.check.explorer import Explorer, Setup, Tuning
from stovepipe_fsm.apps.check.model import Bounds
from stovepipe_fsm.apps.check.split import Cores, Fork, PartFailed, PartKilled, cut, tails
from stovepipe_fsm.apps.check.variants import Variant
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.process.catalog import ProcessMachines, load_process_machines
from stovepipe_fsm.simulation.world import World

ROOT = Path(__file__).resolve().parent.parent
#: Small enough to fork within a second or two of search at two heads.
EARLY = 100


@pytest.fixture(scope="module")
def machines() -> ProcessMachines:
    return load_process_machines(ROOT / "machines")


def setup_for(machines: ProcessMachines, k: int, variant: Variant | None = None, **bounds):  # type: ignore[no-untyped-def]
    store = load_policy_store(str(ROOT / "config" / "queues.yaml"))
    return Setup(machines, store, Bounds(**bounds), k, variant or Variant())


@pytest.mark.slow  # the same exploration, split and unsplit
def test_a_split_search_passes_where_the_unsplit_one_does(machines: ProcessMachines) -> None:
    """The shipped policy's progress and lease passes run over both processes' edges:
    had either process's fair edges been lost at the join, states known at the fork
    would be left unfinished, and the run would search again unsplit."""
    setup = setup_for(machines, 2, heads=2)
    assert setup.rules().proof.progress and setup.rules().proof.lease_bounds_stall
    unsplit = Explorer(setup).run()
    split = Explorer(setup, Tuning(split_at=EARLY)).run()
    assert unsplit.ok and unsplit.processes == 1
    assert split.ok and split.processes == 2 and not split.searched_again
    # A state both processes reach is explored by each: never fewer states.
    assert split.states >= unsplit.states and split.transitions >= unsplit.transitions


@pytest.mark.slow  # explorations in child processes
def test_the_join_is_what_lets_the_passes_finish(
    machines: ProcessMachines, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the second process's fair edges into the states known at the fork, the
    progress pass finds states it cannot finish: the guard above can fail."""
    monkeypatch.setattr(explorer_module, "tails", lambda into, lengths: {})
    result = Explorer(setup_for(machines, 2, heads=2), Tuning(split_at=EARLY)).run()
    assert result.searched_again and result.ok  # the unsplit search found no violation


@pytest.mark.parametrize(
    ("variant", "bounds", "invariant"),
    [
        (Variant(bare_counter=True), {"heads": 2}, "idle_counter_exact"),
        (Variant(bare_counter=True), {"heads": 2, "max_dead_letters": 0}, "progress"),
    ],
)
def test_a_split_search_reports_the_unsplit_shortest_counterexample(
    machines: ProcessMachines, variant: Variant, bounds: dict[str, int], invariant: str
) -> None:
    setup = setup_for(machines, 1, variant, **bounds)
    unsplit = Explorer(setup).run()
    split = Explorer(setup, Tuning(split_at=10)).run()
    assert unsplit.counterexample is not None
    assert unsplit.counterexample.violation.invariant == invariant
    assert split.searched_again and split.processes == 1
    assert split.counterexample == unsplit.counterexample
    assert (split.states, split.transitions) == (unsplit.states, unsplit.transitions)


@pytest.mark.parametrize("name", ["no_coalesce", "no_gate", "terminal_holds_slot"])
def test_a_split_search_catches_each_mutant_as_the_unsplit_one_does(
    name: str, tmp_path: Path
) -> None:
    """Forked at once (two states waiting), the mutants' violations are found after the
    fork, and what is reported is the unsplit search's counterexample."""
    mutant = load_process_machines(write_mutant(name, tmp_path / name), lint=False)
    setup = Setup(mutant, load_policy_store(str(CONFIG)), Bounds(heads=2), 1, Variant())
    unsplit, split = Explorer(setup).run(), Explorer(setup, Tuning(split_at=2)).run()
    assert unsplit.counterexample is not None
    assert split.searched_again and split.counterexample == unsplit.counterexample


def test_the_lease_pass_runs_over_both_processes(tmp_path: Path) -> None:
    """With slot leases configured, the lease pass (no build ever reports) runs over the
    stall edges of both processes: clean on the speculative policy, and a mutant that
    ignores expiry breaks it as the unsplit search does."""
    leases = SPECULATIVE_CONFIG.parent / "leases.yaml"
    bounds = Bounds(
        heads=2, rewrite=False, max_crashes=0, max_duplicates=0, max_dead_letters=0,
        max_outages=0, pauses=False,
    )  # fmt: skip
    shipped = load_process_machines(SPECULATIVE)
    setup = Setup(shipped, load_policy_store(str(leases), shipped.parameters), bounds, 1)
    assert setup.rules().max_validation_ms > 0  # the lease pass runs
    clean = Explorer(setup, Tuning(split_at=10)).run()
    assert clean.ok and clean.processes == 2 and not clean.searched_again
    expiry_ignored = write_speculative_mutant("expiry_ignored", tmp_path / "expiry_ignored")
    mutant = load_process_machines(expiry_ignored, lint=False)
    broken = Setup(mutant, load_policy_store(str(leases), mutant.parameters), bounds, 1)
    unsplit, split = Explorer(broken).run(), Explorer(broken, Tuning(split_at=10)).run()
    assert unsplit.counterexample is not None
    assert unsplit.counterexample.violation.invariant == "lease_bounds_stall"
    assert split.searched_again and split.counterexample == unsplit.counterexample


def test_a_state_limit_ends_both_processes_incomplete(machines: ProcessMachines) -> None:
    tuning = Tuning(split_at=EARLY, max_states=2_000)
    result = Explorer(setup_for(machines, 2, heads=2), tuning).run()
    assert not result.complete and result.processes == 2 and not result.searched_again
    assert result.states <= 2 * 2_000


def test_an_abandoned_search_ends_incomplete(machines: ProcessMachines) -> None:
    asked: list[bool] = []

    def gone() -> bool:
        asked.append(True)
        return len(asked) > 5  # the caller is gone after five states

    result = Explorer(setup_for(machines, 1, heads=2), abandoned=gone).run()
    assert not result.complete and result.states < 100 and len(asked) == 6


def test_an_exploration_forks_only_onto_an_idle_core(machines: ProcessMachines) -> None:
    setup = setup_for(machines, 1, heads=1, rewrite=False)
    busy = Cores(0)
    assert Explorer(setup, Tuning(split_at=10), cores=busy).run().processes == 1
    assert busy.idle == 0
    idle = Cores(1)
    assert Explorer(setup, Tuning(split_at=10), cores=idle).run().processes == 2
    assert idle.idle == 1  # given back once the second process ended


def _in_the_second_process(effect: Callable[[], None]) -> Callable[..., World | None]:
    """``perform``, with ``effect`` run first in any process but this one."""
    first, perform = os.getpid(), actions.perform

    def performing(*args: Any, **kwargs: Any) -> World | None:
        if os.getpid() != first:
            effect()
        return perform(*args, **kwargs)

    return performing


def test_an_error_in_the_second_process_is_raised_in_the_first(
    machines: ProcessMachines, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail() -> None:
        raise RuntimeError("a fault planted in the second process")

    monkeypatch.setattr(explorer_module, "perform", _in_the_second_process(fail))
    with pytest.raises(PartFailed, match="a fault planted in the second process"):
        Explorer(setup_for(machines, 1, heads=1, rewrite=False), Tuning(split_at=10)).run()


def test_a_second_process_killed_is_reported(
    machines: ProcessMachines, monkeypatch: pytest.MonkeyPatch
) -> None:
    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(explorer_module, "perform", _in_the_second_process(die))
    with pytest.raises(PartKilled, match="ended without a report \\(killed by signal 9\\)"):
        Explorer(setup_for(machines, 1, heads=1, rewrite=False), Tuning(split_at=10)).run()


def test_check_says_a_killed_second_process_proved_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(command_module, "SPLIT_FRONTIER", 10)
    monkeypatch.setattr(explorer_module, "perform", _in_the_second_process(die))
    small = ["--heads", "1", "--no-rewrite", "--max-concurrent", "1", "--quiet"]
    assert main(["check", *small, "--jobs", "2"]) == 1
    _, err = capsys.readouterr()
    assert "killed by signal 9): nothing is proved (--no-split keeps" in err, err


def test_a_split_search_tells_no_edge_hook(machines: ProcessMachines) -> None:
    with pytest.raises(ValueError, match="its edges are in two processes"):
        Explorer(setup_for(machines, 1), Tuning(split_at=10), on_edge=lambda src, dst: None)


ORPHANED = """
import os, signal, sys
from pathlib import Path
from stovepipe_fsm.apps.check import split
from stovepipe_fsm.apps.check.explorer import Explorer, Setup, Tuning
from stovepipe_fsm.apps.check.model import Bounds
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.process.catalog import load_process_machines

root, pid_file = Path(sys.argv[1]), Path(sys.argv[2])
start = split.Fork.start

def start_then_die(fork):
    start(fork)
    if not fork.in_child:  # the first process is killed right after the fork
        pid_file.write_text(str(fork.pid))
        os.kill(os.getpid(), signal.SIGKILL)

split.Fork.start = start_then_die
machines = load_process_machines(root / "machines")
store = load_policy_store(str(root / "config" / "queues.yaml"))
Explorer(Setup(machines, store, Bounds(), 2), Tuning(split_at=100)).run()
"""


def _gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie no one has reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_the_second_process_stops_when_the_first_is_killed(tmp_path: Path) -> None:
    """Killed, the first process leaves no explorer behind: the second, which would
    otherwise explore its part of the default bounds for most of a minute, notices
    within a state that the process that forked is gone, and ends."""
    pid_file = tmp_path / "second.pid"
    first = subprocess.run(
        [sys.executable, "-c", ORPHANED, str(ROOT), str(pid_file)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    assert first.returncode == -signal.SIGKILL
    second = int(pid_file.read_text())
    deadline = time.monotonic() + 10.0
    while not _gone(second) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(second), f"the second process {second} went on exploring alone"


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (read from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


CHECK_MAIN = "import sys; from stovepipe_fsm.apps.cli import main; sys.exit(main())"


def test_explorations_stop_when_check_is_killed() -> None:
    """Killed outright, ``check`` leaves no pool worker exploring: each notices within a
    state that the command is gone, and ends (at default bounds they would explore on
    for most of a minute)."""
    command = subprocess.Popen(
        [sys.executable, "-c", CHECK_MAIN, "check", "--quiet", "--jobs", "2"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60.0
        while len(workers := _children(command.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(workers) == 2, "check started no pool of two explorations"
        time.sleep(2.0)  # both exploring
    finally:
        command.kill()
        command.wait()
    deadline = time.monotonic() + 10.0
    while not all(_gone(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(pid) for pid in workers), f"explorations {workers} went on alone"


def test_the_frontier_is_cut_into_runs_of_its_order() -> None:
    assert cut(list(range(10)), 4) == [[0, 1], [2, 3, 4], [5, 6], [7, 8, 9]]
    assert cut([1, 2], 4) == [[], [1], [], [2]]
    assert [x for piece in cut(list(range(97)), 8) for x in piece] == list(range(97))


def test_tails_are_the_entries_added_since_the_fork() -> None:
    into = [[1, 2, 5], [], [3], [4]]
    assert tails(into, [2, 0, 1]) == {0: [5]}  # list 3 came after the fork: not a tail


def test_each_piece_is_claimed_once() -> None:
    fork = Fork(3)
    assert [fork.claim(), fork.claim(), fork.claim(), fork.claim()] == [0, 1, 2, None]
    before = fork.halted
    fork.halt()
    assert (before, fork.halted) == (False, True)
    with pytest.raises(ValueError, match=r"pieces must be 1\.\.255"):
        Fork(256)


@pytest.mark.slow  # explorations in child processes
def test_check_splits_only_with_a_second_job(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(command_module, "SPLIT_FRONTIER", EARLY)
    small = ["check", "--heads", "2", "--max-concurrent", "2", "--quiet"]
    outputs = {}
    runs = {"two": ["--jobs", "2"], "one": ["--jobs", "1"], "off": ["--jobs", "2", "--no-split"]}
    for name, extra in runs.items():
        capsys.readouterr()
        assert main([*small, *extra]) == 0
        outputs[name] = capsys.readouterr().out
    assert re.search(r"^  max_concurrent=2: ok - .*, split over 2 processes$", outputs["two"], re.M)
    assert "split over" not in outputs["one"] and "split over" not in outputs["off"]
    assert split_module.can_fork()

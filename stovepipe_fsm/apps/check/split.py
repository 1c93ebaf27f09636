"""Two processes share one exploration: forked once a core is idle, each claims pieces
of the frontier as it stood and explores what they reach.

Why a fork and pieces: both processes inherit the search as it stands (its states,
live worlds and known outcomes), with nothing sent. After the fork nothing is shared
but the claims: the frontier is cut into :data:`PIECES` runs of breadth-first order,
and whichever process is free takes the next one, so neither waits on a part that
turned out larger than the other. A state both processes reach is explored by each.
Neither process's search is breadth-first over the whole space any more, so a split
run that finds a violation searches again unsplit, for the shortest counterexample.

What comes back from the forked process (:class:`PartReport`) is what the progress and
lease passes need: the fair edges it found, by state id, and which of its states are
quiescent. The claims travel as single bytes through a pipe (a read of one byte is
atomic, and end of file means every piece is taken), the report as one pickle through
another, and a shared byte tells the other process to stop once one has found a
violation or run out of states.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

#: Runs of breadth-first order the frontier is cut into at the fork (at most 255: a
#: claim is one byte).
PIECES = 8


@dataclass(frozen=True)
class PartReport:
    """What the forked process found after the fork, for the joined passes.

    State ids below ``known`` (the states at the fork) mean the same in both processes;
    the forked process's own states are numbered from ``known`` on."""

    known: int
    states: int  # states it added
    transitions: int
    attempts: int
    covered: int
    depth: int
    complete: bool
    violated: bool
    cpu_seconds: float
    quiescent: bytes  # one flag per state it added
    #: For each finishing pass: the fair edges into each state it added, by source, and
    #: those it found into states known at the fork.
    into: list[list[list[int]]]
    tails: list[dict[int, list[int]]]
    taken: frozenset[int] = frozenset()  # the flow transitions it fired (``.coverage``)
    raised: frozenset[str] = frozenset()  # the errors its deliveries raised


class Cores:
    """The cores no process of a ``check`` run is exploring on, shared by its processes:
    an exploration forks only onto an idle core, so a split never slows the explorations
    beside it, and forks where the rest of its search is smaller.

    Starts at the cores given minus the explorations; each exploration that ends gives
    its core back (:meth:`give`), and a fork takes one while its second process runs."""

    def __init__(self, idle: int) -> None:
        self._idle = multiprocessing.get_context("fork").Value("i", idle)

    def take(self) -> bool:
        """Take an idle core, if there is one (asked at every state: a read without the
        lock first, which only ever misses a core that is being given back)."""
        if self._idle.get_obj().value <= 0:
            return False
        with self._idle.get_lock():
            if self._idle.value > 0:
                self._idle.value -= 1
                return True
            return False

    def give(self) -> None:
        with self._idle.get_lock():
            self._idle.value += 1

    @property
    def idle(self) -> int:
        return int(self._idle.value)


class PartFailed(RuntimeError):
    """The forked process raised: a bug, reported as the error it raised."""


class PartKilled(PartFailed):
    """The forked process ended without a report (killed, say for want of memory)."""


class Fork:
    """One split of an exploration into two processes (create, then :meth:`start`)."""

    def __init__(self, pieces: int) -> None:
        if not 1 <= pieces <= 255:
            raise ValueError(f"pieces must be 1..255, got {pieces}")
        self._claims_read, claims_write = os.pipe()
        os.write(claims_write, bytes(range(pieces)))
        os.close(claims_write)  # end of file once every piece is claimed
        self._stop = mmap.mmap(-1, 1)  # anonymous and shared: both processes see it
        self._report_read, self._report_write = os.pipe()
        self.pid = 0  # the forked process, in the process that forked
        self.in_child = False
        self._first = 0  # the process that forked

    def start(self) -> None:
        """Fork; afterwards :attr:`in_child` tells which process this is."""
        sys.stdout.flush()
        sys.stderr.flush()
        self._first = os.getpid()
        pid = os.fork()
        if pid == 0:
            self.in_child = True
            os.close(self._report_read)
        else:
            self.pid = pid
            os.close(self._report_write)

    def claim(self) -> int | None:
        """The next unclaimed piece, or ``None`` when none is left."""
        taken = os.read(self._claims_read, 1)
        return taken[0] if taken else None

    def halt(self) -> None:
        """Tell the other process to stop: its part no longer changes the outcome."""
        self._stop[0] = 1

    @property
    def halted(self) -> bool:
        """Told to stop; in the forked process, also once the process that forked is
        gone (killed, say): no one would read its report, so it must not explore on."""
        if self._stop[0] == 1:
            return True
        return self.in_child and os.getppid() != self._first

    # --- the forked process -------------------------------------------------------

    def finish(self, report: PartReport) -> None:
        """Send ``report`` and end the forked process (never returns)."""
        self._end(b"R" + pickle.dumps(report, protocol=pickle.HIGHEST_PROTOCOL), 0)

    def fail(self) -> None:
        """Send the error being handled and end the forked process (never returns)."""
        self._end(b"E" + traceback.format_exc().encode(), 1)

    def _end(self, payload: bytes, status: int) -> None:
        try:
            with os.fdopen(self._report_write, "wb") as out:
                out.write(payload)
        finally:
            os._exit(status)  # never back into the caller's stack, nor its exit handlers

    # --- the process that forked --------------------------------------------------

    def abandon(self) -> None:
        """The process that forked failed: end the forked one rather than leave it
        exploring, or blocked writing a report no one reads."""
        self.halt()
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self._report_read)
        os.close(self._claims_read)

    def receive(self) -> PartReport:
        """The forked process's report, once it has ended."""
        with os.fdopen(self._report_read, "rb") as incoming:
            payload = incoming.read()
        _, status = os.waitpid(self.pid, 0)
        os.close(self._claims_read)
        if payload[:1] == b"R":
            report = pickle.loads(payload[1:])
            assert isinstance(report, PartReport)
            return report
        if payload[:1] == b"E":
            error = payload[1:].decode().rstrip().splitlines()[-1]
            raise PartFailed(f"the second process of a split exploration failed: {error}")
        raise PartKilled(
            f"the second process of a split exploration ended without a report ({_how(status)})"
        )


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def cut(frontier: Sequence[T], pieces: int) -> list[list[T]]:
    """``frontier`` in ``pieces`` runs of its order, as even as whole states allow."""
    size = len(frontier)
    return [list(frontier[i * size // pieces : (i + 1) * size // pieces]) for i in range(pieces)]


def tails(into: Sequence[list[int]], lengths: Sequence[int]) -> dict[int, list[int]]:
    """The entries added to the first ``len(lengths)`` lists of ``into`` since they had
    ``lengths``: what a process found into the states known at the fork."""
    return {
        sid: into[sid][length:] for sid, length in enumerate(lengths) if len(into[sid]) > length
    }


def can_fork() -> bool:
    """Whether this platform forks (the split needs the search inherited, not rebuilt)."""
    return hasattr(os, "fork")

"""Both replays of ``whatif`` at once, the second in a forked process, where that helps.

The two replays share nothing but the timeline. On a machine with two cores or more, for
a timeline long enough to be worth a process, the second replay runs in a child forked
after the timeline is loaded (it inherits the timeline and the policy paths; nothing is
sent to it) and sends back its :class:`~.compare.RunSummary`, plain data, while this
process replays the first. Otherwise (one core, no ``fork``, a short timeline) both run
here, one after the other. The summaries are the same either way, and so is the output;
so are the errors: a located input error of the second replay is raised here as the
same :class:`SpecError`, and a child that fails any other way has its replay run again
here, where its exception is raised as it would have been.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection

from ...located.errors import SpecError
from .compare import RunSummary

#: Below this many timeline steps both replays take well under a second: no fork.
PARALLEL_FROM_STEPS = 20_000

Replay = Callable[[], RunSummary]


def can_fork() -> bool:
    """Whether a second core and ``fork`` are there to run a replay beside this one."""
    return (os.cpu_count() or 1) > 1 and "fork" in multiprocessing.get_all_start_methods()


def replay_both(first: Replay, second: Replay, *, parallel: bool) -> tuple[RunSummary, RunSummary]:
    """``(first(), second())``, the two side by side when ``parallel``."""
    if not parallel:
        return first(), second()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # or the child would write out what is buffered here a second time
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_replay_in_child, args=(second, send), daemon=True)
    child.start()
    send.close()
    try:
        mine = first()
    except BaseException:
        child.kill()
        child.join()
        raise
    try:
        kind, payload = receive.recv()
    except EOFError:
        kind, payload = "lost", None
    finally:
        receive.close()
        child.join()
    if kind == "ok":
        assert isinstance(payload, RunSummary)
        return mine, payload
    if kind == "invalid":
        raise SpecError(payload)
    return mine, second()


def _replay_in_child(replay: Replay, send: Connection) -> None:
    result: tuple[str, object]
    try:
        result = ("ok", replay())
    except SpecError as exc:
        result = ("invalid", list(exc.issues))
    except Exception:  # run again in the parent, which raises it as it would have
        result = ("failed", None)
    send.send(result)
    send.close()

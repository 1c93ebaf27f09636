"""What an operator command takes from the request machine in force.

A running service records the policy in force in the broker (its policy record); a
command takes the request machine's initial and terminal states from that record, and
only where no service has recorded one yet (a deployment's first ingest may precede its
first service start) from the machines directory it was pointed at. A state name is
never written in code.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..domain.errors import StovepipeError
from ..located.errors import SpecError
from ..process.catalog import ProcessMachines, load_process_machines


class PolicyUnavailable(StovepipeError):
    """No policy in force is recorded and the fallback machine files do not load."""


def initial_state(recorded: str, machines_dir: str) -> str:
    """The request machine's initial state: ``recorded`` (the policy record's, ``""``
    when none), else that of the machines under ``machines_dir``."""
    return recorded or _fallback(machines_dir).roles.initial


def terminal_states(recorded: Sequence[str], machines_dir: str) -> frozenset[str]:
    """The request machine's terminal states: ``recorded`` (the policy record's, empty
    when none), else those of the machines under ``machines_dir``."""
    if recorded:
        return frozenset(recorded)
    return _fallback(machines_dir).request.terminal


def _fallback(machines_dir: str) -> ProcessMachines:
    try:
        return load_process_machines(machines_dir)
    except (OSError, SpecError, StovepipeError, ValueError) as exc:
        raise PolicyUnavailable(
            "no service has recorded the policy in force on this broker yet, so the "
            f"request machine is read from {machines_dir!r}, which does not load: {exc}"
        ) from None

"""Python function calls per decision: a figure of the machine layer that load and noise
on the machine do not move.

Each implementation runs one path under ``cProfile``; the calls a run of the same timer
makes around a handle that only acks (the per-decision setup, the coroutine driving)
are subtracted, and the rest divided by the decisions. Calls are not time (a call into
C is cheap, a generator resume is not), so they explain a timed ratio rather than
replace it.
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stovepipe_fsm.adapters.memory import MemoryDelivery
from stovepipe_fsm.domain.settle import Attempt

Timer = Callable[[Any, Any, int], float]
Maker = Callable[[Any, Path], Any]


async def _ack_only(delivery: MemoryDelivery) -> Attempt:
    return Attempt.acked()


def _counted(
    make_ports: Callable[[], Any], make: Maker, machines_dir: Path, timer: Timer, n: int
) -> int:
    warm = make_ports()
    timer(warm, make(warm, machines_dir), min(n, 50))
    ports = make_ports()
    handle = make(ports, machines_dir)
    profile = cProfile.Profile()
    profile.enable()
    try:
        timer(ports, handle, n)
    finally:
        profile.disable()
    stats: dict[Any, tuple[Any, ...]] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return sum(entry[1] for entry in stats.values())


def calls_per_decision(
    make_ports: Callable[[], Any],
    makers: dict[str, Maker],
    machines_dir: Path,
    timer: Timer,
    n: int,
) -> dict[str, float]:
    """Calls per decision of each implementation on ``timer``'s path."""
    setup = _counted(make_ports, lambda _ports, _dir: _ack_only, machines_dir, timer, n)
    return {
        label: (_counted(make_ports, make, machines_dir, timer, n) - setup) / n
        for label, make in makers.items()
    }

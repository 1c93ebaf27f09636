"""The cyclic garbage collector's pace for long in-memory runs (replays, ``check``).

A replay of a large timeline, or a model-check search, allocates millions of objects
that live to the end of the run (rows, records, observed states) and creates few cycles
(a crash's traceback). At the collector's default pace (a young collection every 700
allocations, the older generations re-scanned as they grow) much of such a run goes to
re-scanning objects that are still alive. :func:`rare_collections` lets
the allocations pile up further between collections; :func:`settled_heap` also moves
what exists now (a loaded timeline, the compiled machines) out of the collector's sight,
which also keeps a forked child from copying every page it merely scans.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: Collector thresholds during a long run (allocations before a young collection, ...).
RARE_COLLECTIONS = (100_000, 20, 100)


@contextmanager
def rare_collections() -> Iterator[None]:
    """Collect cycles rarely inside the block; the previous thresholds come back after."""
    previous = gc.get_threshold()
    gc.set_threshold(*RARE_COLLECTIONS)
    try:
        yield
    finally:
        gc.set_threshold(*previous)


@contextmanager
def settled_heap() -> Iterator[None]:
    """:func:`rare_collections`, with every object alive on entry frozen (``gc.freeze``)
    for the block: what was loaded before a run is neither scanned during it nor, in a
    process forked inside the block, copied by a scan. Unfrozen on exit.

    A program that froze objects itself keeps them frozen: the collector can only unfreeze
    everything at once, so then nothing is frozen or unfrozen here (the block still
    collects rarely).
    """
    ours = gc.get_freeze_count() == 0
    if ours:
        gc.freeze()
    try:
        with rare_collections():
            yield
    finally:
        if ours:
            gc.unfreeze()

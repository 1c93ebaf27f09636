"""The collector's pace for long runs: set inside the block, restored after it, and the
heap alive on entry frozen only for the block (simulation/collector.py)."""

from __future__ import annotations

import gc

import pytest

from stovepipe_fsm.simulation.collector import RARE_COLLECTIONS, rare_collections, settled_heap


def test_rare_collections_sets_the_long_run_thresholds_and_restores_the_previous_ones() -> None:
    before = gc.get_threshold()
    with rare_collections():
        assert gc.get_threshold() == RARE_COLLECTIONS
    assert gc.get_threshold() == before


def test_settled_heap_freezes_what_exists_on_entry_and_unfreezes_it_on_exit() -> None:
    assert gc.get_freeze_count() == 0
    loaded = [object() for _ in range(1_000)]  # what a run loads before it starts
    with settled_heap():
        assert gc.get_freeze_count() >= len(loaded)
        assert gc.get_threshold() == RARE_COLLECTIONS
    assert gc.get_freeze_count() == 0


def test_settled_heap_restores_the_collector_when_the_run_raises() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError, match="step failed"), settled_heap():
        raise RuntimeError("step failed")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_cycles_made_inside_a_settled_heap_are_still_collected() -> None:
    class Node:
        other: object = None

    with settled_heap():
        a, b = Node(), Node()
        a.other, b.other = b, a
        del a, b
        assert gc.collect() >= 2


def test_settled_heap_leaves_a_programs_own_frozen_objects_frozen() -> None:
    """An embedding program that froze its heap keeps it frozen after a run."""
    kept = [[n] for n in range(1_000)]  # tracked containers, so the freeze counts them
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)
        with settled_heap():
            assert gc.get_freeze_count() == frozen
            assert gc.get_threshold() == RARE_COLLECTIONS
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0

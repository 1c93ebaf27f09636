"""The figures of one replay (``apps/whatif/figures.py``): wasted speculative builds,
slot-hours and skipped heads, computed from one timed run."""

from __future__ import annotations

from pathlib import Path

import yaml

from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.apps.whatif.figures import TOTAL, figures_by_queue
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.timed import replay_timed
from stovepipe_fsm.simulation.timeline import load_timeline

ROOT = Path(__file__).resolve().parent.parent
HOUR = 3_600_000


def test_a_speculative_build_overtaken_by_a_newer_green_is_wasted(tmp_path: Path) -> None:
    # Two slots. A builds; B is admitted beside it (speculative); A goes green; C is
    # admitted beside B and goes green an hour later; B's verdict comes after C's.
    steps = [
        {"ingest": "A"}, "run", {"ingest": "B"}, "run",
        {"advance_ms": HOUR}, {"complete": {"uri": "A", "outcome": "succeeded"}}, "run",
        {"ingest": "C"}, "run",
        {"advance_ms": HOUR}, {"complete": {"uri": "C", "outcome": "succeeded"}},
        {"advance_ms": HOUR}, {"complete": {"uri": "B", "outcome": "failed"}},
    ]  # fmt: skip
    doc = {
        "config": {"max_concurrent": 2},
        "history": {"A": [], "B": ["A"], "C": ["B"]},
        "steps": steps,
    }
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    machines = load_process_machines(str(ROOT / "machines"))
    config = load_policy_store(str(ROOT / "config/queues.yaml"), machines.parameters)
    run = replay_timed(load_timeline(path), machines, config)
    figures = figures_by_queue(run)[TOTAL].as_json()
    assert figures["builds"] == {"full": 2, "incremental": 1, "skipped": 0}
    assert figures["wasted_speculative_builds"] == 1  # B; C was speculative but decided
    assert figures["slot_hours"] == 5.0  # A 1 h, B 3 h, C 1 h

"""The YAML machines drive the process stage: edit the file, the behaviour changes.

Each test copies the tests' own machines (``tests/fixtures/machines``, which began as
the shipped ones), makes one edit, compiles it with ``load_process_machines(dir,
lint=False)`` (lint would rightly refuse some of these) and replays the same scenario on
both. If the controller branched around the machine, the
edited copy would behave like the unedited one and these tests would fail.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fixture_policy import MACHINES

from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.domain.entities import QueueConfig
from stovepipe_fsm.located.errors import SpecError
from stovepipe_fsm.process.catalog import ProcessMachines, load_process_machines
from stovepipe_fsm.simulation.world import World

Q = "monorepo/main"

STALE_TRANSITION = """\
  - trigger: coalesce
    source: queue_loaded
    dest: acked
    conditions: newer_head_exists
    unless: paused
    after: [supersede, ack]
    description: stale - superseded on sight, no slot consumed
"""


def edited(tmp_path: Path, file: str, *edits: tuple[str, str]) -> Path:
    """A copy of the fixture machines with ``old -> new`` applied to ``file``."""
    target = tmp_path / "machines"
    shutil.copytree(MACHINES, target)
    path = target / file
    text = path.read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"edit anchor not found once in {file}: {old!r}"
        text = text.replace(old, new)
    path.write_text(text)
    return target


def world(machines: ProcessMachines, max_concurrent: int = 1) -> World:
    config = StaticConfigStore(QueueConfig.of(max_concurrent=max_concurrent, gate_wait_delay_ms=10))
    return World(machines, config, {"A": [], "B": ["A"]})


def drain(w: World) -> None:
    while w.deliver_next() is not None:
        pass


def states(w: World) -> list[str]:
    return [r.state for r in w.requests.snapshot()]


def backlog_of_two(machines: ProcessMachines) -> World:
    w = world(machines)
    w.ingest(Q, "A")
    w.ingest(Q, "B")
    drain(w)
    return w


def test_unedited_machine_supersedes_the_stale_head() -> None:
    w = backlog_of_two(load_process_machines(MACHINES))
    assert states(w) == ["superseded", "processing"]
    assert [p.request_id for p in w.published.builds()] == [f"request/{Q}/2"]


def test_without_the_coalesce_step_a_stale_head_is_admitted(tmp_path: Path) -> None:
    directory = edited(
        tmp_path,
        "queue_gate.yaml",
        (STALE_TRANSITION, ""),
        ("    unless: [paused, newer_head_exists]\n", "    unless: paused\n"),
        (
            "unless: [paused, newer_head_exists, latest_not_stamped]",
            "unless: [paused, latest_not_stamped]",
        ),
    )
    w = backlog_of_two(load_process_machines(directory, lint=False))
    # A, now stale, takes the only slot; B waits behind it instead of superseding it.
    assert states(w) == ["processing", "accepted"]
    assert [p.request_id for p in w.published.builds()] == [f"request/{Q}/1"]
    assert w.holds == 1


def test_announce_after_publish_in_yaml_reorders_the_publishes(tmp_path: Path) -> None:
    directory = edited(
        tmp_path,
        "queue_gate.yaml",
        (
            "after: [mark_processing, release_lost_claim, announce, publish_build, ack]",
            "after: [mark_processing, release_lost_claim, publish_build, announce, ack]",
        ),
    )
    unedited, reordered = (
        world(load_process_machines(MACHINES)),
        world(load_process_machines(directory, lint=False)),
    )
    for w in (unedited, reordered):
        w.ingest(Q, "A")
        drain(w)
    assert [r.kind for r in unedited.published.records] == ["process", "hook", "build"]
    assert [r.kind for r in reordered.published.records] == ["process", "build", "hook"]


def test_a_request_state_without_holds_slot_takes_no_slot(tmp_path: Path) -> None:
    directory = edited(
        tmp_path,
        "request.yaml",
        ("  - name: processing\n    holds_slot: true\n", "  - name: processing\n"),
    )
    w = world(load_process_machines(directory, lint=False))
    w.ingest(Q, "A")
    drain(w)
    row = w.queues.snapshot()[0]
    assert states(w) == ["processing"]
    assert row.in_flight_count == 0


def test_a_gate_that_never_closes_overruns_max_concurrent(tmp_path: Path) -> None:
    directory = edited(
        tmp_path,
        "queue_gate.yaml",
        ("    conditions: gate_closed\n", "    conditions: [gate_closed, newer_head_exists]\n"),
        ("    unless: gate_closed\n", "    unless: [newer_head_exists]\n"),
    )
    w = world(load_process_machines(directory, lint=False))
    w.ingest(Q, "A")
    drain(w)
    w.ingest(Q, "B")
    drain(w)
    assert states(w) == ["processing", "processing"]
    assert w.queues.snapshot()[0].in_flight_count == 2


def test_lint_refuses_a_copy_that_publishes_before_it_persists(tmp_path: Path) -> None:
    directory = edited(
        tmp_path,
        "queue_gate.yaml",
        (
            "after: [mark_processing, release_lost_claim, announce, publish_build, ack]",
            "after: [announce, publish_build, mark_processing, release_lost_claim, ack]",
        ),
    )
    with pytest.raises(SpecError, match="persist before publish"):
        load_process_machines(directory)
    # The same copy compiles without lint, and then really announces too early: the
    # event is minted from the still-accepted request, so a later re-announce (from the
    # processing branch) carries another id and consumers cannot dedupe the two.
    w = world(load_process_machines(directory, lint=False))
    w.ingest(Q, "A")
    drain(w)
    w.redeliver(f"request/{Q}/1")
    drain(w)
    first, second = w.published.hooks()
    assert first.dedup_id != second.dedup_id

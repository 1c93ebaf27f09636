"""Pausing a queue: the shipped ``paused`` parameter, set mid-run by ``config`` steps.

The timeline ``tests/timelines/pause_and_resume.yaml`` shows the whole story on the
shipped policy; these tests pin the parts a timeline cannot: that only the paused queue
waits, that nothing is lost while paused, and that a ``config`` step naming a parameter
the machines do not declare (or a value they refuse) is bad input at its line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.cli import EXIT_USAGE, main
from stovepipe_fsm.domain.entities import QueueConfig
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.simulation.world import World

ROOT = Path(__file__).resolve().parent.parent
MACHINES = load_process_machines(ROOT / "machines")
MAIN, IOS = "monorepo/main", "mobile/ios"


def drain(world: World) -> None:
    while world.deliver_next() is not None:
        pass


def paused_world() -> World:
    config = StaticConfigStore(QueueConfig.of(max_concurrent=1, gate_wait_delay_ms=10))
    world = World(MACHINES, config, {"A": [], "B": ["A"], "C": ["B"]})
    world.config.set(MAIN, {"paused": True})
    return world


def test_a_paused_queue_holds_every_head_and_supersedes_nothing() -> None:
    world = paused_world()
    for uri in ("A", "B", "C"):
        world.ingest(MAIN, uri)
    for _ in range(5):
        world.advance(10)
        world.deliver_next()
    assert [r.state for r in world.requests.snapshot()] == ["accepted"] * 3
    assert world.published.builds() == ()
    assert {h.reason for h in world.hold_log} == {"paused"}
    # Only the head of the queue is ever delivered; the others wait behind it, all there.
    assert [m.request_id for m in world.broker.messages] == [
        f"request/{MAIN}/1",
        f"request/{MAIN}/2",
        f"request/{MAIN}/3",
    ]


def test_pausing_one_queue_leaves_the_others_running() -> None:
    world = paused_world()
    world.ingest(MAIN, "A")
    world.ingest(IOS, "A")
    drain(world)
    states = {r.queue: r.state for r in world.requests.snapshot()}
    assert states == {MAIN: "accepted", IOS: "processing"}


def test_resuming_coalesces_what_was_ingested_while_paused() -> None:
    world = paused_world()
    for uri in ("A", "B", "C"):
        world.ingest(MAIN, uri)
    world.deliver_next()
    world.config.set(MAIN, {"paused": False})
    world.advance(10)
    drain(world)
    states = [r.state for r in world.requests.snapshot()]
    assert states == ["superseded", "superseded", "processing"]
    assert [p.request_id for p in world.published.builds()] == [f"request/{MAIN}/3"]


def test_a_fork_of_the_world_keeps_its_own_pause() -> None:
    world = paused_world()
    twin = world.clone()
    twin.config.set(MAIN, {"paused": False})
    assert world.config.get(MAIN).param("paused") is True
    assert twin.config.get(MAIN).param("paused") is False


@pytest.mark.parametrize(
    ("step", "fragment"),
    [
        ("{pasued: true}", "config: unknown parameter 'pasued'; allowed: confidence_percent, "),
        ("{paused: 1}", "config: paused: 1 is not of type 'boolean'"),
        ("{queue: mobile/ios, max_concurrent: 0}", "config: max_concurrent: 0 is less than"),
    ],
)
def test_a_config_step_is_checked_against_the_declarations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], step: str, fragment: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(f"steps:\n  - ingest: A\n  - config: {step}\n  - run\n", encoding="utf-8")
    capsys.readouterr()
    code = main(["simulate", str(path), "--machines", str(ROOT / "machines")])
    out, err = capsys.readouterr()
    assert (code, out) == (EXIT_USAGE, "")
    assert err.startswith(f"{path}:3:5: {fragment}"), err


def test_the_timeline_config_accepts_declared_parameters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "paused.yaml"
    path.write_text(
        "config: {paused: true}\nsteps:\n  - ingest: A\n  - run\n"
        "  - expect: {request: A, state: accepted, holds: 1, hold_reason: paused}\n",
        encoding="utf-8",
    )
    capsys.readouterr()
    assert main(["test", str(path), "--machines", str(ROOT / "machines")]) == 0
    path.write_text("config: {pausd: true}\nsteps:\n  - run\n", encoding="utf-8")
    assert main(["test", str(path), "--machines", str(ROOT / "machines")]) == EXIT_USAGE
    assert f"{path}:1:9: config: unknown parameter 'pausd'" in capsys.readouterr().err

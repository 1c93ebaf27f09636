"""Machine parameters: declared in YAML, set by config, read by conditions and actions.

The shipped gate declares ``max_concurrent`` and ``gate_wait_delay_ms``; these tests
prove the declarations are what config may set, that a queue gets the declared default
when config sets nothing, and that the values reach the gate.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from memory_stages import memory_stages, settled

from stovepipe_fsm.adapters.memory import MemoryDelivery
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.domain.entities import Queue, QueueConfig
from stovepipe_fsm.located.errors import SpecError
from stovepipe_fsm.process.catalog import load_process_machines

ROOT = Path(__file__).resolve().parent.parent
MACHINES = load_process_machines(ROOT / "machines")
Q = "monorepo/main"


def test_the_shipped_gate_declares_its_knobs_with_their_defaults() -> None:
    assert MACHINES.parameter_defaults == {
        "max_concurrent": 1,
        "gate_wait_delay_ms": 5000,
        "paused": False,
        "full_build_paths": (),
        "max_baseline_lag": 0,
        "max_validation_ms": 0,
        "every_head": False,
        "keep_newest": 0,
        "skip_paths": (),
        "recent_greens": 8,
        "probe_slots": 0,
        "confirm_reds": 2,
        "max_probes": 32,
        "max_blamelist": 256,
        "flake_aware": False,
        "flake_rate_percent": 1,
        "confidence_percent": 99,
    }
    declared = MACHINES.parameters["max_concurrent"]
    assert declared.value_schema() == {"type": "integer", "minimum": 1, "maximum": 1000}
    assert declared.location.file.endswith("queue_gate.yaml")


async def seeded(config: StaticConfigStore, holders: tuple[str, ...]):  # type: ignore[no-untyped-def]
    stages = memory_stages(MACHINES, config=config)
    services = stages.services
    latest = f"request/{Q}/9"
    await services.queues.create(Queue(Q, latest_request_id=latest, slot_holders=holders))
    for holder in holders:
        request = stages.lifecycle.new_request(holder, Q, holder)
        await services.requests.create(request)
    await services.requests.create(stages.lifecycle.new_request(latest, Q, "H"))
    return stages, latest


async def test_a_queue_config_that_sets_nothing_gets_the_declared_defaults() -> None:
    stages, latest = await seeded(StaticConfigStore(), (f"request/{Q}/1",))
    delivery = MemoryDelivery(Q, latest)
    assert (await settled(stages.controller, delivery)).outcome == "held"
    assert delivery.delay_ms == 5000  # gate_wait_delay_ms's declared default


async def test_config_values_reach_the_gate() -> None:
    config = StaticConfigStore(
        {"queues": {Q: {"max_concurrent": 2, "gate_wait_delay_ms": 70}}},
        parameters=MACHINES.parameters,
    )
    held, latest = await seeded(config, (f"request/{Q}/1", f"request/{Q}/2"))
    delivery = MemoryDelivery(Q, latest)
    assert (await settled(held.controller, delivery)).outcome == "held"
    assert delivery.delay_ms == 70
    admitted, latest = await seeded(config, (f"request/{Q}/1",))
    assert (await admitted.controller.handle(MemoryDelivery(Q, latest))).outcome == "acked"


def test_a_value_the_declaration_refuses_is_a_located_error() -> None:
    with pytest.raises(SpecError, match=r"queues\.a/b\.max_concurrent: 0 is less than"):
        StaticConfigStore(
            {"queues": {"a/b": {"max_concurrent": 0}}}, parameters=MACHINES.parameters
        )


def test_queue_config_keeps_runtime_keys_and_parameters_apart() -> None:
    config = QueueConfig.of(max_attempts=3, max_concurrent=2, full_build_paths=["*.bzl"])
    assert config.max_attempts == 3
    assert config.param("max_concurrent") == 2
    assert config.param("full_build_paths") == ("*.bzl",)
    assert hash(config)  # a value, like every entity
    with pytest.raises(KeyError, match="parameter 'paused' is not set"):
        config.param("paused")


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "machines", tmp_path / "machines")
    shutil.copytree(ROOT / "config", tmp_path / "config")
    return tmp_path


def test_validate_checks_config_keys_against_the_declarations(
    policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = policy / "config" / "queues.yaml"
    config.write_text(
        config.read_text(encoding="utf-8").replace(
            "monorepo/main: {max_concurrent: 1}", "monorepo/main: {max_concurrnt: 1}"
        ),
        encoding="utf-8",
    )
    code = main(["validate", str(policy / "machines"), str(config)])
    out = capsys.readouterr().out
    assert code == 1
    assert "unknown key 'max_concurrnt' in queues.monorepo/main; allowed: " in out
    allowed = (
        "confidence_percent, confirm_reds, every_head, flake_aware, flake_rate_percent, "
        "full_build_paths, gate_wait_delay_ms, keep_newest, max_attempts, max_baseline_lag, "
        "max_blamelist, max_concurrent, max_probes, max_validation_ms, paused, probe_slots, "
        "recent_greens, ref, repository, skip_paths"
    )
    assert allowed in out


@pytest.mark.parametrize(
    ("key", "maximum"),
    [
        ("max_concurrent", 1000),
        ("keep_newest", 1000),
        ("max_baseline_lag", 100000),
        ("max_validation_ms", 604800000),
        ("max_attempts", 100),
    ],
)
def test_a_count_past_its_maximum_is_refused_where_it_is_written(
    policy: Path, capsys: pytest.CaptureFixture[str], key: str, maximum: int
) -> None:
    config = policy / "config" / "queues.yaml"
    config.write_text(
        "defaults: {gate_wait_delay_ms: 1000}\n"
        f"queues:\n  monorepo/main:\n    {key}: {maximum}\n  mono/big:\n    {key}: 1000000000000\n",
        encoding="utf-8",
    )
    code = main(["validate", str(policy / "machines"), str(config)])
    out = capsys.readouterr().out
    assert code == 1
    assert "queues.yaml:6:" in out  # the line of the value
    assert f"queues.mono/big.{key}: 1000000000000 is greater than the maximum of {maximum}" in out
    assert "monorepo/main" not in out


def test_a_new_parameter_in_the_machines_is_a_new_config_key(
    policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = policy / "machines" / "queue_gate.yaml"
    gate.write_text(
        gate.read_text(encoding="utf-8").replace(
            "parameters:\n",
            "parameters:\n  nightly_only:\n    type: boolean\n    default: false\n"
            "    description: admit heads at night only\n",
            1,
        ),
        encoding="utf-8",
    )
    config = policy / "config" / "queues.yaml"
    config.write_text(
        config.read_text(encoding="utf-8") + '  "legacy/*": {nightly_only: true}\n',
        encoding="utf-8",
    )
    assert main(["validate", str(policy / "machines"), str(config)]) == 0
    config.write_text(
        config.read_text(encoding="utf-8").replace("{nightly_only: true}", "{nightly_only: 1}"),
        encoding="utf-8",
    )
    assert main(["validate", str(policy / "machines"), str(config)]) == 1
    assert "nightly_only: 1 is not of type 'boolean'" in capsys.readouterr().out


def test_two_machines_declaring_one_parameter_differently_clash(
    policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = policy / "machines" / "request.yaml"
    request.write_text(
        request.read_text(encoding="utf-8").replace(
            "states:\n",
            "parameters:\n  max_concurrent:\n    type: integer\n    default: 3\n"
            "    description: another idea of it\n  max_attempts:\n    type: integer\n"
            "    default: 1\n    description: a runtime key\nstates:\n",
            1,
        ),
        encoding="utf-8",
    )
    assert main(["validate", str(policy / "machines")]) == 1
    out = capsys.readouterr().out
    assert "parameter 'max_attempts' is one of the runtime's own keys" in out
    assert "parameter 'max_concurrent' is declared differently in" in out

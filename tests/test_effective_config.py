"""A queue's effective config: one value, resolved once, that the stages read.

Also the simulated world's side of it: each world (and each fork) runs its own stages,
built on its own stores, reading the world's one resolved config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.domain.entities import QueueConfig
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.process.effective_config import (
    LiveConfigs,
    ResolvedConfigs,
    declared_pairs,
    effective_config,
    stage_config,
)
from stovepipe_fsm.simulation.world import World

ROOT = Path(__file__).resolve().parent.parent
MACHINES = load_process_machines(ROOT / "machines")
Q = "monorepo/main"
DECLARED = {"max_concurrent": 1, "gate_wait_delay_ms": 5000, "paused": False}


class CountingStore:
    """A config store that counts its reads and may change its answer."""

    def __init__(self, config: QueueConfig) -> None:
        self.config = config
        self.reads = 0

    def get(self, queue: str) -> QueueConfig:
        self.reads += 1
        return self.config

    def configured_queues(self) -> tuple[str, ...]:
        return (Q,)


def params(config: QueueConfig) -> dict[str, Any]:
    return dict(config.parameters)


def test_declared_defaults_sit_under_the_policy_and_changes_over_both() -> None:
    resolved = QueueConfig.of(max_concurrent=3, max_attempts=7)
    config = effective_config(resolved, declared_pairs(DECLARED), {"paused": True})
    assert params(config) == {"max_concurrent": 3, "gate_wait_delay_ms": 5000, "paused": True}
    assert config.max_attempts == 7
    changed = effective_config(resolved, declared_pairs(DECLARED), {"max_attempts": 2})
    assert changed.max_attempts == 2 and params(changed)["max_concurrent"] == 3
    assert [name for name, _ in config.parameters] == sorted(params(config))


def test_a_complete_config_is_returned_as_it_is() -> None:
    complete = QueueConfig.of(max_concurrent=2, gate_wait_delay_ms=10, paused=False)
    assert effective_config(complete, declared_pairs(DECLARED)) is complete


def test_a_fixed_policy_is_resolved_once_per_queue_until_a_config_step() -> None:
    store = CountingStore(QueueConfig.of(max_concurrent=2))
    configs = ResolvedConfigs(store, DECLARED, {"gate_wait_delay_ms": 10})
    first = configs.get(Q)
    assert configs.get(Q) is first and store.reads == 1
    assert params(first) == {"max_concurrent": 2, "gate_wait_delay_ms": 10, "paused": False}
    configs.set(Q, {"paused": True})
    assert params(configs.get(Q))["paused"] is True
    assert params(configs.get(Q))["gate_wait_delay_ms"] == 10  # the run's values stay


def test_a_copy_keeps_its_own_config_steps() -> None:
    configs = ResolvedConfigs(CountingStore(QueueConfig()), DECLARED)
    configs.set(Q, {"paused": True})
    twin = configs.clone()
    twin.set(Q, {"paused": False, "max_concurrent": 4})
    assert params(configs.get(Q))["paused"] is True
    assert params(configs.get(Q))["max_concurrent"] == 1
    assert params(twin.get(Q))["max_concurrent"] == 4


def test_a_live_store_is_asked_on_every_read() -> None:
    store = CountingStore(QueueConfig.of(max_concurrent=2))
    configs = LiveConfigs(store, DECLARED)
    assert params(configs.get(Q))["max_concurrent"] == 2
    store.config = QueueConfig.of(max_concurrent=5)  # the file was edited
    edited = {"max_concurrent": 5, "gate_wait_delay_ms": 5000, "paused": False}
    assert params(configs.get(Q)) == edited
    assert store.reads == 2


def test_the_stages_read_an_effective_store_as_it_is_and_complete_any_other() -> None:
    resolved = ResolvedConfigs(StaticConfigStore(), DECLARED)
    assert stage_config(resolved, DECLARED) is resolved
    plain = StaticConfigStore()
    wrapped = stage_config(plain, DECLARED)
    assert isinstance(wrapped, LiveConfigs) and wrapped.store is plain
    assert stage_config(wrapped, DECLARED) is wrapped


def test_a_world_and_its_fork_run_their_own_stages_on_their_own_stores() -> None:
    world = World(MACHINES, StaticConfigStore(), {"A": [], "B": ["A"]})
    world.ingest(Q, "A")
    twin = world.clone()
    for each in (world, twin):
        services = each.stages.controller.services
        assert services.requests is each.requests and services.queues is each.queues
        assert services.config is each.config
        assert each.stages.ingest.uri_index is each.uri_index
    assert twin.stages.controller is not world.stages.controller
    twin.ingest(Q, "B")
    twin.deliver_next()
    assert [r.uri for r in world.requests.snapshot()] == ["A"]
    assert [r.state for r in twin.requests.snapshot()] == ["superseded", "accepted"]
    assert world.broker.messages and [r.state for r in world.requests.snapshot()] == ["accepted"]

"""The stages on in-memory ports, through the same factory the service uses.

Tests that swap one port for a racing or flaky one pass it by name; everything else is
a fresh in-memory adapter.
"""

from __future__ import annotations

from typing import Any

from stovepipe_fsm.adapters.memory import (
    ManualClock,
    MemoryCounter,
    MemoryDelivery,
    MemoryPublisher,
    MemoryQueueStore,
    MemoryRequestStore,
    MemorySourceControlProvider,
    MemoryUriIndex,
)
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.domain.settle import settle
from stovepipe_fsm.pipeline.wiring import Ports, Stages, build_stages
from stovepipe_fsm.process.catalog import ProcessMachines
from stovepipe_fsm.process.controller import ProcessController


def memory_ports(**overrides: Any) -> Ports:
    defaults: dict[str, Any] = {
        "requests": MemoryRequestStore(),
        "queues": MemoryQueueStore(),
        "uri_index": MemoryUriIndex(),
        "counter": MemoryCounter(),
        "config": StaticConfigStore(),
        "source_control": MemorySourceControlProvider({}),
        "publisher": MemoryPublisher(),
        "clock": ManualClock(0),
    }
    defaults.update(overrides)
    return Ports(**defaults)


def memory_stages(machines: ProcessMachines, **overrides: Any) -> Stages:
    """:func:`build_stages` on in-memory ports; ``lifecycle_factory``/``metrics`` pass on."""
    options = {k: overrides.pop(k) for k in ("lifecycle_factory", "metrics") if k in overrides}
    return build_stages(machines, memory_ports(**overrides), **options)


async def settled(controller: ProcessController, delivery: MemoryDelivery) -> MemoryDelivery:
    """Run ``controller`` on ``delivery`` and settle it as the runtime does: the settle
    policy's answer to what the flow decided, performed on the message."""
    attempt = await controller.handle(delivery)
    delivery.perform(settle(attempt, failures=0, max_attempts=1))
    return delivery

"""In-memory adapters: deterministic implementations of the ports.

Used by unit tests, ``simulate`` and ``check``. Nothing here performs real I/O or awaits
anything real, so a run is a pure function of its inputs, and every stateful adapter has
``clone()`` so a model checker can fork a whole world state cheaply.

The in-memory config store lives in ``stovepipe_fsm.adapters.memory.config`` and is
imported from there directly.
"""

from .clock import ManualClock, SystemClock
from .delivery import ACKED, HELD, DeliveryAlreadyFinished, MemoryDelivery
from .publisher import BUILD, HOOK, PROCESS, MemoryPublisher, Published
from .source_control import MemorySourceControl, MemorySourceControlProvider
from .stores import (
    MemoryCounter,
    MemoryQueueStore,
    MemoryRequestStore,
    MemorySearchStore,
    MemoryUriIndex,
)

__all__ = [
    "ACKED",
    "BUILD",
    "HELD",
    "HOOK",
    "PROCESS",
    "DeliveryAlreadyFinished",
    "ManualClock",
    "MemoryCounter",
    "MemoryDelivery",
    "MemoryPublisher",
    "MemoryQueueStore",
    "MemoryRequestStore",
    "MemorySearchStore",
    "MemorySourceControl",
    "MemorySourceControlProvider",
    "MemoryUriIndex",
    "Published",
    "SystemClock",
]

"""Reusable contract suites for the ports.

Each suite is a base class whose name does not start with ``Test`` (so pytest does not
collect it on its own) and whose test methods take fixtures for the implementation
under test. A backend runs the whole contract by subclassing it in a ``test_*`` module
and providing the fixtures, e.g.::

    class TestMemoryStores(StoreContract):
        @pytest.fixture
        def request_store(self) -> MemoryRequestStore:
            return MemoryRequestStore()
        ...

The memory adapters, the git adapter and the JetStream adapters all run these same
suites, which is what makes "swap the adapter without touching the core" safe.
"""

from .source_control_contract import CommitGraph, GraphBuilder, SourceControlContract
from .store_contract import ODD_QUEUE_NAMES, ODD_URIS, StoreContract

__all__ = [
    "ODD_QUEUE_NAMES",
    "ODD_URIS",
    "CommitGraph",
    "GraphBuilder",
    "SourceControlContract",
    "StoreContract",
]

"""The shared port contracts, run against the in-memory adapters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from contracts import CommitGraph, GraphBuilder, SourceControlContract, StoreContract

from stovepipe_fsm.adapters.memory import (
    MemoryCounter,
    MemoryQueueStore,
    MemoryRequestStore,
    MemorySourceControl,
    MemoryUriIndex,
)


class TestMemoryStores(StoreContract):
    @pytest.fixture
    def request_store(self) -> MemoryRequestStore:
        return MemoryRequestStore()

    @pytest.fixture
    def queue_store(self) -> MemoryQueueStore:
        return MemoryQueueStore()

    @pytest.fixture
    def uri_index(self) -> MemoryUriIndex:
        return MemoryUriIndex()

    @pytest.fixture
    def counter(self) -> MemoryCounter:
        return MemoryCounter()


class TestClonedMemoryStores(StoreContract):
    """A clone is a full store in its own right (the model checker writes to clones)."""

    @pytest.fixture
    def request_store(self) -> MemoryRequestStore:
        return MemoryRequestStore().clone()

    @pytest.fixture
    def queue_store(self) -> MemoryQueueStore:
        return MemoryQueueStore().clone()

    @pytest.fixture
    def uri_index(self) -> MemoryUriIndex:
        return MemoryUriIndex().clone()

    @pytest.fixture
    def counter(self) -> MemoryCounter:
        return MemoryCounter().clone()


class TestMemorySourceControl(SourceControlContract):
    @pytest.fixture
    def build_graph(self) -> GraphBuilder:
        async def build(parents: Mapping[str, Sequence[str]]) -> CommitGraph:
            source_control = MemorySourceControl(parents)
            return CommitGraph(
                source_control=source_control,
                ids={name: name for name in parents},
                missing="f" * 40,
            )

        return build

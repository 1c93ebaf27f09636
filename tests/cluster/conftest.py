"""The cluster tests: every test here is marked ``cluster`` (``make test-cluster``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from nats_cluster import NatsCluster, running_cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="module")
def nats_cluster() -> Iterator[NatsCluster]:
    """Three nodes for the module; a test that kills a node restarts it."""
    with running_cluster("stovepipe-test-cluster-") as cluster:
        yield cluster


@pytest.fixture(autouse=True)
async def whole_cluster(nats_cluster: NatsCluster) -> None:
    """Every node back as a JetStream peer before a test (an earlier one killed some)."""
    await nats_cluster.start_missing()
    await nats_cluster.wait_ready()

"""The cluster tests: every test here is marked ``cluster`` (``make test-cluster``)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from nats_cluster import NatsCluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="module")
def nats_cluster() -> Iterator[NatsCluster]:
    """Three nodes for the module; a test that kills a node restarts it."""
    root = Path(tempfile.mkdtemp(prefix="stovepipe-test-cluster-"))
    cluster = NatsCluster(root)
    try:
        cluster.start()
        with ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(asyncio.run, cluster.wait_ready()).result(timeout=90)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
async def whole_cluster(nats_cluster: NatsCluster) -> None:
    """Every node back as a JetStream peer before a test (an earlier one killed some)."""
    await nats_cluster.start_missing()
    await nats_cluster.wait_ready()

"""Queues spread over partitions of a replicated process stream, by two replicas at once.

The cluster's one account caps each stream at two consumers: two service replicas
starting side by side on a replicated topology move the queues past that limit to new
replicated partitions, agree on each queue's partition, and admit a head of every queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from nats_cluster import NatsCluster, running_cluster
from nats_server import account_limited_config
from service_replicas import admit_a_head_of_each, replicas

from stovepipe_fsm.adapters.jetstream import Topology
from stovepipe_fsm.adapters.jetstream.durable_consumer import existing_consumers
from stovepipe_fsm.adapters.jetstream.partitions import partitions

QUEUES = [f"spread/q{n}" for n in range(6)]
CONFIG = {"defaults": {"gate_wait_delay_ms": 100}, "queues": {q: {} for q in QUEUES}}


@pytest.fixture(scope="module")
def nats_cluster() -> Iterator[NatsCluster]:
    """Three nodes whose one account lets each stream hold two consumers (this module's
    own cluster, in place of the shared one)."""

    def limited(root: Path) -> Path:
        return account_limited_config(root, max_consumers=2)

    with running_cluster("stovepipe-test-cluster-limited-", limited) as cluster:
        yield cluster


async def test_two_replicas_spread_queues_over_replicated_partitions(
    nats_cluster: NatsCluster,
) -> None:
    topology = Topology.isolated("spread", replicas=3)
    nc = await nats_cluster.connect()
    try:
        js = nc.jetstream()
        async with replicas(nats_cluster, topology, CONFIG) as services:
            for service in services:
                assert (
                    sorted(service.crew.queues.consumers) == QUEUES
                    and service.crew.queues.refused == {}
                )
            numbers = await partitions(js, topology)
            assert numbers == [0, 1, 2]
            held: dict[str, list[int]] = {}
            for partition in numbers:
                info = await js.stream_info(topology.process_stream_of(partition))
                assert info.config.num_replicas == 3
                assert info.state.consumer_count == 2
                stream = topology.process_stream_of(partition)
                for name in await existing_consumers(js, stream):
                    held.setdefault(name, []).append(partition)
            # One consumer per queue, where both replicas run it.
            for queue in QUEUES:
                where = held[topology.process_consumer_name(queue)]
                assert len(where) == 1
                assert {s.crew.queues.consumers[queue].partition for s in services} == set(where)
            await admit_a_head_of_each(js, topology, CONFIG, QUEUES)
    finally:
        await nc.close()

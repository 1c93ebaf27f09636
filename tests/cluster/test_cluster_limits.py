"""The process stream's consumer limit on a 3-node cluster, raised by two replicas at once.

Two service replicas start side by side on a replicated topology whose process stream
was created for fewer queues than the policy names: both meet the limit while creating
consumers, both raise it, and every queue ends up served by both, with a head of each
admitted.
"""

from __future__ import annotations

from nats_cluster import NatsCluster
from service_replicas import admit_a_head_of_each, replicas

from stovepipe_fsm.adapters.jetstream import Topology, ensure_topology

QUEUES = [f"limit/q{n}" for n in range(6)]
CONFIG = {"defaults": {"gate_wait_delay_ms": 100}, "queues": {q: {} for q in QUEUES}}


async def test_two_replicas_raise_a_replicated_streams_consumer_limit(
    nats_cluster: NatsCluster,
) -> None:
    topology = Topology.isolated("limits", replicas=3, initial_queue_limit=2)
    nc = await nats_cluster.connect()
    try:
        js = nc.jetstream()
        await ensure_topology(js, topology)
        assert (await js.stream_info(topology.process_stream)).config.max_consumers == 2
        async with replicas(nats_cluster, topology, CONFIG) as services:
            for service in services:
                assert (
                    sorted(service.crew.queues.consumers) == QUEUES
                    and service.crew.queues.refused == {}
                )
            info = await js.stream_info(topology.process_stream)
            assert info.config.num_replicas == 3
            assert info.state.consumer_count == len(QUEUES)
            assert info.config.max_consumers >= 1002
            await admit_a_head_of_each(js, topology, CONFIG, QUEUES)
    finally:
        await nc.close()

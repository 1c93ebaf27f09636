"""Cost of the machine layer: the process controller against a hand-written reference.

Run from the repository root: ``python -m bench`` (``--quick`` for a short run).

Two decision paths are timed separately, each in two implementations:

- **machine**: :class:`ProcessController` running the compiled ``queue_gate`` flow, with
  the ``request`` lifecycle planning every Request write (the shipped code);
- **reference**: the same algorithm written straight in Python below - same in-memory
  stores, publisher, source control and delivery, the same awaits in the same order,
  the same metrics calls - with no machine in between.

The shipped machines decide by firing their compiled ``transitions`` machines
(``machine/compiler.py``). ``--straight`` adds, to the same interleaved rounds, the flow
written out by hand over the same named steps (:mod:`bench.straight`): what the machine
and its driver cost on top of the steps themselves.

The *admit* path is a latest head with a free slot and a last green that is its
ancestor: load R, load Q, coalesce, gate, ancestry check, claim slot, mark processing,
announce, publish build, ack. The *supersede* path is a head with a newer head stamped:
load R, load Q, coalesce, mark superseded (and the slot check that goes with any
terminal write), ack. Only ``handle`` is timed; the per-decision setup (creating the
request, resetting the queue row) is not. Coroutines are driven with ``send(None)``
as in ``simulate``: the in-memory adapters never suspend, so no event loop cost hides
the difference being measured.
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from stovepipe_fsm.adapters.memory import (
    ManualClock,
    MemoryCounter,
    MemoryDelivery,
    MemoryPublisher,
    MemoryQueueStore,
    MemoryRequestStore,
    MemorySourceControl,
    MemorySourceControlProvider,
    MemoryUriIndex,
)
from stovepipe_fsm.domain.entities import (
    FULL,
    INCREMENTAL_SINCE_GREEN,
    Queue,
    QueueConfig,
    Request,
    evolve,
)
from stovepipe_fsm.domain.errors import NonRetryable, NotFound, VersionMismatch
from stovepipe_fsm.domain.hooks import started_event
from stovepipe_fsm.domain.ids import compare_request_id
from stovepipe_fsm.domain.settle import Attempt
from stovepipe_fsm.pipeline import wiring
from stovepipe_fsm.process.catalog import load_process_machines
from stovepipe_fsm.process.metrics import Metrics
from stovepipe_fsm.process.trail_notes import HELD_LOG
from stovepipe_fsm.simulation.broker import run_sync

from .calls import calls_per_decision
from .straight import straight_handle

Q = "monorepo/main"
GREEN, HEAD = "G", "H"
ACCEPTED = "accepted"
#: What the reference controller decides when it is done with a delivery.
ACKED = Attempt.acked()
TERMINAL = frozenset({"superseded", "succeeded", "failed", "cancelled"})
DECISIONS_LOG = logging.getLogger("stovepipe_fsm.decisions")


class FixedConfig:
    """One QueueConfig for every queue (both implementations read it the same way)."""

    def __init__(self, config: QueueConfig) -> None:
        self.config = config

    def get(self, queue: str) -> QueueConfig:
        return self.config

    def configured_queues(self) -> tuple[str, ...]:
        return (Q,)


@dataclass
class Ports:
    requests: MemoryRequestStore
    queues: MemoryQueueStore
    config: FixedConfig
    source_control: MemorySourceControlProvider
    publisher: MemoryPublisher
    clock: ManualClock
    metrics: Metrics


def make_ports() -> Ports:
    graph = MemorySourceControl({GREEN: [], HEAD: [GREEN]})
    return Ports(
        requests=MemoryRequestStore(),
        queues=MemoryQueueStore(),
        config=FixedConfig(
            # Every parameter queue_gate.yaml declares, as the shipped wiring completes it.
            QueueConfig.of(
                max_concurrent=1,
                gate_wait_delay_ms=1000,
                paused=False,
                max_baseline_lag=0,
                max_validation_ms=0,
                full_build_paths=[],
            )
        ),
        source_control=MemorySourceControlProvider(default=graph),
        publisher=MemoryPublisher(),
        clock=ManualClock(0),
        metrics=Metrics(),
    )


# --- the reference: process steps 1-7 in plain Python --------------------------------


class ReferenceController:
    """The process algorithm without the machine layer, for comparison only.

    It does every check the shipped flow does on these paths, in the same order: the
    pause, the lease and ended-holder reclaims, coalescing, the stamp check, the gate
    (slots, a running rewrite, the baseline lag), the ancestry and full-build-path
    check, the claim with its lease and serial mark, the admit and end times, and the
    decision's log line and trail note (the bench's trail keeps nothing, as the
    shipped one's ``DiscardedTrail`` does).
    """

    def __init__(self, ports: Ports) -> None:
        self.p = ports

    async def handle(self, delivery: MemoryDelivery) -> Attempt:
        started = time.perf_counter()
        decided = await self._decide(delivery)
        self.p.metrics.observe_latency((time.perf_counter() - started) * 1000.0)
        self.p.metrics.count(f"deliveries_{decided.outcome}", delivery.queue)
        return decided

    async def _decide(self, delivery: MemoryDelivery) -> Attempt:
        p = self.p
        try:
            request = await p.requests.get(delivery.request_id)
            queue_read: Queue | None = await p.queues.get(delivery.queue)
        except NotFound:
            raise NonRetryable(f"request {delivery.request_id!r} not found") from None
        if request.queue != delivery.queue:
            raise NonRetryable(f"request {request.id!r} arrived on the wrong queue")
        if request.state in TERMINAL:
            return ACKED
        if request.state == "processing":
            await self._announce(request)
            await p.publisher.publish_build(request.queue, request.id)
            return ACKED
        while True:
            if queue_read is None:
                try:
                    queue_read = await p.queues.get(request.queue)
                except NotFound:
                    raise NonRetryable(f"queue row {request.queue!r} not found") from None
            queue, queue_read = queue_read, None
            config = p.config.get(queue.name)
            now = p.clock.now_ms()
            if any(h != request.id for h in queue.expired_holders(now)):
                raise NotImplementedError("the bench's queues hold no leases")
            if self._gate_closed(queue, request, config, now):
                queue = await self._release_stale_holders(queue, request.id)
            latest = queue.latest_request_id
            if config.param("paused"):
                return await self._hold(delivery, request, config)
            if latest and compare_request_id(request.queue, request.id, latest) < 0:
                superseded = evolve(
                    request, state="superseded", superseded_by=latest, ended_at_ms=now
                )
                await p.requests.update(superseded, request.version, request.version + 1)
                if queue.holds(request.id):
                    await self._release(superseded.with_version(request.version + 1))
                p.metrics.count("supersedes", request.queue)
                self._note(request, "superseded by %s", latest)
                return ACKED
            if not latest or compare_request_id(request.queue, request.id, latest) > 0:
                return await self._hold(delivery, request, config)
            if self._gate_closed(queue, request, config, now):
                return await self._hold(delivery, request, config)
            lag = config.param("max_baseline_lag")
            if lag > 0 and queue.last_green_request_id and self._others(queue, request):
                raise NotImplementedError("the bench's queues set no baseline lag")
            strategy, base, rewrite = await self._derive(request, queue, delivery, config)
            if rewrite and self._others(queue, request):
                return await self._hold(delivery, request, config)
            lease_ms = dict(config.parameters).get("max_validation_ms", 0)
            expires = p.clock.now_ms() + lease_ms if lease_ms > 0 else None
            claimed = queue.with_holder(request.id, expires_at_ms=expires, serial=rewrite)
            if claimed != queue:
                try:
                    await p.queues.update(claimed, queue.version, queue.version + 1)
                except VersionMismatch:
                    queue_read = None
                    request = await p.requests.get(request.id)
                    continue
            admitted = evolve(
                request,
                state="processing",
                build_strategy=strategy,
                base_uri=base,
                admitted_at_ms=p.clock.now_ms(),
            )
            await p.requests.update(admitted, request.version, request.version + 1)
            request = admitted.with_version(request.version + 1)
            p.metrics.count(f"admits_{strategy}", request.queue)
            await self._announce(request)
            await p.publisher.publish_build(request.queue, request.id)
            self._note(request, "admitted: %s build on %s", strategy, base or "no base")
            return ACKED

    @staticmethod
    def _others(queue: Queue, request: Request) -> int:
        return sum(1 for h in queue.slot_holders if h != request.id)

    def _gate_closed(self, queue: Queue, request: Request, config: QueueConfig, now: int) -> bool:
        if self._others(queue, request) >= config.param("max_concurrent"):
            return True
        serial = queue.serial_holder
        return bool(serial) and serial != request.id and not queue.is_expired(serial, now)

    async def _hold(
        self, delivery: MemoryDelivery, request: Request, config: QueueConfig
    ) -> Attempt:
        self.p.metrics.count("holds", request.queue)
        return Attempt.held(config.param("gate_wait_delay_ms"))

    @staticmethod
    def _note(request: Request, message: str, *args: object) -> None:
        """The decision's log line and its trail note: the bench keeps no trail."""
        HELD_LOG.forget(request.id)
        DECISIONS_LOG.info(message, *args, extra={"queue": request.queue, "request_id": request.id})

    async def _derive(
        self, request: Request, queue: Queue, delivery: MemoryDelivery, config: QueueConfig
    ) -> tuple[str, str, bool]:
        last_green = queue.last_green_uri
        if not last_green:
            return FULL, "", False
        source_control = self.p.source_control.for_queue(request.queue)
        if source_control is None:
            return FULL, "", False
        await delivery.in_progress()
        try:
            is_ancestor = await source_control.is_ancestor(last_green, request.uri)
        except NotFound:
            return FULL, "", True
        if not is_ancestor:
            return FULL, "", True
        if dict(config.parameters).get("full_build_paths", ()):
            raise NotImplementedError("the bench's queues list no full-build paths")
        return INCREMENTAL_SINCE_GREEN, last_green, False

    async def _announce(self, request: Request) -> None:
        event = started_event(request.queue, request.id, request.version, self.p.clock.now_ms())
        await self.p.publisher.publish_hook(event)

    async def _release(self, request: Request) -> None:
        """The slot check of every terminal write (reads the row, writes if it held)."""
        for _ in range(16):
            queue = await self.p.queues.get(request.queue)
            target = queue.without_holder(request.id)
            if target == queue:
                return
            try:
                await self.p.queues.update(target, queue.version, queue.version + 1)
            except VersionMismatch:
                continue
            return

    async def _release_stale_holders(self, queue: Queue, keep: str) -> Queue:
        stale = []
        for holder in queue.slot_holders:
            if holder != keep and (await self.p.requests.get(holder)).state in TERMINAL:
                stale.append(holder)
        if not stale:
            return queue
        target = queue
        for holder in stale:
            target = target.without_holder(holder)
        await self.p.queues.update(target, queue.version, queue.version + 1)
        return target.with_version(queue.version + 1)


# --- workloads -----------------------------------------------------------------------

Handle = Callable[[MemoryDelivery], Coroutine[Any, Any, Attempt]]
Maker = Callable[[Ports, Path], Handle]


def machine_handle(ports: Ports, machines_dir: Path) -> Handle:
    wired = wiring.Ports(
        requests=ports.requests,
        queues=ports.queues,
        uri_index=MemoryUriIndex(),
        counter=MemoryCounter(),
        config=ports.config,
        source_control=ports.source_control,
        publisher=ports.publisher,
        clock=ports.clock,
    )
    stages = wiring.build_stages(load_process_machines(machines_dir), wired, metrics=ports.metrics)
    return stages.controller.handle


def straight_machine_handle(ports: Ports, machines_dir: Path) -> Handle:
    """The shipped controller's services and named steps, without its driver."""
    return straight_handle(machine_handle(ports, machines_dir))


def reference_handle(ports: Ports, machines_dir: Path) -> Handle:
    return ReferenceController(ports).handle


def time_admits(ports: Ports, handle: Handle, n: int) -> float:
    """Seconds spent in ``handle`` for ``n`` admissions (setup excluded)."""
    requests, queues = ports.requests, ports.queues
    run_sync(queues.create(Queue(Q, last_green_uri=GREEN)))
    spent = 0
    for i in range(1, n + 1):
        request_id = f"request/{Q}/{i}"
        run_sync(requests.create(Request(id=request_id, queue=Q, uri=HEAD, state=ACCEPTED)))
        # What ingest and record would leave: R stamped latest, the previous slot freed.
        row = run_sync(queues.get(Q))
        fresh = replace(row, latest_request_id=request_id, slot_holders=())
        run_sync(queues.update(fresh, row.version, row.version + 1))
        delivery = MemoryDelivery(Q, request_id)
        start = time.perf_counter_ns()
        decided = run_sync(handle(delivery))
        spent += time.perf_counter_ns() - start
        assert decided.outcome == "acked"
    ports.publisher.clear()
    return spent / 1e9


def time_supersedes(ports: Ports, handle: Handle, n: int) -> float:
    """Seconds spent in ``handle`` for ``n`` supersedes (setup excluded)."""
    requests = ports.requests
    newest = f"request/{Q}/{n + 1}"
    run_sync(ports.queues.create(Queue(Q, last_green_uri=GREEN, latest_request_id=newest)))
    spent = 0
    for i in range(1, n + 1):
        request_id = f"request/{Q}/{i}"
        run_sync(requests.create(Request(id=request_id, queue=Q, uri=HEAD, state=ACCEPTED)))
        delivery = MemoryDelivery(Q, request_id)
        start = time.perf_counter_ns()
        decided = run_sync(handle(delivery))
        spent += time.perf_counter_ns() - start
        assert decided.outcome == "acked"
    return spent / 1e9


def check_equivalent(machines_dir: Path, makers: dict[str, Maker]) -> None:
    """Every implementation must decide alike, or the comparison means nothing."""
    for timer in (time_admits, time_supersedes):
        results = {}
        for label, make in makers.items():
            ports = make_ports()
            timer(ports, make(ports, machines_dir), 3)
            results[label] = (ports.requests.snapshot(), ports.queues.snapshot())
        for label, result in results.items():
            if result != results["machine"]:
                hint = (
                    " (bench/straight.py writes out the shipped queue_gate flow by hand: "
                    "bring it in line with machines/queue_gate.yaml, or run without --straight)"
                    if label == "straight"
                    else ""
                )
                sys.exit(
                    f"bench: {label} diverges from the controller on {timer.__name__}{hint}"
                )


def measure(
    timer: Callable[[Ports, Handle, int], float],
    machines_dir: Path,
    n: int,
    rounds: int,
    makers: dict[str, Maker],
) -> dict[str, list[float]]:
    """Decisions per second of each implementation, rounds interleaved.

    Alternating them (fresh stores every round) keeps a change in machine load from
    favouring whichever implementation happened to run in the quiet moment.
    """
    rates: dict[str, list[float]] = {label: [] for label in makers}
    for _ in range(rounds):
        for label, make in makers.items():
            ports = make_ports()
            handle = make(ports, machines_dir)
            gc.collect()
            gc.disable()
            try:
                seconds = timer(ports, handle, n)
            finally:
                gc.enable()
            rates[label].append(n / seconds)
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--machines", default="machines", help="machine directory to load")
    parser.add_argument("-n", type=int, default=10_000, help="decisions per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2,000 decisions x 3 rounds")
    parser.add_argument(
        "--calls",
        action="store_true",
        help="also count the Python function calls per decision of each implementation",
    )
    parser.add_argument(
        "--straight",
        action="store_true",
        help="also time the flow written out by hand over the same steps (no driver)",
    )
    args = parser.parse_args(argv)
    n, rounds = (2_000, 3) if args.quick else (args.n, args.rounds)
    machines_dir = Path(args.machines)
    makers: dict[str, Maker] = {"machine": machine_handle, "reference": reference_handle}
    if args.straight:
        makers["straight"] = straight_machine_handle
    check_equivalent(machines_dir, makers)

    print(f"python {sys.version.split()[0]}; {n} decisions x {rounds} rounds; best round shown")
    header = f"{'path':<10} {'machine/s':>11} {'reference/s':>12} {'machine us':>11} "
    header += f"{'ref us':>8} {'ratio':>6}"
    print(header)
    worst = 0.0
    straight_rows = []
    for label, timer in (("admit", time_admits), ("supersede", time_supersedes)):
        rates = measure(timer, machines_dir, n, rounds, makers)
        machine, reference = rates["machine"], rates["reference"]
        best_m, best_r = max(machine), max(reference)
        ratio = best_r / best_m
        worst = max(worst, ratio)
        paired = statistics.median(r / m for m, r in zip(machine, reference, strict=True))
        print(
            f"{label:<10} {best_m:>11,.0f} {best_r:>12,.0f} {1e6 / best_m:>11.1f} "
            f"{1e6 / best_r:>8.1f} {ratio:>5.2f}x   (median of paired rounds {paired:.2f}x)"
        )
        if args.straight:
            best_s = max(rates["straight"])
            paired_s = statistics.median(
                r / s for s, r in zip(rates["straight"], reference, strict=True)
            )
            straight_rows.append(
                f"{label:<10} {1e6 / best_s:>12.1f} {1e6 / best_r:>8.1f} "
                f"{best_r / best_s:>5.2f}x   (median of paired rounds {paired_s:.2f}x); "
                f"the driver: {1e6 / best_m - 1e6 / best_s:.1f} us, "
                f"{(best_s - best_m) / best_s:.0%} of the machine path"
            )
    print(f"machine/reference cost: worst {worst:.2f}x")
    if straight_rows:
        print("the flow written out by hand over the same steps (no driver at all):")
        print(f"{'path':<10} {'straight us':>12} {'ref us':>8} {'ratio':>6}")
        for row in straight_rows:
            print(row)
    if args.calls:
        print_calls(machines_dir, min(n, 2_000), makers)
    return 0


def print_calls(machines_dir: Path, n: int, makers: dict[str, Maker]) -> None:
    """Python function calls per decision, each implementation against the reference."""
    labels = [label for label in makers if label != "reference"]
    print(f"python function calls per decision (cProfile, {n} decisions, setup subtracted):")
    print(f"{'path':<10} {'reference':>10} " + " ".join(f"{label:>16}" for label in labels))
    for path, timer in (("admit", time_admits), ("supersede", time_supersedes)):
        counts = calls_per_decision(make_ports, makers, machines_dir, timer, n)
        reference = counts["reference"]
        cells = [f"{counts[label]:>6.0f} ({counts[label] / reference:.2f}x)" for label in labels]
        print(f"{path:<10} {reference:>10.0f} " + " ".join(f"{cell:>16}" for cell in cells))


if __name__ == "__main__":
    sys.exit(main())

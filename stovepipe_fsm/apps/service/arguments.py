"""What the service's command lines name: the broker and how to reach it, the topology,
one request, and the durations and counts of their flags.

Each ``*_args`` adds one group of flags to a parser; each ``*_of`` reads what a parsed
command line means, flag first, then the environment, then the default. No nats code is
imported here at import time (the parser is the same without the ``nats`` extra).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import TYPE_CHECKING

from ..options import CONFIG_HELP, DEFAULT_CONFIG, DEFAULT_MACHINES, MACHINES_HELP

if TYPE_CHECKING:
    from ...adapters.jetstream import Topology
    from .connect import NatsOptions

REPLICAS_ENV = "STOVEPIPE_REPLICAS"
ACK_WAIT_ENV = "STOVEPIPE_ACK_WAIT"
DEFAULT_ACK_WAIT = "10s"
ENV_GITHUB_SECRET = "STOVEPIPE_GITHUB_WEBHOOK_SECRET"
ENV_GITLAB_TOKEN = "STOVEPIPE_GITLAB_WEBHOOK_TOKEN"

_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_SIZE_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """Seconds in ``90s``, ``15m``, ``12h``, ``7d``, ``2w`` or a number of seconds;
    ``ValueError`` saying what is accepted. Must be positive."""
    match = _DURATION_RE.match(text)
    if match is None:
        raise ValueError(
            f"{text!r} is not a duration: a number with an optional unit s, m, h, d or w "
            "(e.g. 30s, 7d)"
        )
    seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    if seconds <= 0:
        raise ValueError(f"{text!r}: a duration must be positive")
    return seconds


def parse_size(text: str) -> int:
    """Bytes in ``1GiB``, ``512MiB``, ``64KiB`` or a number of bytes; ``ValueError``
    saying what is accepted. Must be positive."""
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(
            f"{text!r} is not a size: a whole number with an optional unit B, KiB, MiB, GiB "
            "or TiB (e.g. 1GiB)"
        )
    size = int(match.group(1)) * _SIZE_UNITS[unit]
    if size <= 0:
        raise ValueError(f"{text!r}: a size must be positive")
    return size


def duration(text: str) -> float:
    """An age or a wait on the command line (``7d``, ``10s``), in seconds."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def byte_size(text: str) -> int:
    """A size on the command line (``1GiB``, ``512MiB``), in bytes."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def replicas(text: str) -> int:
    """A replica count on the command line: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the replica count is a whole number >= 1")
    return value


def broker_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nats",
        default=None,
        help="server URL, or several seed URLs of one cluster separated by commas "
        "(env STOVEPIPE_NATS_URL)",
    )
    p.add_argument("--creds", help="NATS credentials file (env STOVEPIPE_NATS_CREDS)")
    p.add_argument("--nkey", metavar="FILE", help="nkey seed file (env STOVEPIPE_NATS_NKEY)")
    p.add_argument("--user", help="NATS user (env STOVEPIPE_NATS_USER)")
    p.add_argument(
        "--password-file",
        metavar="FILE",
        help="file holding the password (env STOVEPIPE_NATS_PASSWORD)",
    )
    p.add_argument(
        "--token-file", metavar="FILE", help="file holding the token (env STOVEPIPE_NATS_TOKEN)"
    )
    p.add_argument("--password", help="discouraged (the process list shows it): --password-file")
    p.add_argument("--token", help="discouraged (the process list shows it): --token-file")
    p.add_argument("--tls-ca", help="CA bundle to verify the server's certificate")
    p.add_argument("--tls-cert", help="client certificate (with --tls-key)")
    p.add_argument("--tls-key", help="client private key (with --tls-cert)")
    p.add_argument("--tls-hostname", help="name to verify the server certificate against")
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=20.0,
        help="seconds to establish the first connection before giving up (default 20)",
    )
    p.add_argument(
        "--machines",
        default=DEFAULT_MACHINES,
        help=f"{MACHINES_HELP}; serve runs it, the operator commands read the policy the "
        "service recorded and fall back to it only before one did",
    )
    p.add_argument(
        "--config", default=DEFAULT_CONFIG, help=f"{CONFIG_HELP}; serve runs it, hot-reloaded"
    )
    p.add_argument(
        "--topology-tag",
        help="use streams and buckets named for this tag (several pipelines on one broker)",
    )
    p.add_argument(
        "--request-layout",
        type=int,
        choices=(1, 2),
        default=2,
        help="layout request rows are written in (default 2; 1 while a replica of a release "
        "that reads only layout 1 still runs)",
    )


def request_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("request_id", nargs="?", default="", help="e.g. request/monorepo/main/7")
    p.add_argument("--queue", help="with --uri: the request of this head")
    p.add_argument("--uri", help="with --queue: the head (commit) whose request is meant")


def webhook_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``webhook``; its secrets come from files or the environment, never
    from a flag."""
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, required=True, help="port to listen on")
    p.add_argument(
        "--ref", required=True, action="append", help="branch to follow, e.g. main (repeatable)"
    )
    p.add_argument("--queue", required=True, action="append", help="queue of each --ref")
    p.add_argument(
        "--repository", default="", help="the forge's owner/name to take pushes from (default any)"
    )
    p.add_argument("--git-repo", help="a local clone to read a push's commits from")
    p.add_argument(
        "--github-secret-file", metavar="FILE", help=f"GitHub's secret (env {ENV_GITHUB_SECRET})"
    )
    p.add_argument(
        "--gitlab-token-file", metavar="FILE", help=f"GitLab's token (env {ENV_GITLAB_TOKEN})"
    )
    p.add_argument(
        "--max-body",
        type=int,
        default=4 * 1024 * 1024,
        metavar="BYTES",
        help="largest body taken (default 4 MiB; more is 413)",
    )
    p.add_argument(
        "--rate", type=float, default=10.0, help="requests per second per client (default 10)"
    )
    p.add_argument("--burst", type=int, default=20, help="requests a client may burst (default 20)")
    p.add_argument(
        "--max-connections", type=int, default=64, help="connections at once (default 64)"
    )
    p.add_argument(
        "--max-commits",
        type=int,
        default=1000,
        metavar="N",
        help="commits of one push ingested at most, the newest (default 1000)",
    )


def topology_args(p: argparse.ArgumentParser) -> None:
    """What a command that may create the streams and buckets creates them with."""
    p.add_argument(
        "--replicas",
        type=replicas,
        default=None,
        help=f"replica count of every stream and bucket created (env {REPLICAS_ENV}; "
        "default 1; 3 on a 3-node cluster); an existing one with another count is an error",
    )
    p.add_argument(
        "--retain-dead-letters",
        type=duration,
        default=None,
        metavar="AGE",
        help="discard dead-letter records older than AGE (default: keep them for ever)",
    )
    p.add_argument(
        "--retain-trail",
        type=duration,
        default=None,
        metavar="AGE",
        help="discard decision-trail records older than AGE (default 30d)",
    )
    p.add_argument(
        "--retain-refused-outcomes",
        type=duration,
        default=None,
        metavar="AGE",
        help="drop a queue's refused-outcomes record once none was refused for AGE "
        "(default 7d; set when the bucket is created)",
    )
    p.add_argument(
        "--retain-trail-bytes",
        type=byte_size,
        default=None,
        metavar="SIZE",
        help="keep the decision trail within SIZE, discarding its oldest records (default 1GiB)",
    )


def nats_options(args: argparse.Namespace, *, service: bool = False, url: str = "") -> NatsOptions:
    """The connection options of ``args``; ``ValueError`` for an unusable credential.

    Warnings about how a secret was given are printed here, once, to stderr.
    """
    from .connect import NatsOptions, default_url
    from .secrets import resolve_credentials

    credentials = resolve_credentials(
        user=args.user,
        password=args.password,
        password_file=args.password_file,
        token=args.token,
        token_file=args.token_file,
        nkey=args.nkey,
        creds=args.creds,
    )
    if not getattr(args, "_credential_warnings_shown", False):
        for warning in credentials.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        args._credential_warnings_shown = True
    return NatsOptions(
        url=url or args.nats or default_url(),
        creds=credentials.creds,
        user=credentials.user,
        password=credentials.password,
        token=credentials.token,
        nkey_seed=credentials.nkey_seed,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_hostname=args.tls_hostname,
        first_connect_timeout_s=args.connect_timeout,
        max_reconnect_attempts=-1 if service else 3,
    )


#: Each retention flag (its argparse name) and the Topology setting it sets when given.
RETENTION_SETTINGS = (
    ("retain_dead_letters", "dead_letter_max_age_s"),
    ("retain_trail", "trail_max_age_s"),
    ("retain_refused_outcomes", "refused_outcomes_max_age_s"),
    ("retain_trail_bytes", "trail_max_bytes"),
)


def topology_of(args: argparse.Namespace) -> Topology:
    """The topology the arguments name: tag, replicas (flag, then environment, then 1)
    and retention. ``ValueError`` for a bad environment value."""
    from ...adapters.jetstream import Topology

    settings: dict[str, object] = {
        "replicas": replicas_of(args),
        "request_layout": getattr(args, "request_layout", 2),
    }
    for flag, setting in RETENTION_SETTINGS:
        value = getattr(args, flag, None)
        if value is not None:
            settings[setting] = value
    if args.topology_tag:
        return Topology.isolated(args.topology_tag, **settings)
    return Topology(**settings)  # type: ignore[arg-type]  # values checked by __post_init__


def replicas_of(args: argparse.Namespace) -> int:
    given = getattr(args, "replicas", None)
    if given is not None:
        return int(given)
    text = os.environ.get(REPLICAS_ENV, "").strip()
    if not text:
        return 1
    try:
        return replicas(text)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"{REPLICAS_ENV}: {exc}") from None


def ack_wait_of(args: argparse.Namespace) -> float:
    """The ack wait: flag, then environment, then the default. ``ValueError`` if bad."""
    if args.ack_wait is not None:
        return float(args.ack_wait)
    text = os.environ.get(ACK_WAIT_ENV, "").strip()
    try:
        return parse_duration(text or DEFAULT_ACK_WAIT)
    except ValueError as exc:
        raise ValueError(f"{ACK_WAIT_ENV}: {exc}") from None

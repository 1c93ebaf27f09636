"""The flags of ``webhook`` (no nats code imported: the parser is the same without the
``nats`` extra). Its secrets come from files or the environment, never from a flag."""

from __future__ import annotations

import argparse

ENV_GITHUB_SECRET = "STOVEPIPE_GITHUB_WEBHOOK_SECRET"
ENV_GITLAB_TOKEN = "STOVEPIPE_GITLAB_WEBHOOK_TOKEN"


def webhook_args(p: argparse.ArgumentParser) -> None:
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

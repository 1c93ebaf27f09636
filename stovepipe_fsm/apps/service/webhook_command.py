"""The ``webhook`` command: its flags, its secrets, and the server's life.

A secret is read from a file (``--github-secret-file``, ``--gitlab-token-file``) or the
environment (``STOVEPIPE_GITHUB_WEBHOOK_SECRET``, ``STOVEPIPE_GITLAB_WEBHOOK_TOKEN``),
never from the command line, and is never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from ...adapters.jetstream import open_cell
from ...adapters.jetstream.deliveries import KvDeliveries
from ...adapters.jetstream.ref_cursors import KvRefCursors
from ...adapters.jetstream.topology import ensure_bucket
from ...domain.queue_names import normalize_queue_name
from .arguments import nats_options, topology_of
from .bounded_http import HttpLimits
from .connect import connected
from .operators import ingest_on
from .secrets import read_secret_file
from .webhook import WebhookServer, WebhookSettings, full_ref
from .webhook_arguments import ENV_GITHUB_SECRET, ENV_GITLAB_TOKEN


def _secret(path: str | None, flag: str, env_name: str) -> bytes | None:
    if path:
        secret, warnings = read_secret_file(path, flag)
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        return secret.encode()
    value = os.environ.get(env_name)
    return value.encode() if value else None


def webhook_settings(args: argparse.Namespace) -> WebhookSettings:
    """What the flags ask for; ``ValueError`` saying what is wrong."""
    if len(args.ref) != len(args.queue):
        raise ValueError(
            f"webhook takes one --queue per --ref; got {len(args.ref)} --ref and "
            f"{len(args.queue)} --queue"
        )
    github = _secret(args.github_secret_file, "--github-secret-file", ENV_GITHUB_SECRET)
    gitlab = _secret(args.gitlab_token_file, "--gitlab-token-file", ENV_GITLAB_TOKEN)
    if github is None and gitlab is None:
        raise ValueError(
            f"give --github-secret-file or {ENV_GITHUB_SECRET}, --gitlab-token-file or "
            f"{ENV_GITLAB_TOKEN}: a webhook is never taken unauthenticated"
        )
    for name, value in (
        ("--max-body", args.max_body),
        ("--burst", args.burst),
        ("--max-connections", args.max_connections),
        ("--max-commits", args.max_commits),
    ):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if args.rate <= 0:
        raise ValueError(f"--rate must be positive, got {args.rate}")
    return WebhookSettings(
        follows={
            full_ref(ref): normalize_queue_name(queue)
            for ref, queue in zip(args.ref, args.queue, strict=True)
        },
        github_secret=github,
        gitlab_token=gitlab,
        repository=args.repository,
        git_repo=Path(args.git_repo) if args.git_repo else None,
        max_body_bytes=args.max_body,
        rate_per_s=args.rate,
        burst=args.burst,
        max_commits=args.max_commits,
    )


async def run_webhook(args: argparse.Namespace, stop: asyncio.Event) -> None:
    settings = webhook_settings(args)
    topology = topology_of(args)
    async with connected(nats_options(args, service=True)) as nc:
        js = nc.jetstream()
        ingest = await ingest_on(js, topology, args.machines)
        await ensure_bucket(js, topology.deliveries_bucket_spec())
        deliveries = KvDeliveries(await open_cell(js, topology.deliveries_bucket))
        cursors = KvRefCursors(await open_cell(js, topology.service_bucket))
        limits = HttpLimits(max_connections=args.max_connections)
        server = await WebhookServer(
            ingest, deliveries, cursors, settings, args.port, args.host, limits
        ).start()
        print(f"webhook endpoint on http://{server.host}:{server.port}", flush=True)
        try:
            await stop.wait()
        finally:
            await server.close()

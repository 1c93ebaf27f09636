"""``webhook``: push events of GitHub and GitLab, every commit pushed handed to ingest.

``POST /github`` and ``POST /gitlab`` (a forge without a secret configured is 404).
A request is answered in this order, the cheap refusals first:

1. over the client's rate: 429 with ``Retry-After``, before anything is read;
2. GitLab's token is checked from the head, GitHub's signature once the body is read
   (401 when missing or wrong: nothing is believed, nothing ingested); the body must
   have a ``Content-Length`` of at most ``max_body_bytes`` (411, 413) and arrive within
   the deadline (408);
3. ``ping`` is answered, any other event but a push is ignored (202);
4. a delivery id already ingested is answered ``"duplicate": true`` and ingests
   nothing; a push of another repository than the one followed, of a ref not followed
   (a tag, another branch) or deleting its branch is ignored (202);
5. the push's commits are ingested in one batch, oldest first, into the queue its ref
   is followed into (``--ref`` with ``--queue``, as for ``poll``), and only then is the
   delivery id recorded: a crash between the two lets the forge's repeat in, which
   ingest's dedup on (queue, uri) turns into nothing new.

Which commits: a new branch, its tip only (as ``poll``'s first round). With a clone
configured that holds ``after``: the first-parent commits from ``before`` to ``after``
read from git, the commits a merge brought in left out; when ``before`` is not an
ancestor (a force-push), the new tip only, as a return to it (``at_head``). Without a
clone (or one behind the forge): the commits the payload lists, oldest first; a forced
push, its tip only. The forges list at most 20 commits; GitLab says how many the push
held, and the ones not listed are reported as ``unlisted`` and logged (configure a clone
to ingest them). At most ``max_commits`` per push, the newest; the older ones are
reported as ``skipped``. Except on a force-push, a head is never a return.

A late push never moves trunk validation backwards: a push older than the commit the
ref was reported at is answered ``"stale": true`` (202), recorded as delivered, and
ingests nothing (:mod:`.push_order` decides, on the ref's cursor shared with ``poll``).

The command (:func:`run_webhook`) reads each secret from a file (``--github-secret-file``,
``--gitlab-token-file``) or the environment, never from the command line, and never
prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ...adapters.git import GitSourceControl, rev_parse
from ...adapters.jetstream import open_cell
from ...adapters.jetstream.deliveries import KvDeliveries
from ...adapters.jetstream.ref_cursors import KvRefCursors, full_ref
from ...adapters.jetstream.topology import ensure_bucket
from ...domain.errors import NotFound, Retryable, StovepipeError
from ...domain.queue_names import normalize_queue_name
from ...pipeline.ingest import Head, Ingest
from .arguments import ENV_GITHUB_SECRET, ENV_GITLAB_TOKEN, nats_options, topology_of
from .bounded_http import LOOPBACK, Answer, BoundedHttpServer, HttpLimits, RequestHead
from .connect import connected
from .operators import ingest_on
from .push_events import (
    GITHUB,
    GITLAB,
    BadEvent,
    PushEvent,
    Unauthenticated,
    check_github_signature,
    check_gitlab_token,
    delivery_id,
    event_name,
    parse_push,
)
from .push_order import PushOrder
from .rate_limit import RateLimit
from .secrets import read_secret_file

log = logging.getLogger("stovepipe_fsm.webhook")

JSON = "application/json"


__all__ = ["WebhookServer", "WebhookSettings", "full_ref", "run_webhook"]


@dataclass(frozen=True)
class WebhookSettings:
    #: Full ref (``refs/heads/main``) -> queue its commits are ingested into.
    follows: Mapping[str, str]
    github_secret: bytes | None = None
    gitlab_token: bytes | None = None
    #: The forge's repository name (``owner/name``) pushes are taken from; "" any.
    repository: str = ""
    #: A local clone read for the commits of a push (first-parent, beyond the payload).
    git_repo: Path | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    body_deadline_s: float = 10.0
    rate_per_s: float = 10.0
    burst: int = 20
    max_commits: int = 1_000


@dataclass(frozen=True)
class _Commits:
    commits: tuple[str, ...]
    source: str
    #: The tip is a return to it (a force-push): ingested ``at_head``.
    forced: bool = False
    skipped: int = 0
    unlisted: int = 0


def _json(status: str, document: dict[str, object]) -> Answer:
    return Answer(status, json.dumps(document) + "\n", JSON)


class WebhookServer(BoundedHttpServer):
    allowed_methods = "POST"
    title = "webhook endpoint"

    def __init__(
        self,
        ingest: Ingest,
        deliveries: KvDeliveries,
        cursors: KvRefCursors,
        settings: WebhookSettings,
        port: int,
        host: str = LOOPBACK,
        limits: HttpLimits | None = None,
    ) -> None:
        super().__init__(port, host, limits)
        self.ingest = ingest
        self.deliveries = deliveries
        self.order = PushOrder(ingest, cursors, settings.git_repo)
        self.settings = settings
        self.rate = RateLimit(settings.rate_per_s, settings.burst)

    async def handle(self, head: RequestHead, reader: asyncio.StreamReader) -> Answer:
        forge = {"/github": GITHUB, "/gitlab": GITLAB}.get(head.path.partition("?")[0])
        secret = {GITHUB: self.settings.github_secret, GITLAB: self.settings.gitlab_token}.get(
            forge or ""
        )
        if forge is None or secret is None:
            return Answer("404 Not Found", "not found\n")
        if head.method != "POST":
            return Answer("405 Method Not Allowed", "POST a push event\n")
        wait = self.rate.allow(head.client)
        if wait:
            retry = str(max(1, math.ceil(wait)))
            return Answer("429 Too Many Requests", "slow down\n", headers=(("Retry-After", retry),))
        try:
            if forge == GITLAB:
                check_gitlab_token(secret, head.headers)
            body = await self.read_body(
                head,
                reader,
                max_bytes=self.settings.max_body_bytes,
                deadline_s=self.settings.body_deadline_s,
            )
            if forge == GITHUB:
                check_github_signature(secret, body, head.headers)
        except Unauthenticated as exc:
            log.warning("%s webhook from %s refused: %s", forge, head.client or "?", exc)
            return Answer("401 Unauthorized", f"{exc}\n")
        try:
            return await self._event(forge, head.headers, body)
        except BadEvent as exc:
            return Answer("400 Bad Request", f"{exc}\n")
        except StovepipeError as exc:  # the broker or git is away: the forge may repeat
            log.warning("%s webhook: %s: %s", forge, type(exc).__name__, exc)
            return Answer("503 Service Unavailable", f"not ingested, send it again: {exc}\n")

    async def _event(self, forge: str, headers: Mapping[str, str], body: bytes) -> Answer:
        event = event_name(forge, headers)
        if event == "ping":
            return _json("200 OK", {"pong": True})
        if event != "push":
            return _json("202 Accepted", {"ignored": f"event {event[:64]!r} is not a push"})
        delivery = delivery_id(forge, headers)
        push = parse_push(forge, delivery, body)
        ignored = self._ignored(push)
        if ignored:
            return _json("202 Accepted", {"delivery": delivery, "ignored": ignored})
        queue = self.settings.follows[push.ref]
        if await self.deliveries.seen(forge, delivery):
            return _json("200 OK", {"delivery": delivery, "duplicate": True})
        cursor, plan = await asyncio.gather(
            self.order.cursors.read(queue, push.ref), self._commits(push)
        )
        stale = await self.order.stale(queue, push, cursor, forced=plan.forced)
        if stale:
            return await self._answer_stale(forge, queue, push, stale)
        if plan.source == "payload" and await self.order.rolls_back(queue, push, cursor):
            plan = _Commits((push.after,), plan.source, forced=True)
        heads = [
            Head(queue, commit, at_head=plan.forced and commit == push.after)
            for commit in plan.commits
        ]
        results = await self.ingest.ingest_many(heads)
        ingested = [
            {"uri": commit, "request_id": result.request_id, "created": result.created}
            for commit, result in zip(plan.commits, results, strict=True)
        ]
        report: dict[str, object] = {
            "delivery": delivery,
            "queue": queue,
            "ref": push.ref,
            "before": push.before,
            "after": push.after,
            "source": plan.source,
            "forced": plan.forced,
            "ingested": ingested,
            "skipped": plan.skipped,
            "unlisted": plan.unlisted,
        }
        await self.order.advance(queue, push, cursor, plan.commits, forced=plan.forced)
        await self.deliveries.record(forge, delivery, json.dumps(report).encode())
        if plan.unlisted or plan.skipped:
            log.warning(
                "%s push %s to %s: %d commit(s) not listed by the payload, %d skipped past "
                "the bound; ingested %d up to %s",
                forge,
                delivery,
                push.ref,
                plan.unlisted,
                plan.skipped,
                len(ingested),
                push.after,
            )
        return _json("200 OK", {**report, "duplicate": False})

    async def _answer_stale(self, forge: str, queue: str, push: PushEvent, why: str) -> Answer:
        """Nothing ingested; the delivery recorded, so a repeat is a duplicate (and the
        warning is logged once)."""
        report: dict[str, object] = {
            "delivery": push.delivery,
            "queue": queue,
            "ref": push.ref,
            "before": push.before,
            "after": push.after,
            "stale": True,
            "why": why,
        }
        await self.deliveries.record(forge, push.delivery, json.dumps(report).encode())
        log.warning(
            "%s push %s to %s is stale, nothing ingested: %s", forge, push.delivery, push.ref, why
        )
        return _json("202 Accepted", {**report, "duplicate": False})

    def _ignored(self, push: PushEvent) -> str:
        """Why the push is not ingested ("" when it is)."""
        wanted = self.settings.repository
        if wanted and push.repository.lower() != wanted.lower():
            return f"repository {push.repository!r} is not followed"
        if push.ref not in self.settings.follows:
            return f"ref {push.ref!r} is not followed"
        if push.deleted:
            return f"ref {push.ref!r} was deleted"
        return ""

    async def _commits(self, push: PushEvent) -> _Commits:
        tip = (push.after,)
        if push.created:
            return _Commits(tip, "tip")
        from_git = await self._from_git(push)
        if from_git is not None:
            return from_git
        if push.forced:
            return _Commits(tip, "payload", forced=True)
        listed = push.commits if push.commits[-1:] == tip else (*push.commits, push.after)
        keep = listed[-self.settings.max_commits :]
        return _Commits(keep, "payload", skipped=len(listed) - len(keep), unlisted=push.unlisted)

    async def _from_git(self, push: PushEvent) -> _Commits | None:
        """The push's commits read from the configured clone; None without a clone or
        when it does not hold ``after`` (yet)."""
        path = self.settings.git_repo
        if path is None:
            return None
        try:
            await rev_parse(path, push.after)
            found = await GitSourceControl(path, cache_size=0).first_parents_since(
                push.before, push.after, limit=self.settings.max_commits, newest=True
            )
        except (NotFound, Retryable) as exc:
            log.info(
                "push %s: the clone cannot tell its commits (%s); using the payload",
                push.delivery,
                exc,
            )
            return None
        if found is None:  # before is no ancestor of after: a force-push
            return _Commits((push.after,), "git", forced=True)
        return _Commits(found.commits or (push.after,), "git", skipped=found.pending)


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

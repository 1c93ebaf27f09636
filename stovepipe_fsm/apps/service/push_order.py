"""Whether a push is older than the commit its ref was reported at, and moving that
commit (the ref's cursor, shared with ``poll``: :mod:`...adapters.jetstream.ref_cursors`).

Forges do not order their deliveries: one retried, or redelivered by hand, can arrive
after a newer push was ingested, and ingested then it would take newer request ids and
move trunk validation backwards. A push is *stale* when it is not forced, does not start
at the cursor, and its ``after`` is the cursor or behind it: with a clone, an ancestor of
the cursor; without one (or one that lacks either commit), a commit the cursor knows it
descends from (a ``before`` or listed commit of the pushes that moved it) or one already
ingested into the queue. A forced push (GitHub's ``forced``; with a clone, ``before`` no
ancestor of ``after``) is never stale, nor is one that starts at the cursor: landing on
an older commit, it is a rollback (GitLab does not say ``forced``).

The cursor moves by compare-and-set after the push's commits were ingested. A write lost
to another delivery reads the cursor again and tries again, unless it has passed this
push; then, if a commit known to be older than the head the cursor stands at took the
newer id in the race, that head is ingested again ``at_head`` so that it stays
``latest``. A newer head of another origin (an operator's ingest) is left alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ...adapters.git import GitSourceControl
from ...adapters.jetstream.ref_cursors import WEBHOOK, KvRefCursors, RefCursor
from ...domain.errors import NotFound, Retryable
from ...pipeline.ingest import Ingest
from .push_events import PushEvent

log = logging.getLogger("stovepipe_fsm.webhook")

#: Compare-and-set attempts on a ref's cursor before the delivery is answered 503.
CURSOR_ATTEMPTS = 16


@dataclass(frozen=True)
class PushOrder:
    ingest: Ingest
    cursors: KvRefCursors
    git_repo: Path | None

    async def stale(self, queue: str, push: PushEvent, cursor: RefCursor, *, forced: bool) -> str:
        """Why the push is older than the commit the ref was reported at ("" when not)."""
        if forced or push.forced or not cursor.commit or push.before == cursor.commit:
            return ""
        at = f"{push.ref} was reported at {cursor.commit}"
        if push.after == cursor.commit:
            return f"after {push.after} is the commit {at}"
        ancestor = await self._is_ancestor(push.after, cursor.commit)
        if ancestor is not None:
            return f"after {push.after} is an ancestor of {cursor.commit}: {at}" if ancestor else ""
        if cursor.covers(push.after):
            return f"after {push.after} is older than {cursor.commit}, as a push since said: {at}"
        if await self.ingest.uri_index.get(queue, push.after) is not None:
            return f"after {push.after} was ingested into {queue} before; {at}"
        return ""

    async def rolls_back(self, queue: str, push: PushEvent, cursor: RefCursor) -> bool:
        """The push starts at the cursor and lands on a commit known to be older: a
        force-push back to it, whether or not the forge says so."""
        if push.before != cursor.commit:
            return False
        if cursor.covers(push.after):
            return True
        return await self.ingest.uri_index.get(queue, push.after) is not None

    async def advance(
        self,
        queue: str,
        push: PushEvent,
        cursor: RefCursor,
        commits: tuple[str, ...],
        *,
        forced: bool,
    ) -> None:
        """Move the ref's cursor from ``cursor`` to the push's ``after``, once its
        ``commits`` (oldest first) were ingested."""
        named = () if forced else (*commits[-2::-1], push.before)
        older = tuple(c for c in named if c.strip("0"))
        read, conflicted = cursor, False
        for _ in range(CURSOR_ATTEMPTS):
            continues = await self._continues(push, read, forced=forced)
            if await self.cursors.advance(
                read, push.after, reporter=WEBHOOK, older=older, continues=continues
            ):
                standing = push.after
                passed = {*older, *((read.commit, *read.behind) if continues else ())}
                break
            conflicted = True
            read = await self.cursors.read(queue, push.ref)
            if await self.stale(queue, push, read, forced=forced):
                standing, passed = read.commit, {*commits, *read.behind}
                break
        else:
            raise Retryable(f"the cursor of {push.ref} on {queue} kept moving; not recorded")
        if conflicted:
            log.info(
                "push %s to %s: raced another writer; %s stands", push.delivery, push.ref, standing
            )
            await self._restore(queue, standing, passed - {standing})

    async def _continues(self, push: PushEvent, cursor: RefCursor, *, forced: bool) -> bool:
        """The push's ``after`` is known to descend from the cursor."""
        if forced or not cursor.commit:
            return False
        if push.before == cursor.commit:
            return True
        return bool(await self._is_ancestor(cursor.commit, push.after))

    async def _restore(self, queue: str, standing: str, older: set[str]) -> None:
        """Make ``standing`` the queue's head again when a commit known to be older
        took a newer id."""
        latest = (await self.ingest.queues.get(queue)).latest_request_id
        if latest and (await self.ingest.requests.get(latest)).uri in older:
            await self.ingest.ingest(queue, standing, at_head=True)

    async def _is_ancestor(self, ancestor: str, descendant: str) -> bool | None:
        """What the clone says; None without one, or when it cannot tell."""
        if self.git_repo is None:
            return None
        try:
            source = GitSourceControl(self.git_repo, cache_size=0)
            return await source.is_ancestor(ancestor, descendant)
        except (NotFound, Retryable) as exc:
            log.info("the clone cannot tell %s from %s: %s", ancestor, descendant, exc)
            return None

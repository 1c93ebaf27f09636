"""Where each followed ref stands: the commit reported last for it, in the service bucket.

``poll`` and ``webhook`` both report a ref's commits to ingest and share this one cursor
per (queue, ref): ``poll`` ingests the first-parent commits the ref gained since it, and
``webhook`` answers a push that names the cursor or a commit behind it as stale, so a
late delivery never moves trunk validation backwards. The cursor must outlive both: a
restarted poller neither re-reads a range already ingested nor skips one.

One key per (queue, ref), the ref by its full name (``main`` and ``refs/heads/main`` are
one ref); every write is a compare-and-set on the revision read, so of two writers the
slower learns that the other moved the cursor first and reads it again. The value also
says who reported the commit (``poll`` from its clone, ``webhook`` from a push) and keeps
a bounded list of commits known to be older than it (``behind``), for a webhook without
a clone to recognise a late push by.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from ...domain.errors import AlreadyExists, NonRetryable, VersionMismatch
from .kv_cell import KvCell
from .names import encode_queue_token

CURSOR_KEY_PREFIX = "ref."
POLL = "poll"
WEBHOOK = "webhook"
#: Commits known to be older than the cursor that it keeps, the newest first.
MAX_BEHIND = 64


def full_ref(ref: str) -> str:
    """A branch name as the forges name it (``main`` -> ``refs/heads/main``)."""
    return ref if ref.startswith("refs/") else f"refs/heads/{ref}"


@dataclass(frozen=True)
class RefCursor:
    """The commit reported last for ``ref`` into ``queue``; ``revision`` 0: none yet."""

    queue: str
    ref: str
    commit: str = ""
    revision: int = 0
    #: Who reported ``commit``: ``poll`` or ``webhook``.
    reporter: str = ""
    #: Commits known to be older than ``commit`` (it descends from them), newest first.
    behind: tuple[str, ...] = ()

    def covers(self, commit: str) -> bool:
        """``commit`` is the cursor or a commit it is known to descend from."""
        return bool(commit) and (commit == self.commit or commit in self.behind)


def cursor_key(queue: str, ref: str) -> str:
    digest = hashlib.sha256(full_ref(ref).encode()).hexdigest()[:24]
    return f"{CURSOR_KEY_PREFIX}{encode_queue_token(queue)}.{digest}"


class KvRefCursors:
    def __init__(self, cell: KvCell) -> None:
        self._cell = cell

    async def read(self, queue: str, ref: str) -> RefCursor:
        entry = await self._cell.read_optional(cursor_key(queue, ref))
        if entry is None:
            return RefCursor(queue, ref)
        try:
            value = json.loads(entry.value)
            commit, reporter = value["commit"], value.get("reporter", POLL)
            behind = value.get("behind", [])
            if (value["queue"], value["ref"]) != (queue, full_ref(ref)):
                raise ValueError(f"it names {value['queue']!r} {value['ref']!r}")
            if not isinstance(commit, str) or not isinstance(reporter, str):
                raise ValueError("its commit or reporter is not a string")
            if not isinstance(behind, list) or not all(isinstance(c, str) for c in behind):
                raise ValueError("its behind is not a list of commits")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise NonRetryable(
                f"ref cursor of {queue!r} {ref!r} in {self._cell.bucket} is damaged: {exc}"
            ) from None
        return RefCursor(queue, ref, commit, entry.revision, reporter, tuple(behind))

    async def advance(
        self,
        read: RefCursor,
        commit: str,
        *,
        reporter: str,
        older: Iterable[str] = (),
        continues: bool = True,
    ) -> bool:
        """Store ``commit`` as where ``read``'s ref stands, if nobody moved it since
        ``read``; False when someone did (their cursor stands).

        ``older``: commits the reporter knows ``commit`` descends from; with them, the
        ones ``read`` knew when ``commit`` ``continues`` from ``read``'s (not after a
        force-push, nor when the order is unknown).
        """
        known = (*older, *((read.commit, *read.behind) if continues else ()))
        behind = [c for c in dict.fromkeys(known) if c and c != commit][:MAX_BEHIND]
        key = cursor_key(read.queue, read.ref)
        value = {
            "queue": read.queue,
            "ref": full_ref(read.ref),
            "commit": commit,
            "reporter": reporter,
            "behind": behind,
        }
        encoded = json.dumps(value).encode()
        try:
            await self._cell.write(key, encoded, read.revision)
        except (AlreadyExists, VersionMismatch):
            return False
        return True

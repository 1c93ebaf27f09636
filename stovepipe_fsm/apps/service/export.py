"""``export``: a live deployment's recorded run as a timeline ``simulate`` and ``whatif``
replay (what it holds: :mod:`.recorded_run`).

It reads the request rows, the policy record (which state is which outcome), the
decision trail of every request that ended without a build and the operator verbs about
queues, and, from the repository each queue is configured with (``--config``) or the one
``--git-repo`` names, the commits between the exported heads (real parents, changes).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping
from typing import Any

import yaml
from nats.js import JetStreamContext

from ...adapters.git.history import RecordedHistory, read_history
from ...adapters.jetstream import Topology
from ...adapters.jetstream.codec import decode_queue, decode_request
from ...adapters.jetstream.decision_trail import JetStreamTrail
from ...adapters.jetstream.policy_record import read_policy_record
from ...config.globs import glob_match
from ...domain.entities import Request
from ...simulation.timeline_lines import SUFFIXES, timeline_lines
from ..options import load_policy_store
from .arguments import parse_duration
from .operators import decoded_rows
from .recorded_run import Export, Recorded, recorded_timeline


def export_format(requested: str | None, out: str | None) -> str:
    """The format to write: the one asked for, else JSON lines for an ``--out`` named
    ``*.jsonl`` (or ``*.ndjson``), else YAML."""
    if requested:
        return requested
    return "jsonl" if out and out.lower().endswith(SUFFIXES) else "yaml"


def render_timeline(timeline: dict[str, Any], fmt: str) -> str:
    """The timeline as a file's text: YAML, or JSON lines (one header, a line per commit
    and per step), which ``simulate`` and ``whatif`` read without a YAML parser."""
    if fmt == "jsonl":
        return "".join(f"{line}\n" for line in timeline_lines(timeline))
    return yaml.safe_dump(timeline, sort_keys=False, allow_unicode=True)


def parse_since(text: str, now: datetime.datetime) -> int:
    """Epoch milliseconds of ``--since``: an ISO time (``2026-11-30T12:00:00Z``) or an age
    before ``now`` (``2h``, ``7d``). ``ValueError`` saying what is accepted."""
    try:
        return int((now.timestamp() - parse_duration(text)) * 1000)
    except ValueError:
        pass
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--since {text!r} is neither an ISO time (2026-11-30T12:00:00Z) nor an age "
            "(90m, 12h, 7d)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


async def export_timeline(
    js: JetStreamContext,
    topology: Topology,
    *,
    since_ms: int,
    queue_glob: str,
    repositories: Mapping[str, str] | None = None,
) -> Export:
    """Read what the deployment recorded; build the timeline up to now. ``repositories``:
    queue -> the git repository its history is read from (a queue without one is taken as
    first-parent trunk, each head a child of the last)."""
    # Damaged rows are left out: status lists them; a history cannot use them.
    requests = await decoded_rows(js, topology.requests_bucket, decode_request, [])
    requests = [r for r in requests if glob_match(queue_glob, r.queue)]
    record = await read_policy_record(js, topology)
    declared = record.outcomes if record is not None else {}
    outcome_of_state = {state: name for name, states in declared.items() for state in states}
    trail = JetStreamTrail(js, topology)
    trails = {}
    for r in requests:
        # A head that ended and was not superseded may have been dead-lettered or
        # cancelled (the trail says); a superseded one cannot, and its trail is not read.
        if r.ingested_at_ms >= since_ms and r.ended_at_ms and not r.superseded_by:
            trails[r.id] = await trail.history(r.id)
    queue_verbs = await trail.operator_records()
    history = await _history(requests, since_ms, repositories or {})
    since = datetime.datetime.fromtimestamp(since_ms / 1000, datetime.UTC)
    said = (
        "real parents and changes from the repository"
        if history is not None
        else "history assumes each head descends from the one ingested before it on its queue"
    )
    description = (
        f"exported from {topology.prefix} since {since.strftime('%Y-%m-%dT%H:%M:%SZ')} "
        f"for queues {queue_glob}: recorded heads, builds and operator verbs at their "
        f"relative times; {said}"
    )
    recorded = Recorded(requests, outcome_of_state, trails, queue_verbs, history)
    end = int(time.time() * 1000)
    return recorded_timeline(
        recorded, since_ms=since_ms, until_ms=end, queue_glob=queue_glob, description=description
    )


async def _history(
    requests: list[Request], since_ms: int, repositories: Mapping[str, str]
) -> RecordedHistory | None:
    """The commits of the exported heads, read from their queues' repositories (one
    read per repository); ``None`` when no exported queue has one."""
    heads: dict[str, list[str]] = {}
    for r in requests:
        repo = repositories.get(r.queue)
        if repo and r.ingested_at_ms >= since_ms:
            heads.setdefault(repo, []).append(r.uri)
    if not heads:
        return None
    parents: dict[str, list[str]] = {}
    changes: dict[str, dict[str, str]] = {}
    unknown: list[str] = []
    for repo, uris in sorted(heads.items()):
        read = await read_history(repo, uris)
        for commit, commit_parents in read.parents.items():
            parents.setdefault(commit, commit_parents)
        for commit, paths in read.changes.items():
            changes.setdefault(commit, paths)
        unknown += read.unknown
    return RecordedHistory(parents, changes, tuple(unknown))


async def exported_queues(js: JetStreamContext, topology: Topology, queue_glob: str) -> list[str]:
    """The queues ``queue_glob`` matches that have a row."""
    queues = await decoded_rows(js, topology.queues_bucket, decode_queue, [])
    return sorted(q.name for q in queues if glob_match(queue_glob, q.name))


def repositories_of(
    queues: list[str], config_path: str | None, git_repo: str | None
) -> dict[str, str]:
    """queue -> the repository to read its history from: ``git_repo`` for every queue,
    else each queue's ``repository`` in ``config_path``."""
    if git_repo:
        return {queue: git_repo for queue in queues}
    if not config_path:
        return {}
    store = load_policy_store(config_path)
    found = {}
    for queue in queues:
        repository = store.get(queue).repository
        if repository:
            found[queue] = repository
    return found

"""The decision trail: one record per decision about a request, for ``explain``.

Every decision of the process stage (held, superseded, skipped, admitted - with why its
strategy was chosen -, an older head's running build preempted, a slot reclaimed from a
request whose end had not freed it), every failed attempt that is retried (kind
``attempt_failed``: the error, the attempt and the budget, when the next try is due),
every recorded end (an outcome, a request failed
closed), ingest and every operator verb (``pause``, ``resume``, ``cancel``, ``retry``,
``dlq replay``, ``dlq prune``: kind ``operator``, with the verb and who ran it) append one
:class:`TrailRecord`, and so does a plugin's trail note (kind ``plugin``: the plugin,
what it noted, and its own detail pairs). A verb about a queue or a glob of queues
(pause, resume, dlq prune) has no request: its ``request_id`` is empty and ``queue``
holds the pattern. Each carries the time (clock port), the queue, the request, the
delivery's stream sequence (0 when no delivery made it) and the policy hash in force.

A record's :attr:`~TrailRecord.key` says which decision it is, so writing it twice (a
redelivery after a crash between the decision's write and the trail's) is one record.
Holds collapse: holds of one request for the same reason are one record with a
``count`` and the first and last time, not one record per wake-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

INGESTED = "ingested"
HELD = "held"
SUPERSEDED = "superseded"
PREEMPTED = "preempted"
SKIPPED = "skipped"
ADMITTED = "admitted"
ENDED = "ended"
DEAD_LETTERED = "dead_lettered"
ATTEMPT_FAILED = "attempt_failed"
RECLAIMED = "reclaimed"
OPERATOR = "operator"
PLUGIN = "plugin"
#: A culprit search started a probe build (about the probe), and where a search stands
#: after a build ended (about the red head it searches for).
PROBE_STARTED = "probe_started"
CULPRIT = "culprit"
KINDS: tuple[str, ...] = (INGESTED, HELD, SUPERSEDED, PREEMPTED, SKIPPED, ADMITTED, ENDED)
KINDS += (DEAD_LETTERED, ATTEMPT_FAILED, RECLAIMED, OPERATOR, PLUGIN, PROBE_STARTED, CULPRIT)


def decision_key(kind: str, request_id: str, tag: str = "") -> str:
    """The key of the decision ``kind`` about ``request_id`` (:attr:`TrailRecord.key`)."""
    return f"{kind}|{request_id}|{tag}"


@dataclass(frozen=True)
class TrailRecord:
    """One decision about one request, and why."""

    kind: str
    queue: str
    request_id: str
    at_ms: int
    #: What was decided and why, as text pairs (reason, by, strategy, base, ...).
    detail: tuple[tuple[str, str], ...] = ()
    #: Which transition of the request this record is about (its version), so that a
    #: repeat of the same decision has the same key; the hold reason for a hold.
    tag: str = ""
    stream_seq: int = 0
    policy: str = ""
    count: int = 1
    first_at_ms: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"trail record kind must be one of {KINDS}, got {self.kind!r}")
        if not self.first_at_ms:
            object.__setattr__(self, "first_at_ms", self.at_ms)

    @property
    def key(self) -> str:
        """Which decision this is: equal for a repeat of one decision."""
        return decision_key(self.kind, self.request_id, self.tag)

    @property
    def details(self) -> Mapping[str, str]:
        return dict(self.detail)

    def again(self, later: TrailRecord) -> TrailRecord:
        """This hold, held once more (``later`` has the same key): counted, last time moved."""
        return replace(
            self,
            count=self.count + later.count,
            at_ms=max(self.at_ms, later.at_ms),
            stream_seq=later.stream_seq or self.stream_seq,
            policy=later.policy or self.policy,
            detail=later.detail,
        )

    def as_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "queue": self.queue,
            "request_id": self.request_id,
            "at_ms": self.at_ms,
            "first_at_ms": self.first_at_ms,
            "count": self.count,
            "detail": dict(self.detail),
            "tag": self.tag,
            "stream_seq": self.stream_seq,
            "policy": self.policy,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> TrailRecord:
        detail = data.get("detail", {})
        if not isinstance(detail, Mapping):
            raise ValueError("trail record 'detail' must be an object")
        return cls(
            kind=str(data["kind"]),
            queue=str(data["queue"]),
            request_id=str(data["request_id"]),
            at_ms=_int(data["at_ms"]),
            detail=tuple(sorted((str(k), str(v)) for k, v in detail.items())),
            tag=str(data.get("tag", "")),
            stream_seq=_int(data.get("stream_seq", 0)),
            policy=str(data.get("policy", "")),
            count=_int(data.get("count", 1)),
            first_at_ms=_int(data.get("first_at_ms", 0)),
        )


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"trail record field must be an integer, got {value!r}")
    return value


def detail(**pairs: object) -> tuple[tuple[str, str], ...]:
    """Detail pairs from keyword arguments (empty values left out), sorted."""
    return tuple(sorted((k, str(v)) for k, v in pairs.items() if v not in ("", None)))

"""Names and shapes of every stream, subject and KV bucket the service uses.

One frozen :class:`Topology` value is the whole broker-side contract, so that the service,
the operator commands and the tests agree on names by construction, and a test can run on
a fresh prefix without touching anyone else's streams.

Subjects (``<q>`` is the queue's token from ``names.encode_queue_token``)::

    <prefix>.process.<q>          process work, one durable consumer per queue
    <prefix>.process.<k>.<q>      the same for a queue on partition k >= 1 (below)
    <prefix>.build.<q>            build work, read by the build stage
    <prefix>.hooks.<event type>   hook events (``validation.repository.started`` ...)
    <prefix>.outcome.<q>          build outcomes, recorded by the service (outcomes.py)
    <prefix>.trail.<q>.<n>.<kind> the decision trail of request n of queue q (decision_trail.py)
    <prefix>.trail._ops.<digest>  operator verbs about a queue or a glob (pause, resume, ...)
    <prefix>.dlq.<stage>.<q>      dead letters

Partitions of the process stream: the broker caps the consumers of each stream at the
account's JetStream consumer limit, and every queue has a consumer of its own, so past
that limit queues are spread over several process streams. Partition 0 is the process
stream itself; partition k >= 1 is the stream ``<process stream>_<k>`` over the subjects
``<prefix>.process.<k>.*`` (one token more than partition 0's, so the two never
overlap). A queue's row names its partition; the service creates partition streams and
moves a queue to one when its own refuses the queue's consumer (``partitions.py`` of the
service).

:func:`ensure_topology` creates what is missing and *checks* what exists. It never updates
a stream: a stream created by someone else with different subjects, retention, storage
or replica count (or, for dead letters, age limit) is an operator decision this service
must not overwrite, so it stops with an error naming the stream and every differing field.

The replica count and the dead-letter age are checked, not applied in place, although
JetStream could change a stream's replica count on a running cluster: a replica started
with a stale ``--replicas`` or retention setting would otherwise quietly undo what the
operator chose. Changing them is a deliberate stream update, after which every replica
starts with the new settings (docs/service.md, "Clustered deployment").
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields, replace
from functools import partial
from typing import Any

import nats.js.errors
from nats.js import JetStreamContext, api

from ...domain.ids import parse_request_id
from .asked_again import asked_again
from .errors import STREAM_NAME_IN_USE_CODE, TopologyMismatch, translated
from .names import (
    InvalidToken,
    decode_queue_token,
    encode_name_token,
    encode_queue_token,
    encode_token,
)

DEFAULT_PREFIX = "stovepipe"
#: The decision trail's size bound unless one is given: about two weeks at 100,000 heads a day.
DEFAULT_TRAIL_MAX_BYTES = 1 << 30
#: The smallest bound accepted: a few thousand records.
MIN_TRAIL_MAX_BYTES = 1 << 20
DAY_S = 24 * 3600.0
_SIMPLE_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
#: Partitions of the process stream a topology may use: bounds what a forged subject or
#: row can make the service create or look at.
MAX_PARTITIONS = 1_000
#: Partition k's stream numbers its messages from k times this. The attempts and
#: termination ledgers key a process message by its stream sequence, so the partitions'
#: sequences must never meet: each has 10^15 numbers, and the last ends below 2^63.
PARTITION_SEQUENCE_SPAN = 10**15


@dataclass(frozen=True)
class StreamSpec:
    """The configuration this service creates a stream with, and the fields it checks."""

    name: str
    subjects: tuple[str, ...]
    retention: api.RetentionPolicy
    storage: api.StorageType
    replicas: int
    duplicate_window_s: float
    max_age_s: float | None = None
    max_consumers: int | None = None
    #: Lets a publish replace its subject's earlier messages (``Nats-Rollup: sub``).
    allow_rollup: bool = False
    max_bytes: int = -1
    #: The first message's sequence (0: the broker's default, 1); set only at creation.
    first_seq: int = 0
    #: Whether a differing ``max_age`` is a mismatch: only where the service's own
    #: retention setting chose it (dead letters); elsewhere an operator's edit stands.
    owns_max_age: bool = False

    def within_account(self, account_max_consumers: int) -> StreamSpec:
        """This spec with its consumer limit at most the account's, which the broker
        applies to each stream and refuses a stream config above."""
        if (
            self.max_consumers is None
            or account_max_consumers <= 0
            or self.max_consumers <= account_max_consumers
        ):
            return self
        return replace(self, max_consumers=account_max_consumers)

    def to_config(self) -> api.StreamConfig:
        return api.StreamConfig(
            name=self.name,
            subjects=list(self.subjects),
            retention=self.retention,
            storage=self.storage,
            num_replicas=self.replicas,
            duplicate_window=self.duplicate_window_s,
            max_age=self.max_age_s,
            max_consumers=self.max_consumers,
            discard=api.DiscardPolicy.OLD,
            allow_rollup_hdrs=self.allow_rollup,
            max_bytes=self.max_bytes,
            first_seq=self.first_seq or None,
        )

    def differences(self, actual: api.StreamConfig) -> list[str]:
        """Human-readable ``field: have X, want Y`` for each field that matters."""
        diffs: list[str] = []
        have_subjects = sorted(actual.subjects or [])
        if have_subjects != sorted(self.subjects):
            diffs.append(f"subjects: have {have_subjects}, want {sorted(self.subjects)}")
        if _enum_value(actual.retention) != self.retention.value:
            diffs.append(
                f"retention: have {_enum_value(actual.retention)}, want {self.retention.value}"
            )
        diffs += _storage_differences(self.storage, actual)
        if self.allow_rollup and not actual.allow_rollup_hdrs:
            diffs.append("allow_rollup_hdrs: have false, want true (held records roll up)")
        diffs += _replicas_differences(self.replicas, actual)
        if self.owns_max_age and _age(actual.max_age) != _age(self.max_age_s):
            diffs.append(
                f"max_age: have {_age_text(actual.max_age)}, want {_age_text(self.max_age_s)}"
            )
        if (actual.duplicate_window or 0) < self.duplicate_window_s:
            diffs.append(
                f"duplicate_window: have {actual.duplicate_window or 0}s, want at least "
                f"{self.duplicate_window_s}s (Nats-Msg-Id dedup relies on it)"
            )
        return diffs


@dataclass(frozen=True)
class BucketSpec:
    name: str
    storage: api.StorageType
    replicas: int
    history: int
    #: Age after which a key not written since is removed (None: kept). An existing
    #: bucket with another age is not a mismatch: an operator's edit stands.
    max_age_s: float | None = None

    def to_config(self) -> api.KeyValueConfig:
        # direct=False: reads go through the stream leader, so a read after a write on
        # a replicated bucket sees that write (the store contract is read-after-write).
        return api.KeyValueConfig(
            bucket=self.name,
            history=self.history,
            storage=self.storage,
            replicas=self.replicas,
            direct=False,
            ttl=self.max_age_s,
        )

    def differences(self, actual: api.StreamConfig) -> list[str]:
        diffs = _storage_differences(self.storage, actual)
        if actual.max_msgs_per_subject < 1:
            diffs.append(f"history: have {actual.max_msgs_per_subject}, want {self.history}")
        return diffs + _replicas_differences(self.replicas, actual)


@dataclass(frozen=True)
class Topology:
    """Every broker-side name the service uses, plus the shape of what it creates."""

    prefix: str = DEFAULT_PREFIX
    process_stream: str = "STOVEPIPE_PROCESS"
    build_stream: str = "STOVEPIPE_BUILD"
    hooks_stream: str = "STOVEPIPE_HOOKS"
    dead_letter_stream: str = "STOVEPIPE_DLQ"
    outcome_stream: str = "STOVEPIPE_OUTCOMES"
    trail_stream: str = "STOVEPIPE_TRAIL"
    requests_bucket: str = "stovepipe-requests"
    queues_bucket: str = "stovepipe-queues"
    uris_bucket: str = "stovepipe-uris"
    counters_bucket: str = "stovepipe-counters"
    attempts_bucket: str = "stovepipe-attempts"
    #: What the service says about itself (the policy it has in force), for ``status``.
    service_bucket: str = "stovepipe-service"
    #: The push-event deliveries ``webhook`` ingested, by id, for ``delivery_max_age_s``.
    deliveries_bucket: str = "stovepipe-deliveries"
    delivery_max_age_s: float = 7 * DAY_S
    #: Refused build outcomes, one bounded record per queue (refused_outcomes.py).
    refused_bucket: str = "stovepipe-refused"
    #: One culprit search row per queue (machines/culprit.yaml).
    searches_bucket: str = "stovepipe-searches"
    storage: api.StorageType = api.StorageType.FILE
    replicas: int = 1
    #: How long a repeated ``Nats-Msg-Id`` is dropped as a duplicate.
    duplicate_window_s: float = 120.0
    #: Age after which build, hook and outcome messages are discarded.
    message_max_age_s: float = 7 * DAY_S
    #: Age after which dead-letter records are discarded; ``None`` keeps them for ever.
    dead_letter_max_age_s: float | None = None
    #: Age after which a queue's refused-outcomes record, not written since, is removed.
    refused_outcomes_max_age_s: float = 7 * DAY_S
    #: The process stream's consumer limit (one consumer per queue) when it is created.
    #: Set explicitly because nats-server caps streams that leave it unset at 1000
    #: consumers; the service raises it when a new queue reaches it (consumer_limit.py).
    initial_queue_limit: int = 10_000
    kv_history: int = 1
    #: How long the decision trail keeps a record (30 days), and the size it is kept
    #: within (1 GiB; -1: none): at the bound the server discards the oldest records.
    trail_max_age_s: float = 30 * DAY_S
    trail_max_bytes: int = DEFAULT_TRAIL_MAX_BYTES
    #: The layout request rows are written in (both are read; codec.py).
    request_layout: int = 2

    def __post_init__(self) -> None:
        tokens = self.prefix.split(".")
        if not all(_SIMPLE_NAME_RE.match(token) for token in tokens):
            raise ValueError(
                f"subject prefix {self.prefix!r} must be dot-separated tokens of [A-Za-z0-9_-]"
            )
        for name in (*self._names("_stream"), *self._names("_bucket")):
            if not _SIMPLE_NAME_RE.match(name):
                raise ValueError(f"stream/bucket name {name!r} must match [A-Za-z0-9_-]+")
        if self.initial_queue_limit < 1 or self.replicas < 1 or not 1 <= self.kv_history <= 64:
            raise ValueError("initial_queue_limit and replicas must be >= 1, kv_history in 1..64")
        if self.request_layout not in (1, 2):
            raise ValueError(f"request layout must be 1 or 2, got {self.request_layout}")
        if self.dead_letter_max_age_s is not None and self.dead_letter_max_age_s <= 0:
            raise ValueError("dead_letter_max_age_s must be positive (None keeps for ever)")
        if self.refused_outcomes_max_age_s <= 0:
            raise ValueError("refused_outcomes_max_age_s must be positive")
        if self.trail_max_bytes != -1 and self.trail_max_bytes < MIN_TRAIL_MAX_BYTES:
            raise ValueError(
                f"trail_max_bytes must be at least {MIN_TRAIL_MAX_BYTES} (1 MiB), or -1 for "
                f"no bound; got {self.trail_max_bytes}"
            )

    @classmethod
    def isolated(cls, tag: str, **overrides: object) -> Topology:
        """A topology whose every name carries ``tag``: disjoint from any other tag's."""
        if not _SIMPLE_NAME_RE.match(tag):
            raise ValueError(f"topology tag {tag!r} must match [A-Za-z0-9_-]+")
        upper = tag.upper().replace("-", "_")
        names: dict[str, object] = {"prefix": f"{DEFAULT_PREFIX}-{tag}"}
        for field in fields(cls):  # STOVEPIPE_<TAG>_PROCESS, stovepipe-<tag>-requests, ...
            if field.name.endswith("_stream"):
                names[field.name] = str(field.default).replace("STOVEPIPE_", f"STOVEPIPE_{upper}_")
            elif field.name.endswith("_bucket"):
                names[field.name] = str(field.default).replace("stovepipe-", f"stovepipe-{tag}-")
        names.update(overrides)
        return cls(**names)  # type: ignore[arg-type]  # values checked by __post_init__

    # -- subjects ---------------------------------------------------------------------

    def process_subject(self, queue: str, partition: int = 0) -> str:
        """The subject of ``queue``'s process work on ``partition``."""
        token = encode_queue_token(queue)
        if partition == 0:
            return f"{self.prefix}.process.{token}"
        return f"{self.prefix}.process.{_partition_token(partition)}.{token}"

    def process_filter(self, partition: int = 0) -> str:
        """The subjects of ``partition``'s stream."""
        if partition == 0:
            return f"{self.prefix}.process.*"
        return f"{self.prefix}.process.{_partition_token(partition)}.*"

    def process_subjects_filter(self) -> str:
        """Every process subject of every partition."""
        return f"{self.prefix}.process.>"

    def process_stream_of(self, partition: int) -> str:
        """The name of ``partition``'s stream (partition 0: the process stream)."""
        if partition == 0:
            return self.process_stream
        return f"{self.process_stream}_{_partition_token(partition)}"

    def partition_of_process_stream(self, stream: str) -> int | None:
        """The partition ``stream`` is, or None when it is no process stream of ours."""
        if stream == self.process_stream:
            return 0
        head = f"{self.process_stream}_"
        if not stream.startswith(head):
            return None
        partition = _parse_partition(stream[len(head) :])
        return partition or None  # partition 0 has no suffix

    def process_address(self, subject: str) -> tuple[str, int]:
        """The queue and partition of a process subject (inverse of process_subject);
        ``ValueError`` for any other subject."""
        partition, token = self._process_shape(subject)
        if partition is None:
            first = token.partition(".")[0]
            raise ValueError(f"{subject!r} is not a process subject: bad partition {first!r}")
        try:
            return decode_queue_token(token), partition
        except InvalidToken as exc:
            head = f"{self.prefix}.process."
            raise ValueError(f"{subject!r} is not a process subject of {head}*: {exc}") from None

    def process_stream_of_subject(self, subject: str) -> str:
        """The stream a process subject belongs to, read from its shape alone (so also
        for a subject whose queue token decodes to no queue)."""
        partition, _ = self._process_shape(subject)
        return self.process_stream_of(partition or 0)

    def _process_shape(self, subject: str) -> tuple[int | None, str]:
        """A process subject's partition and queue token, the token not decoded: one
        token after ``process`` is partition 0's, two are partition k's (k >= 1). The
        partition is None when its token names none (then the whole rest is returned)."""
        head = f"{self.prefix}.process."
        rest = subject[len(head) :] if subject.startswith(head) else ""
        first, dot, token = rest.partition(".")
        if not dot:
            return 0, first
        partition = _parse_partition(first)
        if not partition:  # partition 0 has no token of its own
            return None, rest
        return partition, token

    def queue_of_process_subject(self, subject: str) -> str:
        """The queue a process message was published for, on any partition."""
        return self.process_address(subject)[0]

    def process_stream_spec(self, partition: int = 0) -> StreamSpec:
        """What a partition's stream is created with: a work queue (each message is
        consumed once by its queue's consumer; the server refuses a second consumer with
        an overlapping filter, so two consumers can never serialize one queue twice)."""
        return StreamSpec(
            name=self.process_stream_of(partition),
            subjects=(self.process_filter(partition),),
            retention=api.RetentionPolicy.WORK_QUEUE,
            storage=self.storage,
            replicas=self.replicas,
            duplicate_window_s=self.duplicate_window_s,
            max_consumers=self.initial_queue_limit,
            first_seq=partition * PARTITION_SEQUENCE_SPAN,
        )

    def process_consumer_name(self, queue: str) -> str:
        """Durable name of the queue's process consumer (a name, so ``/`` is escaped too)."""
        return f"process-{encode_name_token(queue)}"

    def build_subject(self, queue: str) -> str:
        return f"{self.prefix}.build.{encode_queue_token(queue)}"

    def hook_subject(self, event_type: str) -> str:
        tokens = event_type.split(".")
        if not all(_SIMPLE_NAME_RE.match(token) for token in tokens):
            raise ValueError(f"hook event type {event_type!r} is not a dotted name")
        return f"{self.prefix}.hooks.{event_type}"

    def outcome_subject(self, queue: str) -> str:
        return f"{self.prefix}.outcome.{encode_queue_token(queue)}"

    def outcome_filter(self) -> str:
        return f"{self.prefix}.outcome.*"

    def queue_of_outcome_subject(self, subject: str) -> str:
        """The queue an outcome was published for (inverse of outcome_subject);
        ``ValueError`` for any other subject."""
        head = f"{self.prefix}.outcome."
        token = subject[len(head) :] if subject.startswith(head) else ""
        try:
            return decode_queue_token(token)
        except InvalidToken as exc:
            raise ValueError(f"{subject!r} is not a outcome subject of {head}*: {exc}") from None

    def trail_subject(self, request_id: str, kind: str, reason: str = "") -> str:
        """The subject of one request's records of one kind (a hold: of one reason)."""
        parsed = parse_request_id(request_id)
        base = f"{self.prefix}.trail.{encode_queue_token(parsed.queue)}.{parsed.counter}.{kind}"
        if not reason:
            return base
        return f"{base}.{hashlib.sha256(reason.encode()).hexdigest()[:16]}"

    def trail_filter(self, request_id: str) -> str:
        parsed = parse_request_id(request_id)
        return f"{self.prefix}.trail.{encode_queue_token(parsed.queue)}.{parsed.counter}.>"

    def operator_trail_subject(self, pattern: str, key: str) -> str:
        """The subject of one operator verb about queues, not a request (pause, resume,
        dlq prune): ``_ops``, the encoded pattern, a digest of the record's key. ``_ops``
        is no queue's token (``_`` is always escaped), so no request's subject matches
        it, and the pattern's token lets a story read the verbs about its queue alone."""
        digest = hashlib.sha256(key.encode()).hexdigest()[:24]
        return f"{self.operator_trail_prefix()}{encode_token(pattern)}.{digest}"

    def operator_trail_prefix(self) -> str:
        """What every operator verb's subject starts with (a record on ``<this><digest>``,
        one token with no pattern, is read for every story)."""
        return f"{self.prefix}.trail._ops."

    def operator_trail_filter(self) -> str:
        return f"{self.operator_trail_prefix()}>"

    def dead_letter_subject(self, queue: str, stage: str = "process") -> str:
        if not _SIMPLE_NAME_RE.match(stage):
            raise ValueError(f"stage {stage!r} must match [A-Za-z0-9_-]+")
        return f"{self.prefix}.dlq.{stage}.{encode_queue_token(queue)}"

    # -- what ensure_topology creates -------------------------------------------------

    def _names(self, suffix: str, but: str = "") -> tuple[str, ...]:
        """The values of the fields named ``*<suffix>`` (but ``but``), in field order."""
        return tuple(
            getattr(self, f.name) for f in fields(self) if f.name.endswith(suffix) and f.name != but
        )

    def stream_names(self) -> tuple[str, ...]:
        return self._names("_stream")

    def bucket_names(self) -> tuple[str, ...]:
        """The buckets :func:`ensure_topology` makes (all but the deliveries')."""
        return self._names("_bucket", but="deliveries_bucket")

    def stream_specs(self) -> tuple[StreamSpec, ...]:
        """Every stream :func:`ensure_topology` makes: partition 0 of the process stream
        (:meth:`process_stream_spec`), the others as the service needs them."""

        def limits(name: str, subject: str, max_age_s: float | None, **more: Any) -> StreamSpec:
            return StreamSpec(
                name=name,
                subjects=(subject,),
                retention=api.RetentionPolicy.LIMITS,
                storage=self.storage,
                replicas=self.replicas,
                duplicate_window_s=self.duplicate_window_s,
                max_age_s=max_age_s,
                **more,
            )

        age = self.message_max_age_s
        return (
            self.process_stream_spec(0),
            limits(self.build_stream, f"{self.prefix}.build.*", age),
            limits(self.hooks_stream, f"{self.prefix}.hooks.>", age),
            limits(
                self.dead_letter_stream,
                f"{self.prefix}.dlq.>",
                self.dead_letter_max_age_s,
                owns_max_age=True,
            ),
            # Limits, not a work queue: recorded outcomes stay (for their max age) as the
            # history of what builds reported.
            limits(self.outcome_stream, self.outcome_filter(), age),
            limits(
                self.trail_stream,
                f"{self.prefix}.trail.>",
                self.trail_max_age_s,
                owns_max_age=True,
                allow_rollup=True,
                max_bytes=self.trail_max_bytes,
            ),
        )

    def deliveries_bucket_spec(self) -> BucketSpec:
        """The bucket of push-event delivery ids (created by ``webhook``, not by
        :func:`ensure_topology`): each kept ``delivery_max_age_s``, then discarded."""
        return BucketSpec(
            self.deliveries_bucket, self.storage, self.replicas, 1, self.delivery_max_age_s
        )

    def bucket_specs(self) -> tuple[BucketSpec, ...]:
        return tuple(
            BucketSpec(
                name,
                self.storage,
                self.replicas,
                self.kv_history,
                self.refused_outcomes_max_age_s if name == self.refused_bucket else None,
            )
            for name in self.bucket_names()
        )


@dataclass(frozen=True)
class TopologyReport:
    """What :func:`ensure_topology` found: created now vs. already there (and matching).

    "Created" means this call's create succeeded; when replicas race, an identical create
    issued by another replica a moment earlier may count as created for both.
    """

    created_streams: tuple[str, ...]
    existing_streams: tuple[str, ...]
    created_buckets: tuple[str, ...]
    existing_buckets: tuple[str, ...]


async def ensure_topology(js: JetStreamContext, topology: Topology) -> TopologyReport:
    """Create missing streams and buckets; verify existing ones; never modify anything.

    Safe to run from every replica at startup: a create racing another replica's
    identical create succeeds (the server treats it as a no-op), and one racing a
    *different* create is re-read and reported as a mismatch.
    """
    created_streams: list[str] = []
    existing_streams: list[str] = []
    for spec in topology.stream_specs():
        created = await asked_again(partial(_ensure_stream, js, spec))
        (created_streams if created else existing_streams).append(spec.name)
    created_buckets: list[str] = []
    existing_buckets: list[str] = []
    for bucket in topology.bucket_specs():
        created = await asked_again(partial(_ensure_bucket, js, bucket))
        (created_buckets if created else existing_buckets).append(bucket.name)
    return TopologyReport(
        tuple(created_streams),
        tuple(existing_streams),
        tuple(created_buckets),
        tuple(existing_buckets),
    )


async def ensure_partition(js: JetStreamContext, topology: Topology, partition: int) -> bool:
    """Create ``partition``'s stream unless it exists (checked like every stream);
    True when this call created it."""
    return await asked_again(partial(_ensure_stream, js, topology.process_stream_spec(partition)))


async def _ensure_stream(js: JetStreamContext, spec: StreamSpec) -> bool:
    async def create() -> None:
        config = spec
        if spec.max_consumers is not None:
            # Only when creating: a user that may read streams but not the account
            # (ingest, complete) never asks.
            config = spec.within_account((await js.account_info()).limits.max_consumers)
        await js.add_stream(config.to_config())

    return await _ensure(js, "stream", spec.name, spec.name, create, spec.differences)


async def ensure_bucket(js: JetStreamContext, spec: BucketSpec) -> bool:
    """Create the bucket if missing (True), else check it (:class:`TopologyMismatch`)."""
    return await asked_again(partial(_ensure_bucket, js, spec))


async def _ensure_bucket(js: JetStreamContext, spec: BucketSpec) -> bool:
    async def create() -> None:
        await js.create_key_value(spec.to_config())

    return await _ensure(js, "bucket", spec.name, f"KV_{spec.name}", create, spec.differences)


async def _ensure(
    js: JetStreamContext,
    kind: str,
    name: str,
    stream: str,
    create: Callable[[], Awaitable[None]],
    differences: Callable[[api.StreamConfig], list[str]],
) -> bool:
    """Create the stream behind a stream or bucket if missing (True), else check it."""
    with translated(f"ensure {kind} {name}"):
        try:
            info = await js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            try:
                await create()
                return True
            except nats.js.errors.APIError as exc:
                if exc.err_code != STREAM_NAME_IN_USE_CODE:
                    raise
                info = await js.stream_info(stream)
        diffs = differences(info.config)
        if diffs:
            raise TopologyMismatch(
                f"{kind} {name!r} exists with a configuration this service cannot use "
                f"({'; '.join(diffs)}). It was left unchanged: fix the service's topology "
                f"settings, or migrate the {kind} deliberately."
            )
        return False


def _storage_differences(storage: api.StorageType, actual: api.StreamConfig) -> list[str]:
    if _enum_value(actual.storage) == storage.value:
        return []
    return [f"storage: have {_enum_value(actual.storage)}, want {storage.value}"]


def _replicas_differences(replicas: int, actual: api.StreamConfig) -> list[str]:
    have = actual.num_replicas or 1
    return [f"replicas: have {have}, want {replicas}"] if have != replicas else []


def _age(seconds: float | None) -> float:
    """A max_age as the server reports it: 0 means unlimited; whole milliseconds."""
    return round(seconds or 0.0, 3)


def _age_text(seconds: float | None) -> str:
    return f"{_age(seconds):g}s" if _age(seconds) else "unlimited"


def _enum_value(value: object) -> object:
    return getattr(value, "value", value)


def _partition_token(partition: int) -> str:
    if isinstance(partition, bool) or not 0 <= partition < MAX_PARTITIONS:
        raise ValueError(f"partition must be in 0..{MAX_PARTITIONS - 1}, got {partition!r}")
    return str(partition)


def _parse_partition(token: str) -> int | None:
    """The partition a token names: plain decimal without leading zeros, in range."""
    if not (token.isascii() and token.isdecimal()) or (len(token) > 1 and token[0] == "0"):
        return None
    value = int(token)
    return value if value < MAX_PARTITIONS else None

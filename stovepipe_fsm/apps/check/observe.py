"""What of a :class:`World` the checker looks at, and hashes.

An :class:`Observation` is a frozen, hashable value that holds everything that can
influence what the world does next, and nothing that cannot:

- the stores (requests whole; queue rows without their CAS ``version``, which only
  guards concurrent writers and every step here runs atomically);
- the pending process messages in order, each with its due time *relative to now*,
  clamped at zero (a message overdue by 1 ms and one due now deliver the same way) -
  so the absolute clock, which grows on every hold, never splits equivalent states -
  and the failures the settle policy counted for it (they decide whether its next
  failure is retried, and after how long, or dead-lettered);
- what was published, as sets (a re-publish that a broker would dedupe is not news):
  build request ids, start hooks by (request id, event id) (an end announcement follows
  the writes check already observes, so it would split no state);
- requests the runtime dead-lettered, the source-control switch and the crash armed;
- the queues whose ``paused`` parameter is set (the checker pauses and resumes the
  checked queue; a paused queue holds every head, and may do so for ever);
- the paths each ingested commit changed (``check`` draws them from the policy's path
  classes at ingest, :mod:`.paths`): the diff since last green depends on them;
- every delivery stalled in hand (:class:`InHandView`): where its flow stands, what it
  loaded, and whether what it loaded is still current. Absolute CAS versions are not
  observed, but whether a stalled delivery's request or queue row is stale is: that
  alone decides whether its compare-and-set writes will succeed. What it loaded is
  seen as the stores are seen (a request and a row's recent greens without their times,
  a queue row's leases as time left), so a stall does not tell apart worlds the stores do not.

Two worlds with equal observations (and equal budgets) have the same futures up to a
shift of the clock, so the search expands each observation once.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any, Generic, TypeVar

from ...adapters.memory import MemoryQueueStore, MemoryRequestStore
from ...adapters.memory.publisher import BUILD, HOOK, Published
from ...domain.entities import Queue, QueueConfig, Request, evolve
from ...domain.errors import NotFound
from ...domain.hooks import VALIDATION_LEASE_EXPIRED, VALIDATION_STARTED
from ...domain.ids import parse_request_id
from ...machine.compiler import Step
from ...process.gate import PAUSED
from ...simulation.broker import Message, run_sync
from ...simulation.world import InHand, World

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class Pending:
    """One process message waiting on the topic."""

    queue: str
    request_id: str
    due_in_ms: int
    failures: int = 0  # counted by the settle policy: decides retry or dead letter next


@dataclass(frozen=True)
class InHandView:
    """A stalled delivery, as far as its future depends on it."""

    request_id: str
    queue: str
    point: str
    flow_state: str
    pending_actions: tuple[str, ...]
    message_pending: bool
    request: Request | None
    request_fresh: bool
    queue_row: Queue | None
    queue_fresh: bool
    config: QueueConfig
    build_strategy: str
    base_uri: str
    slot_conflict: bool
    admit_step: Step | None


@dataclass(frozen=True)
class Observation:
    requests: tuple[Request, ...]
    queues: tuple[Queue, ...]
    pending: tuple[Pending, ...]
    builds: frozenset[str]
    hooks: frozenset[tuple[str, str]]  # (request id, event id) of start events
    dead_lettered: frozenset[str]
    source_control_up: bool
    armed_crash: str
    in_hand: tuple[InHandView, ...] = ()
    paused: frozenset[str] = frozenset()
    lease_expired: frozenset[str] = frozenset()  # requests whose slot lease was reclaimed
    #: The paths each commit ingested so far changed (``check`` gives them at ingest).
    changes: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __post_init__(self) -> None:
        # Hashed once, here: the search looks each observation up several times (its
        # state, its actions' known outcomes, its live world).
        object.__setattr__(self, "_hash", hash(tuple(vars(self).values())))  # the fields

    def __hash__(self) -> int:
        return self._hash  # type: ignore[no-any-return,attr-defined]

    @cached_property
    def by_id(self) -> dict[str, Request]:
        return {r.id: r for r in self.requests}

    @cached_property
    def heads(self) -> tuple[Request, ...]:
        """The requests that are trunk heads: all but a culprit search's probes, which
        the gate's invariants are not about (the culprit exploration proves them)."""
        return tuple(r for r in self.requests if not r.probe_of)

    def queue(self, name: str) -> Queue | None:
        for row in self.queues:
            if row.name == name:
                return row
        return None

    def pending_for(self, request_id: str) -> bool:
        return any(p.request_id == request_id for p in self.pending)

    def pending_in(self, queue: str) -> tuple[Pending, ...]:
        return tuple(p for p in self.pending if p.queue == queue)

    def in_hand_for(self, request_id: str) -> bool:
        """A stalled delivery of the request is still to run its rest."""
        return any(h.request_id == request_id for h in self.in_hand)

    def busy(self, queue: str) -> bool:
        """Work is left on ``queue``: a message pending or a delivery stalled in hand."""
        return bool(self.pending_in(queue)) or any(h.queue == queue for h in self.in_hand)

    def heads_of(self, queue: str) -> tuple[Request, ...]:
        """:attr:`heads` of ``queue``."""
        return tuple(r for r in self.heads if r.queue == queue)

    def newest(self, queue: str) -> Request | None:
        """The head ingest minted last for ``queue`` (highest counter; probes are minted
        by a culprit search, never by ingest)."""
        mine = self.heads_of(queue)
        return max(mine, key=lambda r: counter_of(r.id)) if mine else None

    def hook_ids(self, request_id: str) -> frozenset[str]:
        return frozenset(event for rid, event in self.hooks if rid == request_id)


@cache
def counter_of(request_id: str) -> int:
    """The ingest-order counter of a request id (parsed once per id per process)."""
    return parse_request_id(request_id).counter


class _Memo(Generic[K, V]):
    """``compute`` of each object, computed once per object (found by its identity, or
    by ``key`` and confirmed equal).

    A fork of a world shares its parent's rows (they are frozen) and a step replaces only
    the few it writes, so nearly every row an observation meets was met before:
    remembering the stripped copy per stored object spares a dataclass ``replace`` per
    row per state. Likewise a store hands out one snapshot tuple until its next write,
    and a fork starts with its parent's, so the rows an observation holds are built once
    per snapshot. The original is kept alive with its result, so an identity never names
    two objects; the memo is emptied when it grows past ``limit``.
    """

    def __init__(
        self, compute: Callable[[K], V], limit: int = 200_000, key: Callable[[K], Hashable] = id
    ) -> None:
        self.compute = compute
        self.limit = limit
        self.key = key
        self._seen: dict[Hashable, tuple[K, V]] = {}

    def __call__(self, obj: K) -> V:
        key = self.key(obj)
        hit = self._seen.get(key)
        if hit is not None and (hit[0] is obj or hit[0] == obj):
            return hit[1]
        if len(self._seen) >= self.limit:
            self._seen.clear()
        result = self.compute(obj)
        self._seen[key] = (obj, result)
        return result


_stripped_request: _Memo[Request, Request] = _Memo(Request.without_times)
_unversioned_queue: _Memo[Queue, Queue] = _Memo(lambda row: evolve(row.without_times(), version=0))


class _Rows(tuple[Any, ...]):
    """Rows as an observation holds them: a tuple that hashes its rows once.

    It equals, and hashes like, the plain tuple of the same rows; an observation's rows
    are hashed for each state that stands on it, and most share their parent's rows.
    """

    def __hash__(self) -> int:
        known: int | None = self.__dict__.get("hash")
        if known is None:
            known = self.__dict__["hash"] = tuple.__hash__(self)
        return known


# Times grow with the clock and would split equivalent states, like versions.
_request_rows: _Memo[tuple[Request, ...], _Rows] = _Memo(
    lambda rows: _Rows(map(_stripped_request, rows)), limit=100_000
)
# A lease is seen as the time left: rows with leases are built for each observation.
_lease_free_queue_rows: _Memo[tuple[Queue, ...], _Rows | None] = _Memo(
    lambda rows: None if any(row.leases for row in rows) else _Rows(map(_unversioned_queue, rows)),
    limit=100_000,
)


def observe(world: World) -> Observation:
    now = world.clock.now_ms()
    rows = world.queues.snapshot()
    messages = world.broker.messages
    builds, hooks, lease_expired = _published(world.published.records)
    queues = _lease_free_queue_rows(rows)
    return Observation(
        requests=_request_rows(world.requests.snapshot()),
        queues=queues if queues is not None else tuple(_relative(row, now) for row in rows),
        pending=tuple(
            _pending(m.queue, m.request_id, max(0, m.due_ms - now), m.failures) for m in messages
        ),
        builds=builds,
        hooks=hooks,
        dead_lettered=frozenset(rid for rid, _ in world.dead_letters)
        if world.dead_letters
        else _NONE,
        source_control_up=world.graph.available,
        armed_crash=world.armed_crash,
        in_hand=tuple(_in_hand(world, held, now) for held in world.in_hand)
        if world.in_hand
        else (),
        paused=_paused(world, rows, messages),
        lease_expired=lease_expired,
        changes=world.graph.changes(),
    )


_NONE: frozenset[str] = frozenset()
# A pending message's view is one of a few values: each is built once.
_pending = cache(Pending)
PublishedSets = tuple[frozenset[str], frozenset[tuple[str, str]], frozenset[str]]


def _published_sets(records: Sequence[Published]) -> PublishedSets:
    """What an observation reads of the publish records: build request ids, start hooks,
    reclaimed leases."""
    return (
        frozenset(r.request_id for r in records if r.kind == BUILD),
        frozenset(
            (r.request_id, r.dedup_id)
            for r in records
            if r.kind == HOOK and r.event_type == VALIDATION_STARTED
        ),
        frozenset(
            r.request_id
            for r in records
            if r.kind == HOOK and r.event_type == VALIDATION_LEASE_EXPIRED
        ),
    )


# A fork copies its parent's records and a step appends a few, so most lists an
# observation meets were met before: a list is looked up by its length and its last
# record object, and the hit confirmed by comparing the lists (element identity first).
_published: _Memo[Sequence[Published], PublishedSets] = _Memo(
    _published_sets, key=lambda records: (len(records), id(records[-1]) if records else 0)
)


def _relative(row: Queue, now: int) -> Queue:
    """The row as the checker compares it: no version, and each lease as the time left
    (0 once expired), so states that differ only by when they were reached are one."""
    if not row.leases:  # nothing relative to the clock: the same row, state after state
        return _unversioned_queue(row)
    leases = tuple((holder, max(0, expires - now)) for holder, expires in row.leases)
    return evolve(row.without_times(), version=0, leases=leases)


def _paused(world: World, rows: tuple[Queue, ...], messages: list[Message]) -> frozenset[str]:
    """The queues with work or a row whose effective ``paused`` parameter is set (the
    world resolves each queue's config once, until a ``config`` step changes it)."""
    config = world.config
    queues = {row.name for row in rows}
    queues.update(m.queue for m in messages)
    queues.update(config.changes)
    paused = [queue for queue in queues if _is_paused(config.get(queue))]
    return frozenset(paused) if paused else _NONE


def _is_paused(config: QueueConfig) -> bool:
    for name, value in config.parameters:
        if name == PAUSED:
            return bool(value)
    return False


def _current_version(store: MemoryRequestStore | MemoryQueueStore, key: str) -> int | None:
    """The stored version of ``key``; ``None`` when nothing is stored under it."""
    try:
        if isinstance(store, MemoryRequestStore):
            return run_sync(store.get(key)).version
        return run_sync(store.get(key)).version
    except NotFound:
        return None


def _in_hand(world: World, held: InHand, now: int) -> InHandView:
    ctx, cursor = held.paused.ctx, held.paused.cursor
    request, row = ctx.loaded_request, ctx.loaded_queue
    request_fresh = request is not None and (
        _current_version(world.requests, request.id) == request.version
    )
    queue_fresh = row is not None and _current_version(world.queues, row.name) == row.version
    return InHandView(
        request_id=held.message.request_id,
        queue=held.message.queue,
        point=held.point,
        flow_state=cursor.state,
        pending_actions=cursor.pending_names,
        message_pending=world.broker.find(held.message.seq) is not None,
        request=evolve(_stripped_request(request), version=0) if request else None,
        request_fresh=request_fresh,
        queue_row=_relative(row, now) if row else None,
        queue_fresh=queue_fresh,
        config=ctx.config,
        build_strategy=ctx.build_strategy,
        base_uri=ctx.base_uri,
        slot_conflict=ctx.slot_conflict,
        admit_step=ctx.admit_step,
    )

"""Request ids: ``request/<queue>/<n>``.

``n`` is a per-queue decimal counter minted by ingest; it is the ingest order that
coalescing compares. Comparing ids of different queues, or ids without a decimal
counter, is a programming or data error and raises; it is never silently ordered.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .queue_names import InvalidQueueName, validate_stored_queue_name

PREFIX = "request/"


@dataclass(frozen=True, order=True)
class RequestId:
    queue: str
    counter: int

    def __str__(self) -> str:
        return format_request_id(self.queue, self.counter)


def format_request_id(queue: str, counter: int) -> str:
    if counter < 1:
        raise ValueError(f"request counter must be >= 1, got {counter}")
    return f"{PREFIX}{queue}/{counter}"


def parse_request_id(request_id: str) -> RequestId:
    """Split a request id into queue and counter; ``ValueError`` when malformed.

    Every decision compares ids (coalescing) and parsing re-validates the queue name
    character by character, so results are memoized: an id string always parses the
    same way, and a bad one is never cached (it raises).
    """
    if not isinstance(request_id, str):
        raise ValueError(f"request id {request_id!r} does not start with {PREFIX!r}")
    return _parse(request_id)


@lru_cache(maxsize=65_536)
def _parse(request_id: str) -> RequestId:
    if not request_id.startswith(PREFIX):
        raise ValueError(f"request id {request_id!r} does not start with {PREFIX!r}")
    queue, sep, counter = request_id[len(PREFIX) :].rpartition("/")
    if not sep or not counter.isascii() or not counter.isdecimal():
        raise ValueError(f"request id {request_id!r} has no decimal counter suffix")
    if counter != str(int(counter)) or int(counter) < 1:
        raise ValueError(f"request id {request_id!r} has a non-canonical counter {counter!r}")
    try:
        validate_stored_queue_name(queue)
    except InvalidQueueName as exc:
        raise ValueError(f"request id {request_id!r}: {exc}") from None
    return RequestId(queue, int(counter))


def compare_request_id(queue: str, a: str, b: str) -> int:
    """-1, 0 or 1 as request ``a`` was ingested before, with, or after ``b`` in ``queue``."""
    left, right = parse_request_id(a), parse_request_id(b)
    for rid, raw in ((left, a), (right, b)):
        if rid.queue != queue:
            raise ValueError(f"request id {raw!r} belongs to queue {rid.queue!r}, not {queue!r}")
    return (left.counter > right.counter) - (left.counter < right.counter)

"""The simulated process topic a :class:`~.world.World` runs on.

:class:`SimBroker` stands where the JetStream runtime stands in ``serve``: one message in
flight per queue, a held or failed message stays at the head of its queue and falls due
again later. Each :class:`Message` is also the Delivery port over itself.

Because in-memory adapters never suspend, every coroutine completes in one
``send(None)``; :func:`run_sync` exploits that so a step is an ordinary function call.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..process.together import is_stepwise, stepwise

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (in-memory adapters) to completion."""
    try:
        if is_stepwise():  # a replay enters it once for all its steps
            coro.send(None)
        else:
            with stepwise():
                coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("an in-memory step awaited real I/O")


class Crash(Exception):
    """The simulated process died at a crash point; nothing after it ran."""


@dataclass
class Message:
    """One process message on the simulated topic, and the Delivery port over it."""

    seq: int
    queue: str
    request_id: str
    due_ms: int
    deliveries: int = 0
    failures: int = 0  # failed attempts so far, as the settle policy counts them

    @property
    def stream_seq(self) -> int:
        return self.seq

    async def in_progress(self) -> None:
        return None


class SimBroker:
    """The process topic: per-queue order, one in flight, holds and retries in place.

    Messages are kept per queue (in order) and by sequence, so a delivery costs the same
    however many heads wait: finding the due heads looks at one message per queue, and
    finding or removing a message is a lookup, never a scan of the topic.
    """

    def __init__(self, messages: Iterable[Message] = (), next_seq: int = 1) -> None:
        self.next_seq = next_seq
        self._by_seq: dict[int, Message] = {}
        self._by_queue: dict[str, deque[Message]] = {}
        for message in messages:
            self._add(message)

    @property
    def messages(self) -> list[Message]:
        """Every pending message, in publish order."""
        return list(self._by_seq.values())

    def _add(self, message: Message) -> None:
        self._by_seq[message.seq] = message
        self._by_queue.setdefault(message.queue, deque()).append(message)

    def publish(self, queue: str, request_id: str, now_ms: int) -> None:
        self._add(Message(self.next_seq, queue, request_id, now_ms))
        self.next_seq += 1

    def due(self, now_ms: int) -> list[Message]:
        """The queues' first messages (the only deliverable ones) due at ``now_ms``."""
        heads = (waiting[0] for waiting in self._by_queue.values())
        return sorted((m for m in heads if m.due_ms <= now_ms), key=lambda m: m.seq)

    def first_due(self, now_ms: int) -> Message | None:
        """The earliest published of the queues' first messages that is due at ``now_ms``."""
        first: Message | None = None
        for waiting in self._by_queue.values():
            head = waiting[0]
            if head.due_ms <= now_ms and (first is None or head.seq < first.seq):
                first = head
        return first

    def next_due_ms(self) -> int | None:
        times = [waiting[0].due_ms for waiting in self._by_queue.values()]
        return min(times) if times else None

    def remove(self, message: Message) -> None:
        pending = self._by_seq.pop(message.seq, None)
        if pending is None:
            return
        waiting = self._by_queue[pending.queue]
        if waiting[0] is pending:
            waiting.popleft()
        else:
            waiting.remove(pending)
        if not waiting:
            del self._by_queue[pending.queue]

    def find(self, seq: int) -> Message | None:
        """The pending message ``seq``; ``None`` once it was settled."""
        return self._by_seq.get(seq)

    def clone(self) -> SimBroker:
        return SimBroker([_copied(m) for m in self._by_seq.values()], self.next_seq)


def _copied(message: Message) -> Message:
    """An independent copy of ``message`` (a plain record: its attributes are all of it),
    without ``dataclasses.replace``'s per-field work; ``check`` forks many worlds."""
    twin = object.__new__(Message)
    twin.__dict__ = message.__dict__.copy()
    return twin

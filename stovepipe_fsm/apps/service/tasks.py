"""The service's tasks and its stop signal.

Two kinds: the long-running loops (one per queue consumer, the dead-letter and outcome
consumers, discovery, heartbeat, policy and pause checks), whose early end the health
check reports; and short chores (a queue seen in a publish, a discovery after a
reconnect), at most one of a name at a time. A stop lets both finish what they hold,
then cancels what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger("stovepipe_fsm.service")


class ServiceTasks:
    """Every task a service runs, and the event that tells them to stop."""

    def __init__(self) -> None:
        #: Set once the service stops; the loops watch it.
        self.stop_requested = asyncio.Event()
        self._loops: dict[str, asyncio.Task[None]] = {}
        self._chores: dict[str, asyncio.Task[None]] = {}

    @property
    def stopping(self) -> bool:
        return self.stop_requested.is_set()

    def spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        """A long-running loop, reported by :meth:`ended` once it ends."""
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._loops[name] = task

    def loop(self, name: str) -> asyncio.Task[None] | None:
        return self._loops.get(name)

    def spawn_once(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        """A short task, unless one of that name is still running or the service is
        stopping (then ``coro`` is dropped)."""
        running = self._chores.get(name)
        if (running is not None and not running.done()) or self.stopping:
            coro.close()
            return
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._chores[name] = task
        task.add_done_callback(lambda done: self._forget_chore(name, done))

    def _forget_chore(self, name: str, task: asyncio.Task[None]) -> None:
        if self._chores.get(name) is task:
            del self._chores[name]

    def ended(self) -> list[str]:
        """The loops that ended (none should before the stop)."""
        return [name for name, task in self._loops.items() if task.done()]

    async def idle(self, seconds: float) -> None:
        """Wait ``seconds``, or less when the service stops meanwhile."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stop_requested.wait(), seconds)

    async def every(
        self, interval_s: float, check: Callable[[], Awaitable[object]], what: str
    ) -> None:
        """Run ``check`` every ``interval_s`` until stopped; a failed round is logged and
        the next one tried (the broker may be reconnecting)."""
        while not self.stop_requested.is_set():
            await self.idle(interval_s)
            if self.stop_requested.is_set():
                return
            try:
                await check()
            except Exception as exc:
                log.warning("%s check failed: %s: %s", what, type(exc).__name__, exc)

    async def finish(self, timeout_s: float) -> None:
        """Let every task end within ``timeout_s`` (:meth:`stop` first), then cancel the
        others and wait for them as long again."""
        tasks = [*self._loops.values(), *self._chores.values()]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)

    def stop(self) -> None:
        self.stop_requested.set()

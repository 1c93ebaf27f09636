"""Plugin steps kept off the event loop, within a time budget, and timed.

A condition or action a plugin registered is code the policy's authors wrote, run on
every delivery. On a service, a plugin step that blocks (a slow network call in a
condition, a sleep, a loop) must not freeze the event loop every queue of the replica,
its health check and its status page run on. So a service's flows (``offload``) run
each decision that asks a plugin condition, and each plugin action, in a worker thread
of the flow (a coroutine action as a task) and wait for it at most the budget; past it,
the delivery fails retryably (:class:`StepOverBudget`) and the loop goes on. A plugin
step that exits the interpreter (``SystemExit``) fails its delivery the same way instead
of stopping the service. The simulated world (``simulate``, ``test``, ``whatif``,
``check``) drives coroutines by hand, never suspending: there steps run inline, and the
decisions are the same either way.

Every plugin step is timed; :class:`StepWatch` counts the slow ones and the ones over
budget per YAML step, for ``/metrics``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..domain.errors import Retryable

log = logging.getLogger("stovepipe_fsm.plugins")

T = TypeVar("T")

#: How long a plugin step may take before its delivery fails (retryably).
DEFAULT_BUDGET_S = 5.0
#: A plugin step slower than this is logged and counted as slow.
DEFAULT_SLOW_S = 0.25


class StepOverBudget(Retryable):
    """A plugin step ran past its budget; the delivery is retried later."""


class PluginExited(Retryable):
    """A plugin step raised ``SystemExit``; its delivery fails, the service goes on."""


@dataclass
class StepWatch:
    """Budget and counters of one compiled machine's plugin steps."""

    budget_s: float = DEFAULT_BUDGET_S
    slow_s: float = DEFAULT_SLOW_S
    #: Per YAML step (``file:line:column``), the calls slower than ``slow_s``.
    slow: Counter[str] = field(default_factory=Counter)
    #: Per YAML step, the calls that ran past ``budget_s``.
    over_budget: Counter[str] = field(default_factory=Counter)

    @contextlib.contextmanager
    def timed(self, where: str) -> Iterator[None]:
        """Time the step run inside; count and log it when it took ``slow_s`` or more
        (however it ended)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - started
            if took >= self.slow_s:
                self.slow[where] += 1
                log.warning("slow plugin step: %.3f s at %s", took, where)

    def over(self, where: str) -> StepOverBudget:
        self.over_budget[where] += 1
        log.warning("plugin step over its budget of %.3f s at %s", self.budget_s, where)
        return StepOverBudget(f"{where}: over its budget of {self.budget_s:g} s")


def contained(where: str, call: Callable[[], T]) -> T:
    """``call()``, with a ``SystemExit`` it raises turned into a delivery failure."""
    try:
        return call()
    except SystemExit as exc:
        raise PluginExited(f"{where}: the plugin called exit ({exc.code!r})") from None


async def contained_async(where: str, awaitable: Awaitable[T]) -> T:
    """:func:`contained` for a coroutine."""
    try:
        return await awaitable
    except SystemExit as exc:
        raise PluginExited(f"{where}: the plugin called exit ({exc.code!r})") from None


class Worker:
    """One daemon thread that runs a machine's plugin steps off the event loop, in order.

    A step stuck past its budget keeps the thread: the steps queued behind it wait and
    run past their own budgets too (every delivery that needs a plugin step fails
    retryably until the stuck one returns), while the event loop and the deliveries that
    need no plugin step go on. A daemon thread never holds up the process's exit.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, call: Callable[[], T]) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((call, future))
        with self._lock:  # a forked child has the object but not the thread
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name=f"plugin steps: {self._name}", daemon=True
                )
                self._thread.start()
        return future

    def _run(self) -> None:
        while True:
            call, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as exc:  # handed to the awaiting delivery
                future.set_exception(exc)

    async def run(self, call: Callable[[], T], watch: StepWatch, where: str) -> T:
        """``call()`` on this thread, awaited at most the budget."""
        with watch.timed(where):
            future = asyncio.wrap_future(self.submit(call))
            try:
                return await asyncio.wait_for(future, watch.budget_s)
            except TimeoutError:
                raise watch.over(where) from None


async def within_budget(awaitable: Awaitable[T], watch: StepWatch, where: str) -> T:
    """An async plugin step, awaited at most the budget (cancelled past it)."""
    with watch.timed(where):
        try:
            # Contained inside the task wait_for makes: a SystemExit escaping a task is
            # re-raised by the event loop itself.
            return await asyncio.wait_for(contained_async(where, awaitable), watch.budget_s)
        except TimeoutError:
            raise watch.over(where) from None

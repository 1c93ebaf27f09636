"""Await independent broker operations side by side.

On an event loop (the service, the operator commands) the steps run concurrently, so a
group of independent reads or writes costs one round trip instead of one each. The
simulated world, the checker and the in-memory bench drive coroutines step by step with
``send(None)`` (their in-memory adapters never suspend), inside :func:`stepwise`; there
the steps run one after the other, in the order given, which is one of the interleavings
the concurrent run allows.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Coroutine
from types import TracebackType
from typing import Any, TypeVar, overload

A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")

_STEPWISE: contextvars.ContextVar[bool] = contextvars.ContextVar("stepwise", default=False)


class stepwise:  # a context manager, named like the function it replaces
    """Run :func:`together` groups one step after the other while inside.

    A class rather than a generator context manager: the simulated world enters it once
    per coroutine it drives, hundreds of thousands of times in a long replay.
    """

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _STEPWISE.set(True)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        _STEPWISE.reset(self._token)


def is_stepwise() -> bool:
    """Whether :func:`together` groups run one step after the other here."""
    return _STEPWISE.get()


@overload
def together(a: Awaitable[A], b: Awaitable[B], /) -> Awaitable[tuple[A, B]]: ...


@overload
def together(a: Awaitable[A], b: Awaitable[B], c: Awaitable[C], /) -> Awaitable[tuple[A, B, C]]: ...


def together(*steps: Awaitable[Any]) -> Awaitable[tuple[Any, ...]]:
    # A plain function handing back all_of's coroutine: awaiting it costs no extra frame.
    return all_of(steps)


async def all_of(steps: Any) -> tuple[Any, ...]:
    """Every step's result, in the order given (see the module docstring)."""
    pending = list(steps)
    if _STEPWISE.get() or not _loop_running():
        results = []
        for at, step in enumerate(pending):
            try:
                results.append(await step)
            except BaseException:
                for left in pending[at + 1 :]:
                    if isinstance(left, Coroutine):
                        left.close()
                raise
        return tuple(results)
    return tuple(await asyncio.gather(*pending))


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True

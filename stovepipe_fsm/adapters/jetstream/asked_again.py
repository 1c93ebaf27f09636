"""Asking the broker again when it did not answer in time.

On a cluster a request can go unanswered for a while for reasons that pass: a
replicated stream's or consumer's group still forming, a leader being elected, replicas
starting side by side on a busy machine. A start should not fail on one such request.
The steps asked again here are ensures (look up, create when missing), which are safe to
repeat: a create the server carried out although its answer was lost is found by the
next lookup, and nothing is created twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ...domain.errors import Retryable

log = logging.getLogger("stovepipe_fsm.service")

_T = TypeVar("_T")

#: Tries of one step in all, when the broker does not answer it (a ``Retryable`` error).
TRANSIENT_ATTEMPTS = 3
#: The pause before the n-th try is n times this.
PAUSE_S = 0.1


async def asked_again(
    step: Callable[[], Awaitable[_T]],
    *,
    attempts: int = TRANSIENT_ATTEMPTS,
    pause_s: float = PAUSE_S,
) -> _T:
    """``step()``'s result, asking again after a ``Retryable`` error, ``attempts`` times
    in all; the last try's error is raised."""
    for attempt in range(1, attempts + 1):
        try:
            return await step()
        except Retryable as exc:
            if attempt == attempts:
                raise
            log.warning("%s; asking again (%d of %d)", exc, attempt + 1, attempts)
            await asyncio.sleep(pause_s * attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")

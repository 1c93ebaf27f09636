"""Requests per client address, by token bucket: a burst, then a steady rate.

Each address has its own bucket, so one noisy client is refused without starving the
others (a forge delivers from a few addresses of its own). The table of addresses is
bounded: past ``max_clients`` the least recently seen is forgotten (it starts again with a
full bucket, which only ever favours the client).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class RateLimit:
    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        max_clients: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate_per_s <= 0 or burst < 1 or max_clients < 1:
            raise ValueError("the rate must be > 0, the burst and max_clients >= 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_clients = max_clients
        self._clock = clock
        #: client -> (tokens left, when they were counted)
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def allow(self, client: str) -> float:
        """0 when ``client`` may make a request now (one token is taken); otherwise how
        many seconds until it may."""
        now = self._clock()
        tokens, at = self._buckets.pop(client, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate_per_s)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate_per_s
        self._buckets[client] = (tokens, now)
        while len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
        return wait

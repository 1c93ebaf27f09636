"""``Clock`` on the broker's time, so replicas whose own clocks disagree agree on now.

A lease is stamped by the replica that claims a slot (now + ``max_validation_ms``) and
compared with now by whichever replica gates the queue next. With each replica's own
wall clock, one running 20 s ahead takes a slot whose lease has 20 s left. Every
replica's service clock is therefore the broker's: its own clock plus an offset measured
against the time the broker states in a JetStream answer (a stream info's ``ts``, the
answering server's clock), taken at start and every :data:`SYNC_INTERVAL_S`. The stream
asked is the queue rows' bucket, so every replica measures against the server that leads
the rows the leases live in. The error is half a round trip plus the drift between two
measurements: milliseconds, where a lease is minutes.

A broker too old to state its time leaves the offset at 0 (the replica's own clock), and
says so once.
"""

from __future__ import annotations

import datetime
import logging
import re

from nats.js import JetStreamContext

from ...ports.clock import Clock
from .errors import translated
from .raw_api import api_request

log = logging.getLogger("stovepipe_fsm.service")

#: How often the offset is measured again.
SYNC_INTERVAL_S = 10.0
#: An offset at least this large is logged (a replica's clock this far off is news).
NOTED_OFFSET_MS = 1_000

_TS_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def broker_time_ms(ts: str) -> int:
    """Milliseconds since the epoch of an RFC 3339 time as the broker writes it
    (nanosecond fractions included); ``ValueError`` for anything else."""
    match = _TS_RE.match(ts)
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {ts[:64]!r}")
    whole, fraction, zone = match.groups()
    stamp = datetime.datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
    millis = int((fraction or "0")[:3].ljust(3, "0"))
    return int(stamp.timestamp()) * 1000 + millis


class BrokerClock:
    """The broker's now, as this replica can tell it: ``local`` plus the measured offset."""

    def __init__(self, js: JetStreamContext, stream: str, local: Clock) -> None:
        self._js = js
        self._stream = stream
        self._local = local
        self.offset_ms = 0
        self._measured = False
        self._told_unstated = False

    def now_ms(self) -> int:
        return self._local.now_ms() + self.offset_ms

    async def sync(self) -> None:
        """Measure the offset again (a broker that states no time keeps it as it is)."""
        before = self._local.now_ms()
        with translated(f"read the time of {self._stream}"):
            answer = await api_request(self._js, f"STREAM.INFO.{self._stream}")
        after = self._local.now_ms()
        ts = answer.get("ts")
        if not isinstance(ts, str):
            if not self._told_unstated:
                self._told_unstated = True
                log.warning("the broker states no time; leases use this replica's own clock")
            return
        offset = broker_time_ms(ts) - (before + after) // 2
        if abs(offset - self.offset_ms) >= NOTED_OFFSET_MS or (
            not self._measured and abs(offset) >= NOTED_OFFSET_MS
        ):
            log.warning(
                "this replica's clock is %+.1f s off the broker's; times and leases use "
                "the broker's",
                -offset / 1000,
            )
        self.offset_ms, self._measured = offset, True

"""The failure budget of process messages, counted by the service in the attempts bucket.

JetStream's own delivery count cannot be the budget: a hold is a NAK with delay, so it
bumps ``num_delivered`` like a failure would, and a queue held behind a long build would
exhaust its retries for nothing. The service therefore counts failures itself, keyed by
the message's stream sequence (unique and stable across redeliveries and replicas).

What a failure leads to (a retry with backoff, or a dead letter once the count reaches
``max_attempts``) is the settle policy's call (:mod:`stovepipe_fsm.domain.settle`); the
ledger reads the count it decides on and stores the count it returns. That is a
compare-and-set loop, so two replicas that both saw a failure of one message (after an
ack deadline passed) never lose an increment. A key is deleted once its message is
settled for good (acked or dead-lettered); a leftover key after a crash is harmless:
sequences are never reused by the stream.
"""

from __future__ import annotations

from collections.abc import Callable

import nats.js.errors
from nats.js.kv import KeyValue

from ...domain.errors import NonRetryable, Retryable
from ...domain.settle import SettleKind, Settlement
from .errors import is_wrong_last_sequence, translated

MAX_CAS_ATTEMPTS = 20


def attempts_key(stage: str, stream_seq: int) -> str:
    if stream_seq < 1:
        raise ValueError(f"stream sequence must be >= 1, got {stream_seq}")
    return f"{stage}.{stream_seq}"


class AttemptsLedger:
    """Failure counts per message of one stage (``process``) in one KV bucket."""

    def __init__(self, kv: KeyValue, *, stage: str = "process") -> None:
        self._kv = kv
        self._stage = stage

    async def decide(self, stream_seq: int, decide: Callable[[int], Settlement]) -> Settlement:
        """Settle a failed attempt on the message's failure count; store what a retry counts.

        ``decide`` is the settle policy applied to the count read. A retry's new count is
        written only if the record is still the one read; when another replica changed it
        in between, the policy decides again on the fresh count, so no failure is lost. A
        dead letter writes nothing: its message is about to be settled for good.
        """
        key = attempts_key(self._stage, stream_seq)
        for _ in range(MAX_CAS_ATTEMPTS):
            with translated(f"read attempts {key}"):
                try:
                    entry = await self._kv.get(key)
                except nats.js.errors.KeyNotFoundError:
                    entry = None
            decision = decide(_parse(key, entry.value) if entry else 0)
            if decision.kind is not SettleKind.RETRY:
                return decision
            count = str(decision.failures).encode()
            with translated(f"count failure {key}"):
                try:
                    if entry is None:
                        await self._kv.create(key, count)
                    else:
                        await self._kv.update(key, count, last=entry.revision)
                    return decision
                except nats.js.errors.APIError as exc:
                    if is_wrong_last_sequence(exc):
                        continue
                    raise
        raise Retryable(f"attempts {key}: lost {MAX_CAS_ATTEMPTS} compare-and-set races")

    async def forget(self, stream_seq: int) -> None:
        """Drop the count of a settled message (best effort: a leftover is harmless)."""
        key = attempts_key(self._stage, stream_seq)
        with translated(f"forget attempts {key}"):
            try:
                await self._kv.purge(key)
            except nats.js.errors.KeyNotFoundError:
                return


def _parse(key: str, raw: bytes | None) -> int:
    text = (raw or b"").decode("ascii", errors="replace")
    if not text:
        return 0  # a purge marker reads as no value
    if not (text.isascii() and text.isdecimal()):
        raise NonRetryable(f"attempts {key} holds {text!r}, not a count")
    return int(text)

"""Single-key primitives on one JetStream KV bucket, with domain errors.

Every store in this package is built from three moves: read a key with its revision,
create a key only if absent, and replace a key only if its revision is still the one read.
The last two are the server's expected-last-subject-sequence check, so a lost race is
always reported (``AlreadyExists`` / ``VersionMismatch``) and never a silent overwrite.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from ...domain.errors import AlreadyExists, NotFound, VersionMismatch
from .bulk import kv_rows_of
from .errors import is_wrong_last_sequence, translated


@dataclass(frozen=True)
class KvEntry:
    """A value as stored, with the KV revision a conditional write must name."""

    key: str
    value: bytes
    revision: int


class KvCell:
    """Conditional single-key access to one bucket."""

    def __init__(self, kv: KeyValue, bucket: str, js: JetStreamContext) -> None:
        self._kv = kv
        self._bucket = bucket
        self._js = js

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def js(self) -> JetStreamContext:
        return self._js

    async def read(self, key: str) -> KvEntry:
        """The live value of ``key``; ``NotFound`` when it was never written or is deleted."""
        with translated(f"read {self._bucket}/{key}"):
            try:
                entry = await self._kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                raise NotFound(f"{self._bucket}: no key {key!r}") from None
            if entry.revision is None:
                raise NotFound(f"{self._bucket}: key {key!r} has no revision")
            return KvEntry(key=key, value=entry.value or b"", revision=entry.revision)

    async def read_many(self, keys: Sequence[str]) -> dict[str, KvEntry]:
        """The live values among ``keys``, by key, read in one pass (never written or
        deleted ones left out). Keep ``keys`` to a few hundred."""
        rows = await kv_rows_of(self._js, self._bucket, keys)
        return {row.key: KvEntry(row.key, row.value, row.revision) for row in rows}

    async def read_optional(self, key: str) -> KvEntry | None:
        try:
            return await self.read(key)
        except NotFound:
            return None

    async def create(self, key: str, value: bytes) -> int:
        """Write ``key`` only if it holds no live value; ``AlreadyExists`` otherwise."""
        with translated(f"create {self._bucket}/{key}"):
            try:
                return await self._kv.create(key, value)
            except nats.js.errors.APIError as exc:
                if is_wrong_last_sequence(exc):
                    raise AlreadyExists(f"{self._bucket}: key {key!r} already exists") from None
                raise

    async def write(self, key: str, value: bytes, revision: int) -> int:
        """:meth:`create` when ``revision`` is 0 (the key was read absent), else
        :meth:`replace`."""
        if revision == 0:
            return await self.create(key, value)
        return await self.replace(key, value, revision)

    async def replace(self, key: str, value: bytes, revision: int) -> int:
        """Write ``key`` only if its latest revision is ``revision``; ``VersionMismatch``."""
        if revision < 1:
            # Revision 0 would mean "only if absent" to the server: never what a caller means.
            raise ValueError(f"a replace needs the revision that was read, got {revision}")
        with translated(f"update {self._bucket}/{key}"):
            try:
                return await self._kv.update(key, value, last=revision)
            except nats.js.errors.APIError as exc:
                if is_wrong_last_sequence(exc):
                    raise VersionMismatch(
                        f"{self._bucket}: key {key!r} changed since revision {revision}"
                    ) from None
                raise

"""A ConfigStore backed by ``config/queues.yaml``, reloaded when the file changes.

Operators change policy by editing the file, so the running service must pick an edit
up without a restart, yet a bad edit must never take a queue down. The rules:

- The file is loaded at construction; an invalid file there is a startup error.
- ``get`` stats the file at most once per ``check_interval_s`` and reloads only when
  (mtime_ns, size, inode, device) changed. A stat is cheap; parsing on every gate check
  is not, and an atomic rename (inode change) or an in-place write (mtime/size change)
  both show up.
- A version that fails to load (invalid, unreadable, deleted) leaves the last good
  policy in force, sets :attr:`last_error` and logs one warning for that version; the
  next good version clears the error.
- With ``reload_on_read=False`` ``get`` never reads the file: only :meth:`refresh` does.
  ``serve`` uses that to parse every new version in a worker thread, so a large or
  hostile file never holds up the event loop that serves the queues.

Limit: an in-place rewrite that keeps the size, inode and mtime (possible only on a
filesystem with coarse timestamps, within one tick) goes unnoticed until the next edit.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from ...config.loader import Declarations, load_queue_config
from ...config.policy import QueuePolicy
from ...domain.entities import QueueConfig
from ...domain.queue_names import validate_stored_queue_name
from ...located.errors import SpecError
from ...ports.clock import Clock

LOGGER = logging.getLogger("stovepipe_fsm.config")


#: What identifies one version of the file without reading it: (mtime_ns, size, inode,
#: device), or None when it cannot be stat'ed.
FileStamp = tuple[int, int, int, int] | None


class MonotonicClock:
    """Milliseconds that never go backwards, so a wall-clock step cannot stall reloads."""

    def now_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class FileConfigStore:
    """Serves :class:`QueueConfig` from a YAML file, hot-reloading valid edits."""

    def __init__(
        self,
        path: str | Path,
        *,
        check_interval_s: float = 1.0,
        clock: Clock | None = None,
        display_name: str | None = None,
        parameters: Declarations = None,
        reload_on_read: bool = True,
    ) -> None:
        if check_interval_s < 0:
            raise ValueError(f"check_interval_s must be >= 0, got {check_interval_s}")
        self._path = Path(path)
        self._name = display_name or str(path)
        self._interval_ms = check_interval_s * 1000.0
        self._reload_on_read = reload_on_read
        self._clock: Clock = clock or MonotonicClock()
        self._lock = threading.Lock()
        self._stamp = _stamp(self._path)
        self._parameters = parameters
        self._policy, self._source = self._load(parameters)
        self._last_error: SpecError | None = None
        self._checked_at_ms = self._clock.now_ms()

    def _load(self, parameters: Declarations) -> tuple[QueuePolicy, bytes]:
        """The file's policy and the bytes it was read from (the version's identity)."""
        try:
            raw = self._path.read_bytes()
        except OSError:
            raw = b""  # the load below reports why, at its location
        policy = load_queue_config(self._path, display_name=self._name, parameters=parameters)
        return policy, raw

    @property
    def path(self) -> Path:
        return self._path

    @property
    def policy(self) -> QueuePolicy:
        """The policy in force: the last version of the file that loaded cleanly."""
        return self._policy

    @property
    def source(self) -> bytes:
        """The bytes of the version in force (what the policy hash counts)."""
        return self._source

    def redeclare(self, parameters: Declarations) -> None:
        """Check the file against other parameter declarations (a new machines version)
        and, when it fits, serve it under them from now on.

        Raises SpecError, located in the file, when the version of the file in force
        does not fit the new declarations; then nothing changes.
        """
        with self._lock:
            policy, raw = self._load(parameters)
            self._parameters, self._policy, self._source = parameters, policy, raw
            self._stamp = _stamp(self._path)

    @property
    def last_error(self) -> SpecError | None:
        """Why the file's current version is not in force, or None when it is."""
        return self._last_error

    def get(self, queue: str) -> QueueConfig:
        """The resolved config for ``queue``; raises InvalidQueueName for a bad name."""
        validate_stored_queue_name(queue)
        self._maybe_refresh()
        return self._policy.resolve(queue)

    def configured_queues(self) -> tuple[str, ...]:
        self._maybe_refresh()
        return self._policy.configured_queues()

    def refresh(self) -> bool:
        """Check the file now, ignoring the interval; True when a new version was loaded."""
        with self._lock:
            self._checked_at_ms = self._clock.now_ms()
            return self._reload_if_changed()

    def _maybe_refresh(self) -> None:
        if not self._reload_on_read:
            return
        now = self._clock.now_ms()
        elapsed = now - self._checked_at_ms
        # A clock that stepped backwards (elapsed < 0) counts as due rather than stalling.
        if 0 <= elapsed < self._interval_ms:
            return
        with self._lock:
            self._checked_at_ms = now
            self._reload_if_changed()

    def _reload_if_changed(self) -> bool:
        # The stamp is taken before reading: if the file changes while we read it, the
        # next check sees a stamp different from the one recorded and reads it again.
        stamp = _stamp(self._path)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            policy, raw = self._load(self._parameters)
        except SpecError as error:
            self._last_error = error
            LOGGER.warning(
                "%s: new version not loaded, keeping the last good configuration:\n%s",
                self._name,
                error,
            )
            return False
        self._policy, self._source = policy, raw
        if self._last_error is not None:
            LOGGER.info("%s: valid again, error cleared", self._name)
        self._last_error = None
        LOGGER.info("%s: reloaded", self._name)
        return True


def _stamp(path: Path) -> FileStamp:
    """The file's current stamp, or None when it cannot be stat'ed (e.g. deleted)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size, info.st_ino, info.st_dev)

"""The policy ``serve`` has in force, and how an edit of it is taken up without a restart.

The config file reloads itself (:class:`~...adapters.file.FileConfigStore`); the machines
directory is watched here, on the same rules: a new version of a machine file is loaded,
validated and linted first (:func:`~...process.catalog.load_process_machines`), and only
a version that passes every check replaces the one in force. A bad version is logged
with its ``file:line:col`` issues and the last good policy stays; so is a plugin whose
import raises, whatever it raises (``SystemExit`` included: a plugin never ends the
service). Plugin modules are imported afresh for each version (:mod:`...machine.plugins`).
Two more checks stand between a new machines version and the running service:

- **No request state may disappear.** Stored requests keep their state in the requests
  bucket for good (terminal ones included), and a request machine that does not declare
  a state cannot load, advance or fail closed a request that is in it. So a new version
  whose request machine lacks any state of the one in force is refused, naming the
  states (a rename counts as a removal). Keep the state, unreachable if it must be, or
  move the stored requests out of it and restart.
- **The config in force must fit the new parameter declarations.** The config file is
  loaded again with the new machines' declarations; if it does not fit (a parameter
  removed that the file still sets, a value the new declaration refuses) the new
  version is refused with the config's located issues. Edit the file first (or after:
  a refused version is checked again on the next edit of either).

Then :class:`PolicyReloader` hands the new machines to the service, which builds new
stages on them and swaps them in between deliveries. Each change of the machines or of
the config in force changes the policy hash (:mod:`...machine.policy_hash`), logged here.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from ...adapters.file import FileConfigStore
from ...adapters.jetstream.policy_record import PolicyRecord
from ...located.errors import SpecError
from ...machine.loader import MACHINE_FILES
from ...machine.policy_hash import policy_hash, read_machine_file
from ...process.catalog import ProcessMachines, load_process_machines

log = logging.getLogger("stovepipe_fsm.service")

#: What identifies one version of a file without reading it: (mtime_ns, size, inode,
#: device), None when it cannot be stat'ed.
Stamp = tuple[int, int, int, int] | None


@dataclass(frozen=True)
class PolicyChange:
    """What :meth:`PolicyReloader.check` found: new machines to swap in, or ``None`` when
    only the config changed (already in force: the store serves it)."""

    machines: ProcessMachines | None
    hash: str


def policy_record(
    machines: ProcessMachines,
    hash_: str,
    replica: str,
    loaded_at_ms: int,
    reloader: PolicyReloader | None = None,
) -> PolicyRecord:
    """What the service records of the policy in force: its hash, the request machine's
    YAML (operator verbs run it) and the facts the other operator commands and ``status``
    read, all derived from ``machines``; with a ``reloader``, when each part was loaded
    and the last refused edit."""
    roles = machines.roles
    refusal = reloader.refusal if reloader is not None else None
    withdrawn = roles.withdrawn_states
    return PolicyRecord(
        hash_,
        loaded_at_ms,
        replica,
        request_initial=roles.initial,
        outcomes={name: sorted(o.states) for name, o in sorted(roles.outcomes.items())},
        terminal_states=sorted(machines.request.terminal),
        parameters=sorted(machines.parameters),
        green_outcome=roles.green_outcome.name,
        coalesces=machines.coalesces,
        withdraw=roles.withdraw,
        # Shown by status: a withdraw whose conditions choose among several states shows
        # none (cancel runs the machine itself, so it is not limited to one).
        withdrawn=next(iter(withdrawn)) if len(withdrawn) == 1 else "",
        preempted=sorted(roles.preempted_states),
        request_machine=machines.request.spec.source,
        machines_loaded_at_ms=reloader.machines_loaded_ms if reloader else loaded_at_ms,
        config_loaded_at_ms=reloader.config_loaded_ms if reloader else loaded_at_ms,
        refused=(
            {**asdict(refusal), "now": reloader.refused_now}
            if refusal is not None and reloader is not None
            else {}
        ),
    )


@dataclass(frozen=True)
class Refusal:
    """The last edit of the policy that was refused: which part (``machines`` or
    ``config``), its located error (``file:line:column: ...``), and when."""

    part: str
    error: str
    at_ms: int


class PolicyRefused(Exception):
    """A new machines version that loads but cannot replace the one in force."""


class PolicyReloader:
    """Watches the machines directory and the config store; reports a new policy."""

    def __init__(
        self, machines_dir: str | Path, machines: ProcessMachines, config: FileConfigStore
    ) -> None:
        """``machines`` loaded from ``machines_dir`` just now, ``config`` with their
        declarations (:meth:`open` does both)."""
        self.machines_dir = Path(machines_dir)
        self.config = config
        self.machines = machines
        self._stamps = self._stat()
        self._sources = self._read()
        self._config_source = config.source
        self.hash = self._hash()
        #: Reloads by part (machines, config) and result (ok, failed), for /metrics.
        self.loads: Counter[tuple[str, str]] = Counter()
        #: When the policy in force was (re)loaded: start, or the last good reload.
        self.last_good_load_s = time.time()
        #: When each part in force was loaded (epoch ms): start, or its last good reload.
        self.machines_loaded_ms = self.config_loaded_ms = int(self.last_good_load_s * 1000)
        #: The last refused edit of either part (kept after a later good load, which
        #: :attr:`refused_now` tells apart), or None.
        self.refusal: Refusal | None = None
        #: Why the machines directory's current version is not in force, or None.
        self.last_error: str | None = None
        self._refused_with = b""  # the config in force when it was refused

    @classmethod
    def open(cls, machines_dir: str | Path, config_path: str | Path) -> PolicyReloader:
        """Load the machines, then the config with their parameter declarations.

        The config is re-read only by :meth:`check` (never on a lookup), so whoever calls
        ``check`` off the event loop keeps every parse of a new version off it too.
        """
        machines = load_process_machines(machines_dir)
        config = FileConfigStore(config_path, parameters=machines.parameters, reload_on_read=False)
        return cls(machines_dir, machines, config)

    def check(self) -> PolicyChange | None:
        """Look at both now; the change to apply, or None when the policy is the same."""
        config_error = self.config.last_error
        self.config.refresh()
        if self.config.last_error is not None and self.config.last_error != config_error:
            self.loads[("config", "failed")] += 1
            self.refusal = Refusal("config", str(self.config.last_error), _now_ms())
        if self.last_error is not None and self.config.source != self._refused_with:
            self._stamps = ()  # the config changed: a refused version may fit it now
        machines = self._check_machines()
        if machines is None and self.config.source == self._config_source:
            return None
        config_before = self._config_source
        self._config_source = self.config.source
        self.hash = self._hash()
        self.loads[("machines" if machines is not None else "config", "ok")] += 1
        self.last_good_load_s = time.time()
        if machines is not None:
            self.machines_loaded_ms = int(self.last_good_load_s * 1000)
        if self.config.source != config_before:
            self.config_loaded_ms = int(self.last_good_load_s * 1000)
        what = "machines and config" if machines is not None else "config"
        log.info("policy %s in force (%s reloaded)", self.hash, what)
        return PolicyChange(machines, self.hash)

    def _check_machines(self) -> ProcessMachines | None:
        stamps = self._stat()
        if stamps == self._stamps:
            return None
        self._stamps = stamps
        old_files = self.machines.plugin_files
        sources = self._read()
        try:
            machines = load_process_machines(self.machines_dir)
            refuse_removed_states(self.machines, machines)
            self.config.redeclare(machines.parameters)
        except (SpecError, PolicyRefused) as error:
            self.loads[("machines", "failed")] += 1
            self.last_error = str(error)
            self.refusal = Refusal("machines", self.last_error, _now_ms())
            self._refused_with = self.config.source
            log.warning(
                "%s: new version not loaded, keeping the policy in force (%s):\n%s",
                self.machines_dir,
                self.hash,
                error,
            )
            return None
        if self.last_error is not None:
            log.info("%s: valid again, error cleared", self.machines_dir)
        self.last_error = None
        self.machines, self._sources = machines, sources
        if machines.plugin_files != old_files:  # watch the new version's plugin files
            self._stamps = self._stat()
        return machines

    @property
    def refused_now(self) -> bool:
        """An edit on disk is refused still: the policy in force is older than it."""
        return self.last_error is not None or self.config.last_error is not None

    @property
    def config_text(self) -> str:
        """The config file's text in force (empty when there is none)."""
        return (self.config.source or b"").decode("utf-8", "replace")

    def _hash(self) -> str:
        specs = [self.machines.request.spec, self.machines.queue_gate.spec]
        return policy_hash(
            self.machines_dir,
            specs,
            self.config.source,
            machine_sources=self._sources,
            plugin_sources=self.machines.plugin_sources,
        )

    def _stat(self) -> tuple[Stamp, ...]:
        """The machine files' stamps and those of the plugin modules in force: an edit of
        either is a new version to load."""
        files = [self.machines_dir / name for name in MACHINE_FILES]
        return tuple(_stamp(path) for path in [*files, *self.machines.plugin_files])

    def _read(self) -> dict[str, bytes]:
        return {name: read_machine_file(self.machines_dir / name) for name in MACHINE_FILES}


def refuse_removed_states(old: ProcessMachines, new: ProcessMachines) -> None:
    """Raise :class:`PolicyRefused` when ``new``'s request machine lacks a state of
    ``old``'s: stored requests may be in any of them (see the module's docstring)."""
    kept = set(new.request.spec.state_names)
    removed = [s for s in old.request.spec.state_names if s not in kept]
    if removed:
        raise PolicyRefused(
            f"{new.request.spec.file}: the new request machine removes state(s) "
            f"{', '.join(repr(s) for s in removed)} of the machine in force; stored requests "
            "may be in them (the requests bucket keeps every request's state, terminal ones "
            "included) and could no longer be loaded or failed closed. Keep the state(s), "
            "unreachable if need be, or move the stored requests out and restart."
        )


def _now_ms() -> int:
    return int(time.time() * 1000)


def _stamp(path: Path) -> Stamp:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size, info.st_ino, info.st_dev)

"""The policy hash: one short name for the policy a process has in force.

An operator who edits ``machines/`` or ``config/queues.yaml`` under a running service
needs to know which version each replica runs; a hash of everything that decides
behaviour answers that at a glance (``serve`` logs it, ``status`` and ``/metrics`` show
it). It is defined as the first 16 hex digits of the SHA-256 of these records, in
this order:

1. each machine file the policy loads (``request.yaml``, ``queue_gate.yaml``), by
   file name, with its bytes;
2. each plugin module the machines list under ``plugins:`` (sorted by module name),
   with the bytes of its source file *as the load of the policy imported it*
   (``plugin_sources``, which :mod:`.plugins` reads at import): an edit after that load
   is not code in force (a module with no source file, or one the caller gives no source
   for, counts by name alone);
3. each installed plugin entry point (sorted), by distribution, version and entry
   point, as those are what an installed plugin is known by;
4. the queue config, with its bytes (the version in force; none when there is none).

A record is ``kind NUL name NUL length NUL bytes``, so no two different policies run
into one byte string. Names are file names, not paths: the same policy checked out in
two directories has the same hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path

from .loader import MACHINE_FILES, OPTIONAL_MACHINE_FILES
from .model import MachineSpec
from .plugins import ENTRY_POINT_GROUP

HASH_DIGITS = 16


def policy_hash(
    machines_dir: str | Path,
    specs: Iterable[MachineSpec],
    config_source: bytes | None,
    *,
    machine_sources: dict[str, bytes] | None = None,
    plugin_sources: Mapping[str, bytes] | None = None,
) -> str:
    """The hash of the policy whose machines ``specs`` were loaded from ``machines_dir``.

    ``machine_sources`` are the machine files' bytes when the caller read them already
    (the exact version it loaded); otherwise they are read now. ``plugin_sources`` are
    the listed plugin modules' sources as the load imported them
    (``LoadedPolicy.plugin_sources``, ``ProcessMachines.plugin_sources``).
    """
    digest = hashlib.sha256()
    for name in MACHINE_FILES:
        raw = (machine_sources or {}).get(name)
        if raw is None:
            raw = read_machine_file(Path(machines_dir) / name)
        if not raw and name in OPTIONAL_MACHINE_FILES:
            continue  # a policy without it hashes as it did before the file existed
        _record(digest, "machine", name, raw)
    for module in sorted({ref.name for spec in specs for ref in spec.plugins}):
        _record(digest, "plugin", module, (plugin_sources or {}).get(module, b""))
    for entry in installed_plugins():
        _record(digest, "entry-point", entry, b"")
    if config_source is not None:
        _record(digest, "config", "queues", config_source)
    return digest.hexdigest()[:HASH_DIGITS]


def read_machine_file(path: Path) -> bytes:
    """A machine file's bytes; an unreadable one counts as empty (it did not load)."""
    try:
        return path.read_bytes()
    except OSError:
        return b""


def installed_plugins() -> list[str]:
    """``distribution version: name = value`` of each installed plugin entry point."""
    found = metadata.entry_points(group=ENTRY_POINT_GROUP)
    described = []
    for ep in found:
        dist = ep.dist
        owner = f"{dist.name} {dist.version}" if dist is not None else "?"
        described.append(f"{owner}: {ep.name} = {ep.value}")
    return sorted(described)


def _record(digest: hashlib._Hash, kind: str, name: str, raw: bytes) -> None:
    digest.update(f"{kind}\0{name}\0{len(raw)}\0".encode())
    digest.update(raw)

"""Plugins: conditions and actions a policy adds in its own Python modules.

A plugin is a module with a ``register(plugin)`` function. It is found two ways:

- the ``plugins:`` list of a machine file names importable modules. Each is imported
  with the *policy directory* (the directory that contains the machines directory)
  first on the module search path, then the interpreter's own path, so a policy can
  ship ``rules.py`` beside ``machines/`` without installing anything;
- an installed distribution declares an entry point in the group ``stovepipe_fsm.plugins``
  (``name = package.module`` or ``name = package.module:register``); every policy
  loaded in that environment uses it.

What a plugin registers belongs to the policy that loaded it, never to the process:
:func:`policy_registries` copies the built-in registries and invariant catalogue and
adds what this policy's plugins register, so two policies (or two versions of one)
load side by side in one process (``validate A B``, ``whatif``, a hot reload). A module
found in the policy directory is imported afresh for every load, under a private name
(:func:`_import`): each load runs that version's code, and nothing it does at import
reaches another policy's copy.

``register`` receives the object ``api`` builds over a fresh, empty registry per
machine and an empty invariant catalogue; what it registers is then added to the
policy's own. Anything that goes wrong is a located issue, at the ``plugins:`` item that
names the module (or at the entry point's line in the distribution's
``entry_points.txt``):

- ``plugin-import``    the module or entry point cannot be imported (whatever its
                       import raised, ``SystemExit`` included, on one line), or it
                       names a module of stovepipe-fsm itself
- ``plugin-entry``     the module has no ``register`` function
- ``plugin-register``  ``register`` raised, or registered something the policy cannot
                       use (an async condition, a name that is not an identifier)
- ``plugin-duplicate`` a name registered twice for one machine: by one plugin, by two,
                       or by a plugin and the built-in vocabulary (invariants alike)
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import re
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path
from types import ModuleType
from typing import Any, Generic, TypeVar

from ..located.errors import Location, SpecIssue
from .invariants import INVARIANTS, InvariantCatalog
from .model import NameRef
from .registry import ActionInfo, ConditionInfo, DuplicateName, RegistrationRefused, Registry

ENTRY_POINT_GROUP = "stovepipe_fsm.plugins"
REGISTER = "register"
PACKAGE = "stovepipe_fsm"
IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]*$")

Ctx = TypeVar("Ctx")
ApiFactory = Callable[[Mapping[str, Registry], InvariantCatalog], object]
#: Where a listed module found in a policy directory is imported: ``<prefix><n>.<name>``,
#: a new ``n`` for every load.
PRIVATE_PREFIX = "_stovepipe_fsm_policy_"
_loads = itertools.count(1)


class MachineVocabulary(Generic[Ctx]):
    """What a plugin registers for one machine; ``Ctx`` is what its callables receive.

    The same rules as the built-in registrations (:class:`.registry.Registry`), checked
    when ``register`` runs: a condition must be a synchronous predicate, a name must be
    an identifier the YAML can spell, and a name may be registered once.
    """

    def __init__(self, registry: Registry, *, no_actions: str = "") -> None:
        self._registry = registry
        self._no_actions = no_actions

    @property
    def machine(self) -> str:
        """The machine these names belong to."""
        return self._registry.machine

    def condition(
        self,
        name: str | None = None,
        *,
        provides: Iterable[str] = (),
        provides_unless: Iterable[str] = (),
        parameters: Iterable[str] = (),
    ) -> Callable[[Callable[[Ctx], bool]], Callable[[Ctx], bool]]:
        """Register a synchronous predicate; ``provides[_unless]``: facts when true/false;
        ``parameters``: the machine parameters it reads (the machine must declare them)."""
        inner = self._registry.condition(
            name, provides=provides, provides_unless=provides_unless, parameters=parameters
        )

        def register(fn: Callable[[Ctx], bool]) -> Callable[[Ctx], bool]:
            self._check_name(name or fn.__name__, "condition")
            inner(self._wrap(fn))
            return fn

        return register

    def action(
        self,
        name: str | None = None,
        *,
        provides: Iterable[str] = (),
        requires: Iterable[str] = (),
        finishes: bool = False,
        parameters: Iterable[str] = (),
    ) -> Callable[[Callable[[Ctx], Any]], Callable[[Ctx], Any]]:
        """Register a step (a function or a coroutine function) that may do I/O;
        ``parameters``: the machine parameters it reads (the machine must declare them)."""
        if self._no_actions:
            raise RegistrationRefused(f"{self.machine}: {self._no_actions}")
        inner = self._registry.action(
            name, provides=provides, requires=requires, finishes=finishes, parameters=parameters
        )

        def register(fn: Callable[[Ctx], Any]) -> Callable[[Ctx], Any]:
            self._check_name(name or fn.__name__, "action")
            inner(self._wrap(fn))
            return fn

        return register

    def _wrap(self, fn: Callable[[Ctx], Any]) -> Callable[[Any], Any]:
        """What the registry stores for ``fn``: ``fn`` itself here."""
        return fn

    def _check_name(self, key: str, kind: str) -> None:
        if not IDENTIFIER.match(key):
            raise RegistrationRefused(
                f"{self.machine}: {kind} name {key!r} is not an identifier a machine file can "
                "name (lower-case letters, digits and '_', starting with a letter)"
            )


# --- loading --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plugin:
    """One plugin to load: how to find its ``register`` and where to report problems."""

    label: str  # "plugin 'rules'" or "plugin entry point 'x = m' of distribution 'd'"
    origin: str  # recorded on its registrations (diagrams show it)
    locations: tuple[Location, ...]
    load: Callable[[], object]
    module_name: str = ""


class _PluginFailed(Exception):
    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


@dataclass(frozen=True)
class PolicyVocabulary:
    """What one loaded policy's machines may name: conditions and actions by machine,
    and the invariants ``invariants:`` may declare. Built-ins plus this policy's plugins;
    no other policy sees them."""

    registries: dict[str, Registry]
    invariants: InvariantCatalog
    issues: tuple[SpecIssue, ...] = ()
    #: Each listed module that loaded, by name: the bytes of its source file as this load
    #: imported it (empty for a module without one). Part of the policy hash.
    plugin_sources: Mapping[str, bytes] = field(default_factory=dict)
    #: The source files of those modules: an edit of one is a new version of the policy.
    plugin_files: tuple[Path, ...] = ()

    @property
    def failed_plugins(self) -> bool:
        """Whether a plugin did not load or register: the names it would have added are
        missing, so an unknown name is no news of its own."""
        return any(issue.rule in _FAILED_TO_LOAD for issue in self.issues)


_FAILED_TO_LOAD = frozenset({"plugin-import", "plugin-entry", "plugin-register"})


def policy_registries(
    builtins: Mapping[str, Registry],
    plugins: Sequence[NameRef],
    api: ApiFactory,
    *,
    policy_dir: Path | None,
    invariants: InvariantCatalog = INVARIANTS,
) -> PolicyVocabulary:
    """The built-in registries and invariants plus what the installed and listed plugins
    register.

    ``plugins`` are the ``plugins:`` items of every machine file of the policy, in file
    order (a module listed in two files is loaded once and reported at both items);
    ``policy_dir`` is put first on the module search path while they are imported.
    """
    registries = {name: registry.copy() for name, registry in builtins.items()}
    catalog = invariants.copy()
    issues: list[SpecIssue] = []
    sources: dict[str, bytes] = {}
    files: list[Path] = []
    seen: set[int] = set()  # register functions already run (one module listed twice)
    for plugin in [*_installed(), *_listed(plugins, policy_dir)]:
        try:
            register, module = _register_function(plugin)
            if plugin.module_name and module is not None:
                sources[plugin.module_name], file = _source_of(module)
                files += [file] if file is not None else []
            if id(register) in seen:
                continue
            seen.add(id(register))
            staged, staged_invariants = _run(plugin, register, registries, api, policy_dir)
        except _PluginFailed as failed:
            issues += _at_plugin(plugin, [str(failed)], failed.rule)
            continue
        issues += _merge(plugin, staged, registries)
        issues += _merge_invariants(plugin, staged_invariants, catalog)
    return PolicyVocabulary(registries, catalog, tuple(issues), sources, tuple(files))


def _listed(refs: Sequence[NameRef], policy_dir: Path | None) -> Iterator[_Plugin]:
    where: dict[str, list[Location]] = {}
    for ref in refs:
        where.setdefault(ref.name, []).append(ref.location)
    for name, locations in where.items():
        yield _Plugin(
            label=f"plugin {name!r}",
            origin=name,
            locations=tuple(locations),
            load=partial(_import, name, policy_dir),
            module_name=name,
        )


def _installed() -> Iterator[_Plugin]:
    found = metadata.entry_points(group=ENTRY_POINT_GROUP)
    for ep in sorted(found, key=lambda ep: (_dist_name(ep), ep.name, ep.value)):
        yield _Plugin(
            label=(
                f"plugin entry point '{ep.name} = {ep.value}' of distribution {_dist_name(ep)!r}"
            ),
            origin=f"{_dist_name(ep)}:{ep.name}",
            locations=(_entry_point_location(ep),),
            load=ep.load,
        )


def _register_function(plugin: _Plugin) -> tuple[Callable[[object], object], ModuleType | None]:
    """The plugin's ``register`` function, and the module it was found in (if one)."""
    try:
        loaded = plugin.load()
    except (_PluginFailed, KeyboardInterrupt):
        raise
    except BaseException as exc:  # SystemExit too: a plugin never ends the process
        raise _PluginFailed(
            "plugin-import", f"{plugin.label} cannot be imported: {_one_line(exc)}"
        ) from None
    if isinstance(loaded, ModuleType):
        register = getattr(loaded, REGISTER, None)
        if not callable(register):
            raise _PluginFailed(
                "plugin-entry",
                f"{plugin.label} has no {REGISTER}(plugin) function; define "
                f"'def {REGISTER}(plugin: PluginRegistry) -> None' in "
                f"{plugin.module_name or loaded.__name__}",
            )
        return register, loaded
    if not callable(loaded):
        raise _PluginFailed(
            "plugin-entry",
            f"{plugin.label} names a {type(loaded).__name__}, not a module or a "
            f"{REGISTER}(plugin) function",
        )
    return loaded, None


def _run(
    plugin: _Plugin,
    register: Callable[[object], object],
    registries: Mapping[str, Registry],
    api: ApiFactory,
    policy_dir: Path | None,
) -> tuple[dict[str, Registry], InvariantCatalog]:
    staged = {
        name: registry.copy(origin=plugin.origin, empty=True)
        for name, registry in registries.items()
    }
    invariants = InvariantCatalog()
    try:
        with _search_path(policy_dir if plugin.module_name else None):
            register(api(staged, invariants))
    except DuplicateName as exc:
        raise _PluginFailed("plugin-duplicate", f"{plugin.label}: {exc}") from None
    except RegistrationRefused as exc:
        raise _PluginFailed("plugin-register", f"{plugin.label}: {exc}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: a plugin never ends the process
        raise _PluginFailed(
            "plugin-register", f"{plugin.label}: {REGISTER}() raised {_one_line(exc)}"
        ) from None
    return staged, invariants


def _merge(
    plugin: _Plugin, staged: Mapping[str, Registry], registries: Mapping[str, Registry]
) -> list[SpecIssue]:
    """Add what ``plugin`` registered; a name the machine already has is an issue."""
    problems: list[str] = []
    for machine, registry in staged.items():
        target = registries[machine]
        tables: list[tuple[str, Mapping[str, ConditionInfo | ActionInfo], dict[str, Any]]] = [
            ("condition", registry.conditions, target.conditions),
            ("action", registry.actions, target.actions),
        ]
        for kind, entries, into in tables:
            for info in entries.values():
                taken = target.conditions.get(info.name) or target.actions.get(info.name)
                if taken is None:
                    into[info.name] = info
                    continue
                owner = f"plugin {taken.origin!r}" if taken.origin else "the built-in vocabulary"
                problems.append(
                    f"{plugin.label} registers {kind} {info.name!r} for machine {machine!r}, "
                    f"which {owner} already registers; choose another name"
                )
    return _at_plugin(plugin, problems, "plugin-duplicate")


def _merge_invariants(
    plugin: _Plugin, staged: InvariantCatalog, catalog: InvariantCatalog
) -> list[SpecIssue]:
    """Add the invariants ``plugin`` registered; a name the catalogue has is an issue."""
    problems: list[str] = []
    for info in staged:
        if info.name in catalog:
            problems.append(
                f"{plugin.label} registers invariant {info.name!r}, which the policy's "
                "invariant catalogue already has; choose another name"
            )
        else:
            catalog.add(info)
    return _at_plugin(plugin, problems, "plugin-duplicate")


def _at_plugin(plugin: _Plugin, problems: Iterable[str], rule: str) -> list[SpecIssue]:
    """Each problem at every place that names ``plugin``."""
    return [SpecIssue(where, problem, rule) for problem in problems for where in plugin.locations]


# --- importing a listed module ------------------------------------------------------------

# The source of each plugin module object, read the first time it is asked for (right
# after a policy directory's module is imported; a shared installed module may have been
# imported long before): an edit of the file after that is not code in force.
_SOURCES: weakref.WeakKeyDictionary[ModuleType, tuple[bytes, Path | None]] = (
    weakref.WeakKeyDictionary()
)


def _source_of(module: ModuleType) -> tuple[bytes, Path | None]:
    """The bytes of ``module``'s source file, and the file (``b""``, None without one)."""
    cached = _SOURCES.get(module)
    if cached is None:
        spec = getattr(module, "__spec__", None)
        origin = spec.origin if spec is not None and spec.has_location else None
        try:
            cached = (Path(origin).read_bytes(), Path(origin)) if origin else (b"", None)
        except OSError:
            cached = (b"", None)
        _SOURCES[module] = cached
    return cached


def _import(name: str, policy_dir: Path | None) -> ModuleType:
    """Import ``name`` for this load of a policy: from ``policy_dir`` first, then ``sys.path``.

    A module found in ``policy_dir`` is executed afresh, as ``<private package>.<name>``
    where the private package is new for this load and searches ``policy_dir`` only:
    two policies with a module of the same name, or two versions of one policy, each get
    their own module objects, and ``sys.modules`` entries of that name are left alone.
    Relative imports inside the plugin work as in any package. A module found on
    ``sys.path`` only (installed) is imported as usual and shared.
    """
    if name == PACKAGE or name.startswith(f"{PACKAGE}."):
        raise _PluginFailed(
            "plugin-import",
            f"plugin {name!r} is a module of stovepipe-fsm itself; a plugin is a module of "
            "your own with a register(plugin) function",
        )
    top = name.partition(".")[0]
    with _search_path(policy_dir):
        importlib.invalidate_caches()
        own = policy_dir is not None and PathFinder.find_spec(top, [str(policy_dir)]) is not None
        private = _private_package(policy_dir) if own and policy_dir is not None else ""
        writes_bytecode = sys.dont_write_bytecode
        sys.dont_write_bytecode = own  # no cached bytecode to outlive an edit of the source
        try:
            return importlib.import_module(f"{private}.{name}" if private else name)
        except BaseException:
            for key in [k for k in sys.modules if private and k.partition(".")[0] == private]:
                del sys.modules[key]
            raise
        finally:
            sys.dont_write_bytecode = writes_bytecode


def _private_package(policy_dir: Path) -> str:
    """A new, empty package whose modules are the files of ``policy_dir``."""
    name = f"{PRIVATE_PREFIX}{next(_loads)}"
    spec = ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(policy_dir)]
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    return name


@contextmanager
def _search_path(policy_dir: Path | None) -> Iterator[None]:
    """``policy_dir`` first on ``sys.path`` for the duration (a plugin may import lazily
    in ``register``); the path is restored afterwards."""
    if policy_dir is None:
        yield
        return
    entry = str(policy_dir)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        if entry in sys.path:
            sys.path.remove(entry)


# --- entry points ---------------------------------------------------------------------------


def _dist_name(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return str(dist.name) if dist is not None else "unknown"


def _entry_point_location(ep: metadata.EntryPoint) -> Location:
    """The entry point's line in its distribution's ``entry_points.txt``, when found."""
    path = _entry_points_file(getattr(ep, "dist", None))
    if path is None:
        return Location(f"<entry point {ep.name}>", 1, 1)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return Location(str(path), 1, 1)
    section = ""
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if text.startswith("[") and text.endswith("]"):
            section = text[1:-1].strip()
        elif section == ENTRY_POINT_GROUP and text.partition("=")[0].strip() == ep.name:
            return Location(str(path), number, line.index(text) + 1)
    return Location(str(path), 1, 1)


def _entry_points_file(dist: metadata.Distribution | None) -> Path | None:
    if dist is None:
        return None
    for file in dist.files or ():
        if file.name == "entry_points.txt" and file.parent.name.endswith(".dist-info"):
            return Path(str(file.locate()))
    base = getattr(dist, "_path", None)  # a dist-info directory without a RECORD
    return Path(base) / "entry_points.txt" if base is not None else None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

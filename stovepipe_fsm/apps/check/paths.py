"""What a head may change, for ``check``: a few path classes derived from the policy's globs.

A decision that reads changed paths (``full_build_paths`` today) branches on which globs
the paths since last green match, not on the paths themselves. So ``check`` gives each
head it ingests after the first the paths of one *class*:

- ``other``: a path that matches no glob of the policy (an ordinary change);
- one class per declared parameter whose value for the checked queue is a non-empty
  list of globs (its declaration is an array of strings): a path matching one of them,
  and if possible no glob of any other such parameter (``full_build_paths`` gives a
  build-file change; a parameter of skippable paths would give a skip-only change).

Which parameters are globs is read from their declarations, so a parameter a policy adds
is explored without the checker knowing its name. A policy whose checked queue sets no
such list gets no classes: no head changes anything, the decision never asks, and the
search is the one it was without paths. The first head is the root of the history:
every later head descends from it, so its own changes are in no diff since a last green,
and it is given none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...domain.path_globs import path_matches
from ...machine.model import ParameterSpec

#: The class of a change no glob of the policy matches.
OTHER = "other"
#: Paths tried, in order, for the ``other`` class: the first no glob matches is taken.
OTHER_CANDIDATES = ("src/main.c", "lib/other/file.txt", "zz-unmatched-0/zz-unmatched-1.zz")


@dataclass(frozen=True)
class PathClass:
    """One kind of change: its name (``other``, or the parameter whose globs it
    matches) and the paths a head of this class changes."""

    name: str
    paths: tuple[str, ...]


def glob_parameters(
    parameters: Mapping[str, ParameterSpec], values: Mapping[str, Any]
) -> dict[str, tuple[str, ...]]:
    """The declared parameters that are lists of globs, with their non-empty values."""
    found: dict[str, tuple[str, ...]] = {}
    for name, spec in parameters.items():
        schema = spec.value_schema()
        items = schema.get("items")
        if schema.get("type") != "array" or not isinstance(items, dict):
            continue
        if items.get("type") != "string":
            continue
        value = values.get(name, spec.default)
        globs = tuple(str(g) for g in value or ())
        if globs:
            found[name] = globs
    return found


def path_classes(
    parameters: Mapping[str, ParameterSpec], values: Mapping[str, Any]
) -> tuple[PathClass, ...]:
    """The classes a head may change, in a fixed order (``other`` first); none when
    no glob parameter is set for the queue."""
    globs = glob_parameters(parameters, values)
    if not globs:
        return ()
    everything = [g for patterns in globs.values() for g in patterns]
    classes: list[PathClass] = []
    other = next((p for p in OTHER_CANDIDATES if not _matches(p, everything)), None)
    if other is not None:
        classes.append(PathClass(OTHER, (other,)))
    for name, patterns in globs.items():
        rest = [g for n, ps in globs.items() if n != name for g in ps]
        examples = [e for e in (example_path(g) for g in patterns) if e is not None]
        if not examples:
            continue
        alone = next((e for e in examples if not _matches(e, rest)), examples[0])
        classes.append(PathClass(name, (alone,)))
    return tuple(classes)


def example_path(glob: str) -> str | None:
    """A repository path ``glob`` matches (one directory deep where ``**`` allows), or
    ``None`` when the simple substitutions give none."""
    for deep in ("x/", ""):
        path = glob.replace("**/", deep).replace("**", "x").replace("*", "x").replace("?", "x")
        if path and path_matches(path, glob):
            return path
    return None


def _matches(path: str, globs: Iterable[str]) -> bool:
    return any(path_matches(path, g) for g in globs)

"""The layering of docs/architecture.md, enforced on the source.

The core (domain, ports, spec, config, process) must never import an adapter or an
app: that is what lets the same controller run on the in-memory adapters and on
JetStream. Each layer may only import the layers below it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "stovepipe_fsm"

# layer -> the package's sub-packages it may import (itself included)
ALLOWED: dict[str, set[str]] = {
    "domain": {"domain"},
    "ports": {"ports", "domain"},
    "spec": {"spec", "domain"},
    "config": {"config", "spec", "domain"},
    "process": {"process", "spec", "ports", "domain"},
    "pipeline": {"pipeline", "process", "spec", "ports", "domain"},
    "adapters": {"adapters", "config", "ports", "domain", "spec"},
    "apps": {"apps", "adapters", "pipeline", "process", "config", "spec", "ports", "domain"},
}
# layer -> pure decision modules of a layer it may not otherwise import: data in, a
# decision out, no I/O. A shell calls such a function and performs what it decides, so
# the JetStream consumer and the simulated world settle deliveries by one policy.
PURE_DECISIONS: dict[str, set[str]] = {"adapters": {"domain.settle"}}


def imported_modules(path: Path, root: Path = PACKAGE) -> set[tuple[str, int]]:
    """(module under the package, line) for every import of another sub-package."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    depth = len(path.relative_to(root).parts)  # e.g. process/gate.py -> 2
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: climb to the package root, then take the module
                if node.level < depth or not node.module:
                    continue
                found.add((node.module, node.lineno))
            elif node.module and node.module.startswith("stovepipe_fsm."):
                found.add((node.module.removeprefix("stovepipe_fsm."), node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("stovepipe_fsm."):
                    found.add((alias.name.removeprefix("stovepipe_fsm."), node.lineno))
    return found


def imported_layers(path: Path, root: Path = PACKAGE) -> set[tuple[str, int]]:
    """(sub-package, line) for every import of stovepipe_fsm.<sub-package> in ``path``."""
    return {(module.split(".")[0], line) for module, line in imported_modules(path, root)}


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_layers_below_it(layer: str) -> None:
    offenders = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for module, line in imported_modules(path):
            target = module.split(".")[0]
            if target not in ALLOWED or target in ALLOWED[layer]:
                continue
            if module not in PURE_DECISIONS.get(layer, set()):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    assert offenders == []


def test_a_pure_decision_module_does_no_io() -> None:
    """What a lower layer may import from a higher one stays data in, data out."""
    for modules in PURE_DECISIONS.values():
        for module in modules:
            path = PACKAGE / (module.replace(".", "/") + ".py")
            layers = {target for target, _ in imported_layers(path)}
            assert layers <= {"domain"}, f"{module} imports {sorted(layers)}"
            assert "async def" not in path.read_text(encoding="utf-8"), module


def test_every_sub_package_has_a_layer() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(ALLOWED)


def test_the_checker_sees_every_import_form(tmp_path: Path) -> None:
    """The rule is not vacuous: relative, absolute and plain imports are all seen."""
    root = tmp_path / "stovepipe_fsm"
    bad = root / "process" / "sub" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "from ...adapters.memory import MemoryPublisher\n"
        "from stovepipe_fsm.apps import cli\n"
        "import stovepipe_fsm.adapters.git\n"
        "from . import sibling\n",
        encoding="utf-8",
    )
    assert imported_layers(bad, root) == {("adapters", 1), ("apps", 2), ("adapters", 3)}

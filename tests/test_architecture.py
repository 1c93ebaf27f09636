"""The layering of docs/architecture.md, enforced by the import-linter contracts.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``) and ``make test`` runs
``lint-imports``. These tests prove the contracts hold on the source, that they catch
each form an import can take (relative, absolute, from the package root, inside a
function), that every sub-package is placed in a layer, and that no module takes part in
an import cycle. Dynamic imports would be invisible to any static check, so the package
has none of its own modules: the one dynamic import is the plugin loader's, which imports
the modules a policy names and refuses any module of the package.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp  # import-linter's own graph builder
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "stovepipe_fsm"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
    "importlinter"
]["contracts"]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_shipped_source_keeps_every_contract() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in done.stdout


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layering")
    shutil.copytree(PACKAGE, root / "stovepipe_fsm", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


VIOLATIONS = [
    # (file, appended source, the contract that must break)
    (
        "process/gate.py",
        "from .. import adapters\n",
        "The core never imports an adapter, an app or the simulation",
    ),
    (
        "pipeline/record.py",
        "from stovepipe_fsm import apps\n",
        "The core never imports an adapter, an app or the simulation",
    ),
    (
        "domain/ids.py",
        "def _late():\n    from ..simulation import world\n\n    return world\n",
        "The core never imports an adapter, an app or the simulation",
    ),
    (
        "adapters/jetstream/consumer.py",
        "import stovepipe_fsm.pipeline.ingest\n",
        "Adapters implement ports; they never import the stages they serve",
    ),
    (
        "apps/check/command.py",
        "from ..service import command as _service_command\n",
        "Apps do not import each other sideways",
    ),
    (
        "machine/model.py",
        "from ..config import loader\n",
        "Layers: each imports only the layers below it",
    ),
]


@pytest.mark.parametrize(("target", "source", "contract"), VIOLATIONS)
def test_each_import_form_that_crosses_a_layer_is_caught(
    copy: Path, target: str, source: str, contract: str
) -> None:
    path = copy / "stovepipe_fsm" / target
    original = path.read_text(encoding="utf-8")
    path.write_text(original + "\n" + source, encoding="utf-8")
    try:
        done = lint_imports(copy)
    finally:
        path.write_text(original, encoding="utf-8")
    assert done.returncode == 1, done.stdout
    assert f"{contract} BROKEN" in done.stdout


def test_every_sub_package_is_placed_in_a_layer() -> None:
    (layers,) = [c["layers"] for c in CONTRACTS if c["type"] == "layers"]
    placed = {name.strip() for layer in layers for name in layer.split("|")}
    packages = {
        f"stovepipe_fsm.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()
    }
    assert packages == placed


PLUGIN_LOADER = "stovepipe_fsm/machine/plugins.py"


def test_the_package_has_no_dynamic_imports_but_the_plugin_loader() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__"):
                found.append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno}")
    plugin_loader = [f for f in found if f.startswith(f"{PLUGIN_LOADER}:")]
    assert len(plugin_loader) == 1
    assert [f for f in found if f not in plugin_loader] == []


def test_no_module_takes_part_in_an_import_cycle() -> None:
    graph = grimp.build_graph("stovepipe_fsm")
    cycles = sorted(
        (importer, imported)
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        if graph.chain_exists(importer=imported, imported=importer)
    )
    assert cycles == []

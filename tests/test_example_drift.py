"""Example policies cannot drift from the shipped policy they say they use.

Each example's README declares, on its ``Machines:`` line, every machine file of the
example as ``shipped`` (the file is the shipped machine) or ``own`` (the example's own
version). The test derives which machine files differ from the shipped ones (their YAML
data, so a comment of the example's own is no difference) and fails when a declaration
says otherwise, naming the top-level keys that differ.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from stovepipe_fsm.located.yaml_source import read_yaml
from stovepipe_fsm.shipped import SHIPPED_MACHINES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "policies"
NAMES = sorted(p.name for p in EXAMPLES.iterdir() if (p / "machines").is_dir())
DECLARED = re.compile(r"`([a-z_]+\.yaml)` (shipped|own)\b")


def declarations(example: Path) -> dict[str, str]:
    """``{file: "shipped" | "own"}`` from the README's ``Machines:`` paragraph."""
    readme = (example / "README.md").read_text(encoding="utf-8")
    found = re.search(r"^Machines: (.*?)(?:\n\n|\Z)", readme, re.M | re.S)
    assert found, f"{example.name}/README.md has no 'Machines:' line"
    return dict(DECLARED.findall(found.group(1)))


def data(path: Path) -> dict[str, Any]:
    loaded = read_yaml(path).data
    assert isinstance(loaded, dict)
    return loaded


def differing_keys(mine: dict[str, Any], shipped: dict[str, Any]) -> list[str]:
    return sorted(k for k in mine.keys() | shipped.keys() if mine.get(k) != shipped.get(k))


@pytest.mark.parametrize("name", NAMES)
def test_each_machine_is_what_the_readme_says_it_is(name: str) -> None:
    example = EXAMPLES / name
    declared = declarations(example)
    files = sorted(p.name for p in (example / "machines").glob("*.yaml"))
    assert sorted(declared) == files, f"{name}: declare every machine file, and only those"
    wrong = []
    for file, claim in sorted(declared.items()):
        shipped = SHIPPED_MACHINES / file
        keys = (
            differing_keys(data(example / "machines" / file), data(shipped))
            if (shipped.is_file())
            else ["(no shipped machine of that name)"]
        )
        if claim == "shipped" and keys:
            wrong.append(f"{file} is declared shipped but differs in: {', '.join(keys)}")
        if claim == "own" and not keys:
            wrong.append(f"{file} is declared own but is the shipped machine")
    assert wrong == [], f"{name}: " + "; ".join(wrong)


def test_the_comparison_sees_a_changed_transition(tmp_path: Path) -> None:
    # What would have caught the older gate: one guard different is a difference.
    gate = SHIPPED_MACHINES / "queue_gate.yaml"
    older = tmp_path / "queue_gate.yaml"
    text = gate.read_text(encoding="utf-8")
    assert text.count("conditions: outside_newest_n") == 1
    older.write_text(text.replace("conditions: outside_newest_n", "conditions: newer_head_exists"))
    assert differing_keys(data(older), data(gate)) == ["transitions"]
    commented = tmp_path / "commented.yaml"
    commented.write_text("# an example's own header\n" + text, encoding="utf-8")
    assert differing_keys(data(commented), data(gate)) == []

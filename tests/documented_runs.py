"""A command a docs section shows in a ``console`` block, and the output it shows.

The block's first command (continued over lines ending in ``\\``) is what a user types;
the lines after it are output, in blocks separated by ``...`` lines (the output the
section leaves out). A test runs the command and finds each block, in order.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path


def documented(doc: Path, heading: str) -> tuple[list[str], list[list[str]]]:
    """The section's command (its arguments after ``stovepipe-fsm``) and the blocks of
    output lines it shows, each after a ``...`` line."""
    text = doc.read_text(encoding="utf-8")
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```console\n(.*?)```", section, re.S)
    assert block, f"no console block in {heading!r}"
    lines = block.group(1).splitlines()
    command: list[str] = []
    rest = iter(lines)
    for line in rest:
        command.append(line.removeprefix("$ ").rstrip("\\").strip())
        if not line.endswith("\\"):
            break
    shown = list(rest)
    assert shown[0] == "..."
    argv = shlex.split(" ".join(command))
    assert argv[:2] == ["stovepipe-fsm", "whatif"]
    blocks: list[list[str]] = []
    for line in shown:
        if line == "...":
            blocks.append([])
        else:
            blocks[-1].append(line)
    return argv[1:], blocks


def shown_in_order(out: list[str], blocks: list[list[str]]) -> bool:
    """Whether each block is a run of ``out``'s lines, each after the one before."""
    start = 0
    for block in blocks:
        at = next((i for i in range(start, len(out)) if out[i : i + len(block)] == block), None)
        if at is None:
            return False
        start = at + len(block)
    return True

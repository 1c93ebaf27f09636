"""The example policies under ``examples/policies``: each one, as a user would run it.

For every example: ``validate`` its machines and config, ``diagram --check`` against its
committed diagrams, ``stovepipe-fsm test`` on its timelines, and ``check`` of the
invariants its machines declare, with bounds small enough for the suite. The examples
are written without touching the package, so these runs are what a team changing its
own policy would do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from stovepipe_fsm.apps.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "policies"


@dataclass(frozen=True)
class Example:
    name: str
    check: tuple[str, ...]  # small bounds: each run well under 20 s

    @property
    def path(self) -> Path:
        return EXAMPLES / self.name

    def policy(self) -> list[str]:
        return ["--machines", str(self.path / "machines"), "--config", self.config]

    @property
    def config(self) -> str:
        return str(self.path / "config" / "queues.yaml")


SMALL = ("--heads", "2", "--max-concurrent", "1", "--jobs", "1", "--quiet")
EXAMPLE_LIST = (
    Example("serial_every_head", SMALL),
    Example("pause_and_full_build", (*SMALL, "--no-rewrite", "--max-concurrent", "2")),
    Example("embargo_plugin", SMALL),
    Example(
        "monorepo_trial", ("--queue", "mono/main", *SMALL, "--no-rewrite", "--max-concurrent", "2")
    ),
    Example(
        "monorepo_deploy", ("--queue", "mono/main", *SMALL, "--no-rewrite", "--max-concurrent", "2")
    ),
    Example("cancel_in_progress", SMALL),
    Example("skip_intermediate_builds", (*SMALL, "--no-rewrite", "--max-concurrent", "2")),
    Example("supercedent", SMALL),
    # The main queue searches (probe_slots 2): the gate's invariants hold with probes in
    # flight, and the culprit exploration proves the search.
    Example("find_culprits", ("--queue", "monorepo/main", *SMALL, "--no-rewrite")),
)


def test_every_example_directory_is_tested() -> None:
    found = {p.name for p in EXAMPLES.iterdir() if (p / "machines").is_dir()}
    assert found == {e.name for e in EXAMPLE_LIST}


@pytest.mark.parametrize("example", EXAMPLE_LIST, ids=lambda e: e.name)
def test_validates(example: Example, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["validate", str(example.path / "machines"), example.config])
    assert code == 0, capsys.readouterr().out


@pytest.mark.parametrize("example", EXAMPLE_LIST, ids=lambda e: e.name)
def test_diagrams_are_current(example: Example, capsys: pytest.CaptureFixture[str]) -> None:
    machines, docs = str(example.path / "machines"), str(example.path / "docs")
    assert main(["diagram", "--machines", machines, "--out", docs, "--check"]) == 0, (
        capsys.readouterr()
    )


@pytest.mark.parametrize("example", EXAMPLE_LIST, ids=lambda e: e.name)
def test_timelines_pass(example: Example, capsys: pytest.CaptureFixture[str]) -> None:
    timelines = sorted((example.path / "timelines").glob("*.yaml"))
    assert timelines
    code = main(["test", *map(str, timelines), *example.policy()])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert f"{len(timelines)} passed, 0 failed" in err


@pytest.mark.parametrize("example", EXAMPLE_LIST, ids=lambda e: e.name)
def test_check_proves_what_it_declares(
    example: Example, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "counterexample.yaml"
    code = main(["check", *example.policy(), *example.check, "--out", str(out_file)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "ok: every invariant holds" in out
    assert not out_file.exists()


@pytest.mark.slow  # explorations of an example policy
def test_serial_every_head_proves_the_coalescing_invariants_in_its_mode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The example declares the shipped invariants; check reads its queue's every_head,
    so admitting older heads passes admits_latest and keeps_newest_n."""
    example = EXAMPLE_LIST[0]
    assert main(["check", *example.policy(), *SMALL, "--no-rewrite"]) == 0
    lines = capsys.readouterr().out.splitlines()
    proves = next(line for line in lines if line.startswith("proves"))
    assert "admits_latest" in proves and "keeps_newest_n" in proves and "progress" in proves


def test_the_trial_release_queue_keeps_every_head_in_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    example = next(e for e in EXAMPLE_LIST if e.name == "monorepo_trial")
    args = ["--queue", "mono/release-1", "--no-rewrite", *SMALL]
    assert main(["check", *example.policy(), *args]) == 0, capsys.readouterr().out
    proves = next(line for line in capsys.readouterr().out.splitlines() if "proves" in line)
    assert "admits_latest" in proves and "keeps_newest_n" in proves


def test_the_trial_uses_the_shipped_machines_unchanged() -> None:
    for name in ("queue_gate.yaml", "request.yaml"):
        shipped = (ROOT / "machines" / name).read_text(encoding="utf-8")
        for example in ("monorepo_trial", "serial_every_head"):
            assert (EXAMPLES / example / "machines" / name).read_text(encoding="utf-8") == shipped


def test_the_paused_release_queue_is_at_rest_in_check(capsys: pytest.CaptureFixture[str]) -> None:
    example = EXAMPLE_LIST[1]
    args = ["--queue", "monorepo/release-1", "--no-rewrite", *SMALL]
    assert main(["check", *example.policy(), *args]) == 0, capsys.readouterr().out


def test_cancel_in_progress_proves_its_preempt_invariant(
    capsys: pytest.CaptureFixture[str],
) -> None:
    example = next(e for e in EXAMPLE_LIST if e.name == "cancel_in_progress")
    assert main(["check", *example.policy(), *SMALL]) == 0, capsys.readouterr().out
    proves = next(line for line in capsys.readouterr().out.splitlines() if "proves" in line)
    assert "preempts_only_older" in proves

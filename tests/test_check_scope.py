"""Invariants scoped to queues: an ``invariants:`` entry may name the queues (names and
``*`` patterns) it is proved for, and ``check --queue Q`` explores Q with its own
configured ``max_concurrent`` and the invariants declared for it.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from check_mutants.mutants import write_mutant

from stovepipe_fsm.apps.check.invariants import Proof, in_scope
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.config.loader import load_queue_config
from stovepipe_fsm.machine.invariants import INVARIANTS
from stovepipe_fsm.machine.loader import load_machine
from stovepipe_fsm.process.catalog import load_process_machines

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "machines"
FAST = ["--heads", "2", "--no-rewrite", "--max-dead-letters", "0", "--max-outages", "0"]
FAST += ["--no-pauses", "--jobs", "1", "--quiet"]
RESULT = re.compile(r"^  (?:(\S+) )?max_concurrent=(\d+): (\S+)", re.M)


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def scoped(directory: Path, scopes: dict[str, list[str]], *, mutant: str | None = None) -> Path:
    """The shipped machines (or ``mutant``) with each invariant of ``scopes`` declared
    for those queues only."""
    if mutant:
        write_mutant(mutant, directory)
    else:
        shutil.copytree(SHIPPED, directory)
    for filename in ("request.yaml", "queue_gate.yaml"):
        path = directory / filename
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        doc["invariants"] = [_scope(entry, scopes) for entry in doc["invariants"]]
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return directory


def _scope(entry: str | dict[str, Any], scopes: dict[str, list[str]]) -> str | dict[str, Any]:
    name = entry if isinstance(entry, str) else entry["name"]
    if name not in scopes:
        return entry
    return {**({"name": name} if isinstance(entry, str) else entry), "queues": scopes[name]}


def run_check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["check", *args])
    return code, capsys.readouterr().out


# --- declaring a scope ----------------------------------------------------------------


def test_an_entry_names_its_queues_where_they_are_written(tmp_path: Path) -> None:
    machines = scoped(tmp_path / "m", {"admits_latest": ["mono/main", "team/*"]})
    spec = load_machine(machines / "queue_gate.yaml")
    (ref,) = [r for r in spec.invariants if r.name == "admits_latest"]
    assert ref.queue_patterns == ("mono/main", "team/*")
    assert ref.parameters == ()
    text = (machines / "queue_gate.yaml").read_text(encoding="utf-8").splitlines()
    assert "team/*" in text[ref.queues[1].location.line - 1]
    assert in_scope(ref, "mono/main") and in_scope(ref, "team/a/b")
    assert not in_scope(ref, "mono/release-1")


def test_queues_is_no_invariant_parameter() -> None:
    catalog = INVARIANTS.copy()
    with pytest.raises(ValueError, match="bad parameter name 'queues'"):
        catalog.state("scoped", parameters={"queues": {"type": "array"}})(lambda *_: iter(()))


def test_a_queue_proves_what_is_declared_for_it(tmp_path: Path) -> None:
    machines = load_process_machines(
        scoped(
            tmp_path / "m",
            {"admits_latest": ["mono/main"], "keeps_newest_n": ["mono/*"], "progress": ["x/*"]},
        )
    )
    main_proof = Proof.declared_by(machines, queue="mono/main")
    assert {"admits_latest", "keeps_newest_n"} <= set(main_proof.names)
    assert main_proof.out_of_scope == ("progress",) and not main_proof.progress
    release = Proof.declared_by(machines, queue="mono/release-1")
    assert release.out_of_scope == ("admits_latest", "progress")
    assert "keeps_newest_n" in release.names
    assert "admits_latest" not in {i.name for i in release.edge}
    everything = Proof.declared_by(machines)
    assert everything.out_of_scope == () and everything.progress


# --- check, queue by queue ------------------------------------------------------------


def test_check_holds_each_queue_to_its_own_invariants(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Building every head breaks admits_latest where it is declared, and only there."""
    machines = scoped(tmp_path / "m", {"admits_latest": ["monorepo/*"]}, mutant="no_coalesce")
    out_file = tmp_path / "cx.yaml"
    where = ["--machines", str(machines), "--out", str(out_file)]
    code, out = run_check(capsys, *where, "--queue", "release/one", *FAST)
    assert code == 0, out
    assert "proves for release/one: " in out
    assert "(not declared for release/one: admits_latest)" in out
    assert not out_file.exists()
    code, out = run_check(capsys, *where, "--queue", "monorepo/main", *FAST)
    assert code == 1
    assert "invariant admits_latest:" in out


def test_check_queue_takes_its_max_concurrent_from_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "queues.yaml"
    config.write_text(
        "queues:\n  monorepo/main: {max_concurrent: 2}\n  'release/*': {max_concurrent: 1}\n",
        encoding="utf-8",
    )
    code, out = run_check(capsys, "--config", str(config), "--queue", "monorepo/main", *FAST)
    assert code == 0, out
    assert re.search(r"^check: queue monorepo/main, .*; max_concurrent 2$", out, re.M)
    assert [m[1:] for m in RESULT.findall(out)] == [("2", "ok")]
    # Several queues: each with its own value, each result line naming its queue.
    code, out = run_check(
        capsys, "--config", str(config), "--queue", "monorepo/main", "release/one", *FAST
    )
    assert code == 0, out
    assert RESULT.findall(out) == [("monorepo/main", "2", "ok"), ("release/one", "1", "ok")]
    # --max-concurrent still says which values to explore, whatever the config.
    code, out = run_check(
        capsys, "--config", str(config), "--queue", "release/one", "--max-concurrent", "2", *FAST
    )
    assert code == 0, out
    assert [m[1:] for m in RESULT.findall(out)] == [("2", "ok")]
    # Without --queue: the default queue at 1 and 2, as always.
    code, out = run_check(capsys, "--config", str(config), *FAST)
    assert [m[1:] for m in RESULT.findall(out)] == [("1", "ok"), ("2", "ok")]


# --- scopes in the config -------------------------------------------------------------


def test_the_config_scopes_what_the_machines_declare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The machines declare admits_latest for every queue; the config narrows it, so a
    policy of shipped machines and config alone scopes it per queue."""
    machines = scoped(tmp_path / "m", {}, mutant="no_coalesce")
    config = tmp_path / "queues.yaml"
    config.write_text("invariants:\n  admits_latest: ['monorepo/*']\n", encoding="utf-8")
    policy = load_queue_config(config)
    (scope,) = policy.invariant_scopes
    assert (scope.name, scope.queues) == ("admits_latest", ("monorepo/*",))
    assert scope.location is not None and scope.location.line == 2
    where = ["--machines", str(machines), "--config", str(config), "--out", str(tmp_path / "cx")]
    code, out = run_check(capsys, *where, "--queue", "release/one", *FAST)
    assert code == 0, out
    assert "(not declared for release/one: admits_latest)" in out
    code, out = run_check(capsys, *where, "--queue", "monorepo/main", *FAST)
    assert code == 1
    assert "invariant admits_latest:" in out
    # The config's list replaces the machine entry's.
    machines = scoped(tmp_path / "m2", {"admits_latest": ["release/*"]}, mutant="no_coalesce")
    where[1] = str(machines)
    code, out = run_check(capsys, *where, "--queue", "release/one", *FAST)
    assert code == 0, out


def test_a_config_scope_of_an_undeclared_invariant_is_a_located_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "queues.yaml"
    config.write_text("invariants:\n  admits_latst: [monorepo/main]\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["check", "--config", str(config), *FAST]) == 2
    err = capsys.readouterr().err
    assert f"{config}:2:3: invariants: 'admits_latst' is not declared by the machines" in err
    config.write_text("invariants:\n  admits_latest: [' main']\n", encoding="utf-8")
    assert main(["check", "--config", str(config), *FAST]) == 2
    err = capsys.readouterr().err
    assert f"{config}:2:19: invariants: admits_latest: invalid queue name ' main'" in err


def test_a_pattern_is_no_queue_to_check(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["check", "--queue", "release/*", *FAST])
    assert exited.value.code == 2
    assert "name one queue the pattern matches" in capsys.readouterr().err

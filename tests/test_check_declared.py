"""``check`` proves what the policy declares, and only that.

Each policy here is a copy of the shipped machines under ``tmp_path`` (optionally with a
mutation of ``check_mutants``) whose ``invariants:`` blocks are edited as YAML data: a
policy without coalescing passes when it does not claim ``admits_latest`` and fails
with a replayable counterexample when it does; a policy without the gate fails as long
as it declares ``max_concurrent``. The catalogue (machine layer) and the checker's
functions are held together, and an invariant a plugin registers is checked like a
built-in one.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from check_mutants.mutants import write_mutant

from stovepipe_fsm.apps.check.explorer import Explorer, Setup
from stovepipe_fsm.apps.check.invariants import (
    ALL_INVARIANTS,
    CATALOGUE_CHECKS,
    EDGE_INVARIANTS,
    STATE_INVARIANTS,
    Proof,
    Rules,
)
from stovepipe_fsm.apps.check.model import Bounds
from stovepipe_fsm.apps.check.observe import Observation
from stovepipe_fsm.apps.check.trace import as_timeline, replay
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.machine.invariants import BUILT_IN, INVARIANTS, InvariantCatalog
from stovepipe_fsm.machine.lint import lint_machine
from stovepipe_fsm.machine.loader import load_machine
from stovepipe_fsm.process.catalog import REGISTRIES, load_process_machines
from stovepipe_fsm.simulation.timeline import load_timeline

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "machines"
CONFIG = str(ROOT / "config" / "queues.yaml")
SMALL = ["--heads", "2", "--max-concurrent", "1", "--jobs", "1", "--quiet"]
# The order the shipped files declare their invariants in: request.yaml, then queue_gate.yaml.
SHIPPED_ORDER = (
    "slot_bookkeeping, strategy_immutable, last_green_forward, dead_letter_failed_closed, "
    "persist_before_publish, one_event_per_admission, admits_latest, keeps_newest_n, "
    "newest_not_superseded, superseded_never_started, max_concurrent, strategy_sound, "
    "base_is_green_ancestor, rewrite_runs_alone, baseline_lag_bounded, lease_bounds_stall, progress"
)


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def policy(
    directory: Path,
    *,
    mutant: str | None = None,
    drop: Iterable[str] = (),
    add: Iterable[Any] = (),
) -> Path:
    """A copy of the shipped machines (with ``mutant`` applied) in ``directory``, without
    the invariants named in ``drop`` and with ``add`` appended to queue_gate.yaml's."""
    if mutant:
        write_mutant(mutant, directory)
    else:
        shutil.copytree(SHIPPED, directory)
    dropped = set(drop)
    for filename in ("request.yaml", "queue_gate.yaml"):
        path = directory / filename
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        doc["invariants"] = [e for e in doc["invariants"] if _name(e) not in dropped]
        if filename == "queue_gate.yaml":
            doc["invariants"] += list(add)
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return directory


def _name(entry: str | dict[str, Any]) -> str:
    return entry["name"] if isinstance(entry, dict) else entry


def run_check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["check", *args])
    return code, capsys.readouterr().out


def proves_line(out: str) -> str:
    (line,) = [ln for ln in out.splitlines() if ln.startswith("proves: ")]
    return line.removeprefix("proves: ")


# --- the catalogue and the checker agree ----------------------------------------------


def test_every_built_in_name_is_checked_and_every_check_belongs_to_one_name() -> None:
    built_in = {info.name for info in INVARIANTS if info.scope == BUILT_IN}
    assert built_in == set(CATALOGUE_CHECKS)
    grouped = [check for checks in CATALOGUE_CHECKS.values() for check in checks]
    assert sorted(grouped) == sorted(i.name for i in ALL_INVARIANTS)


def test_the_shipped_policy_proves_every_check_in_the_usual_order() -> None:
    """What check proved before policies declared anything: every check, in this order,
    but that of the optional preempt role, which the shipped policy does not declare."""
    proof = Proof.declared_by(load_process_machines(SHIPPED))
    assert ", ".join(proof.names) == SHIPPED_ORDER
    assert proof.state == STATE_INVARIANTS
    assert proof.edge == tuple(i for i in EDGE_INVARIANTS if i.name != "preempts_only_older")
    assert proof.progress


def test_check_prints_what_it_proves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_check(capsys, "--heads", "1", "--no-rewrite", *SMALL)
    assert code == 0
    assert proves_line(out) == SHIPPED_ORDER
    lean = policy(tmp_path / "lean", drop=("admits_latest", "progress", "slot_bookkeeping"))
    code, out = run_check(capsys, "--machines", str(lean), "--heads", "1", *SMALL)
    assert code == 0
    assert proves_line(out) == (
        "strategy_immutable, last_green_forward, dead_letter_failed_closed, "
        "persist_before_publish, one_event_per_admission, keeps_newest_n, "
        "newest_not_superseded, superseded_never_started, max_concurrent, strategy_sound, "
        "base_is_green_ancestor, rewrite_runs_alone, baseline_lag_bounded, lease_bounds_stall"
    )


def test_a_policy_that_declares_nothing_proves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No gate at all, and nothing claimed about it: every step applies, so check passes,
    # and says it proved nothing.
    machines = policy(tmp_path / "m", mutant="no_gate", drop=INVARIANTS.names())
    code, out = run_check(capsys, "--machines", str(machines), *SMALL)
    assert code == 0, out
    assert proves_line(out).startswith("nothing - the machines declare no invariants")


# --- a policy without coalescing ------------------------------------------------------


def test_no_coalescing_without_admits_latest_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machines = policy(tmp_path / "every_head", mutant="no_coalesce", drop=["admits_latest"])
    out_file = tmp_path / "cx.yaml"
    code, out = run_check(
        capsys,
        *("--machines", str(machines), "--out", str(out_file)),
        *("--heads", "2", "--no-rewrite", "--max-concurrent", "1", "2", "--jobs", "1", "--quiet"),
    )
    assert code == 0, out
    assert "admits_latest" not in proves_line(out)
    assert "max_concurrent=2: ok" in out
    assert not out_file.exists()


def test_no_coalescing_declaring_admits_latest_fails_with_a_replayable_counterexample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = policy(tmp_path / "claims", mutant="no_coalesce")
    out_file = tmp_path / "cx.yaml"
    code, out = run_check(capsys, "--machines", str(claims), "--out", str(out_file), *SMALL)
    assert code == 1
    assert "invariant admits_latest:" in out
    assert f"replay: stovepipe-fsm simulate {out_file} --machines {claims}" in out

    timeline = load_timeline(out_file)
    store = load_policy_store(CONFIG)
    replayed = replay(timeline, load_process_machines(claims), store)
    assert replayed.violation is not None
    assert replayed.violation.invariant == "admits_latest"
    assert replayed.step == len(timeline.steps)
    code, out = run_check(capsys, "--replay", str(out_file), "--machines", str(claims))
    assert code == 1
    assert "invariant admits_latest is broken" in out
    # The same behaviour is no finding for the copy that does not claim admits_latest.
    honest = policy(tmp_path / "honest", mutant="no_coalesce", drop=["admits_latest"])
    assert replay(timeline, load_process_machines(honest), store).violation is None
    code, out = run_check(capsys, "--replay", str(out_file), "--machines", str(honest))
    assert code == 0, out
    assert "every invariant holds and the work can finish" in out


# --- a policy without the gate --------------------------------------------------------


def test_no_gate_declaring_max_concurrent_fails_with_a_replayable_counterexample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machines = policy(tmp_path / "no_gate", mutant="no_gate")
    out_file = tmp_path / "cx.yaml"
    code, out = run_check(capsys, "--machines", str(machines), "--out", str(out_file), *SMALL)
    assert code == 1
    assert "max_concurrent" in proves_line(out)
    assert "invariant max_concurrent: never more than max_concurrent unexpired slots held" in out
    timeline = load_timeline(out_file)
    steps = [s.describe() for s in timeline.steps]
    assert steps == ["ingest A1", "deliver", "ingest A2", "deliver"]
    replayed = replay(timeline, load_process_machines(machines), load_policy_store(CONFIG))
    assert replayed.violation is not None
    assert replayed.violation.invariant == "max_concurrent"
    assert replayed.world.queues.snapshot()[0].in_flight_count == 2
    capsys.readouterr()
    assert main(["simulate", str(out_file), "--machines", str(machines)]) == 0
    assert "monorepo/main: in_flight=2" in capsys.readouterr().out

    # It is the declaration that fails it: without max_concurrent the same policy passes.
    unbounded = policy(tmp_path / "unbounded", mutant="no_gate", drop=["max_concurrent"])
    code, out = run_check(capsys, "--machines", str(unbounded), *SMALL)
    assert code == 0, out


# --- progress -------------------------------------------------------------------------


def test_progress_is_only_decided_when_declared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bare counter wedges a queue after a crash; the wedge is a progress finding
    only for a policy that declares progress."""
    wedge = ["--bare-counter", "--max-dead-letters", "0", *SMALL]
    out_file = tmp_path / "wedge.yaml"
    code, out = run_check(capsys, *wedge, "--out", str(out_file))
    assert code == 1
    assert "invariant progress:" in out
    relaxed = policy(tmp_path / "relaxed", drop=["progress"])
    code, out = run_check(capsys, "--machines", str(relaxed), *wedge)
    assert code == 0, out
    code, out = run_check(
        capsys, "--replay", str(out_file), "--machines", str(relaxed), "--bare-counter"
    )
    assert code == 0
    assert out.splitlines()[-1] == f"{out_file}: every invariant holds"


# --- names the catalogue does not have ------------------------------------------------


def test_an_unknown_name_loaded_without_lint_is_still_a_located_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machines = policy(tmp_path / "m", add=["admit_latest"])
    capsys.readouterr()
    assert main(["check", "--machines", str(machines), "--no-lint", *SMALL]) == 2
    err = capsys.readouterr().err
    assert f"{machines / 'queue_gate.yaml'}:" in err
    assert "no invariant named 'admit_latest' in the catalogue; invariants: admits_latest," in err


# --- an invariant a plugin registers --------------------------------------------------


def plugin_catalog() -> InvariantCatalog:
    """The shipped catalogue plus two invariants, as a plugin module would register them."""
    catalog = INVARIANTS.copy()

    @catalog.state(parameters={"limit": {"type": "integer", "minimum": 0}})
    def few_full_builds(obs: Observation, rules: Rules, params: dict[str, Any]) -> Iterator[str]:
        """At most ``limit`` requests are built in full."""
        full = sorted(r.id for r in obs.requests if r.build_strategy == "full")
        if len(full) > params["limit"]:
            yield f"{len(full)} full builds: {full}, limit {params['limit']}"

    @catalog.transition()
    def green_stays_put(
        pre: Observation, post: Observation, rules: Rules, params: dict[str, Any]
    ) -> Iterator[str]:
        """Last green never moves (a property no real policy has: it must fail)."""
        for before, after in zip(pre.queues, post.queues, strict=False):
            if before.last_green_uri != after.last_green_uri:
                yield f"last green moved from {before.last_green_uri or '-'}"

    return catalog


def explore(machines_dir: Path, catalog: InvariantCatalog, **bounds: Any) -> Any:
    machines = load_process_machines(machines_dir, lint=False)
    for spec in (machines.request.spec, machines.queue_gate.spec):
        assert lint_machine(spec, REGISTRIES, invariants=catalog) == []
    store = load_policy_store(CONFIG)
    setup = Setup(machines, store, Bounds(**bounds), 1, catalog=catalog)
    return setup, Explorer(setup).run()


def test_a_registered_state_invariant_is_checked_with_its_parameters(tmp_path: Path) -> None:
    catalog = plugin_catalog()
    strict = policy(tmp_path / "strict", add=[{"name": "few_full_builds", "limit": 0}])
    # The shipped catalogue does not know the name: lint needs the plugin's registration.
    gate = load_machine(strict / "queue_gate.yaml", lint=False)
    assert [i.rule for i in lint_machine(gate, REGISTRIES)] == ["unknown-invariant"]
    setup, result = explore(strict, catalog, heads=1, rewrite=False)
    assert result.counterexample is not None
    violation = result.counterexample.violation
    assert violation.invariant == "few_full_builds"
    assert violation.summary == "At most ``limit`` requests are built in full."
    assert violation.detail == "1 full builds: ['request/monorepo/main/1'], limit 0"
    timeline_steps = [a.describe() for a in result.counterexample.trace]
    assert timeline_steps == ["ingest A1", "deliver"]
    # The counterexample replays with the same catalogue.
    replayed = replay(
        as_timeline(setup, result.counterexample), setup.machines, setup.config, catalog=catalog
    )
    assert replayed.violation is not None and replayed.violation.invariant == "few_full_builds"

    generous = policy(tmp_path / "generous", add=[{"name": "few_full_builds", "limit": 5}])
    _, result = explore(generous, catalog, heads=1, rewrite=False)
    assert result.ok


def test_a_registered_transition_invariant_is_checked_on_every_step(tmp_path: Path) -> None:
    machines = policy(tmp_path / "m", add=["green_stays_put"])
    _, result = explore(machines, plugin_catalog(), heads=1, rewrite=False)
    assert result.counterexample is not None
    assert result.counterexample.violation.invariant == "green_stays_put"
    assert [a.describe() for a in result.counterexample.trace] == [
        "ingest A1",
        "deliver",
        "complete A1 succeeded",
    ]


FULL_LIMITS = '''
from stovepipe_fsm.plugin import PluginRegistry


def register(plugin: PluginRegistry) -> None:
    @plugin.invariants.state(
        parameters={"limit": {"type": "integer", "minimum": 0, "default": 0}}
    )
    def few_full_builds(obs, rules, params):
        """At most `limit` requests are built in full."""
        full = [r.id for r in obs.requests if r.build_strategy == "full"]
        if len(full) > params["limit"]:
            yield f"{len(full)} full builds: {full}"
'''


def test_check_proves_an_invariant_the_policys_plugin_registers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machines = policy(tmp_path / "policy" / "machines", add=[{"name": "few_full_builds"}])
    (tmp_path / "policy" / "full_limits.py").write_text(FULL_LIMITS, encoding="utf-8")
    gate = machines / "queue_gate.yaml"
    doc = yaml.safe_load(gate.read_text(encoding="utf-8"))
    doc["plugins"] = [*doc.get("plugins", []), "full_limits"]
    gate.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    out_file = tmp_path / "cx.yaml"
    args = ["--machines", str(machines), "--out", str(out_file), "--heads", "1", *SMALL[2:]]
    code, out = run_check(capsys, *args)
    assert code == 1, out
    assert "few_full_builds" in out.splitlines()[1]  # what it proves
    assert "1 full builds: ['request/monorepo/main/1']" in out
    assert out_file.exists()

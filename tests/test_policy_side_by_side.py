"""Two policies, or two versions of one, loaded side by side in one process.

What a plugin registers (conditions, actions, invariants) belongs to the policy that
loaded it, and a plugin module in a policy directory is imported afresh for every load.
The policies here are copies of ``examples/policies/embargo_plugin`` whose plugin also
registers an invariant that the gate declares; the commands that compare or reload
policies (``validate A B``, ``whatif``, loading a directory again after an edit) run on
them as a user would.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.apps.service.policy import PolicyReloader
from stovepipe_fsm.machine.invariants import INVARIANTS
from stovepipe_fsm.process.catalog import load_policy, load_process_machines

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "policies" / "embargo_plugin"
RULES = "embargo_rules.py"
GATE = Path("machines") / "queue_gate.yaml"

INVARIANT = '''
    @plugin.invariants.state()
    def embargo_respected(obs, rules, params):  # type: ignore[no-untyped-def]
        """{summary}"""
        yield from ()

    @gate.action('''


def policy_copy(tmp_path: Path, name: str, summary: str) -> Path:
    """The example with an invariant registered by its plugin and declared by its gate."""
    target = tmp_path / name
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns("__pycache__"))
    rules = target / RULES
    text = rules.read_text(encoding="utf-8")
    assert text.count("\n    @gate.action(") == 1
    rules.write_text(
        text.replace("\n    @gate.action(", INVARIANT.format(summary=summary)), encoding="utf-8"
    )
    gate = target / GATE
    text = gate.read_text(encoding="utf-8")
    assert text.count("\ninvariants:\n") == 1
    gate.write_text(
        text.replace("\ninvariants:\n", "\ninvariants:\n  - embargo_respected\n"),
        encoding="utf-8",
    )
    return target


def summary_of(policy: Path) -> str:
    info = load_process_machines(policy / "machines").invariants.get("embargo_respected")
    assert info is not None and info.check is not None
    return info.summary


@pytest.fixture
def two_versions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Versions ``a`` and ``b`` of the policy in the working directory, nothing captured."""
    policy_copy(tmp_path, "a", "Version a.")
    policy_copy(tmp_path, "b", "Version b.")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()


@pytest.mark.usefixtures("two_versions")
def test_validate_of_two_versions_of_a_plugin_policy_passes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        ["validate", "a/machines", "a/config/queues.yaml", "b/machines", "b/config/queues.yaml"]
    )
    out, err = capsys.readouterr()
    assert (code, out) == (0, "")
    assert "validated 6 file(s): ok" in err


@pytest.mark.usefixtures("two_versions")
def test_whatif_between_two_versions_of_a_plugin_policy_runs_both(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "whatif", "a/timelines/embargo.yaml",
            "--machines", "a/machines", "--config", "a/config/queues.yaml",
            "--vs-machines", "b/machines", "--vs-config", "b/config/queues.yaml",
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "requests whose final outcome differs: none" in out


def test_each_policy_has_its_own_invariants_and_the_shipped_catalogue_none_of_them(
    tmp_path: Path,
) -> None:
    a = policy_copy(tmp_path, "a", "Version a.")
    b = policy_copy(tmp_path, "b", "Version b.")
    assert [summary_of(p) for p in (a, b, a)] == ["Version a.", "Version b.", "Version a."]
    assert "embargo_respected" not in INVARIANTS
    first, again = (load_policy(a / "machines").invariants for _ in range(2))
    one, other = first.get("embargo_respected"), again.get("embargo_respected")
    assert one is not None and other is not None
    assert one.check is not other.check  # every load runs the module afresh


def test_a_directory_loaded_again_after_an_edit_runs_the_new_plugin_code(tmp_path: Path) -> None:
    # Same length, same second: nothing cached from the first load may stand in for it.
    policy = policy_copy(tmp_path, "a", "Version 1.")
    assert summary_of(policy) == "Version 1."
    rules = policy / RULES
    rules.write_text(
        rules.read_text(encoding="utf-8").replace("Version 1.", "Version 2."), encoding="utf-8"
    )
    assert summary_of(policy) == "Version 2."
    assert not (policy / "__pycache__").exists()  # nothing written into the policy


def test_registering_on_the_shipped_catalogue_is_one_located_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = policy_copy(tmp_path, "a", "Version a.")
    rules = policy / RULES
    rules.write_text(
        rules.read_text(encoding="utf-8")
        + "\n\nfrom stovepipe_fsm.machine.invariants import INVARIANTS\n\n\n"
        "@INVARIANTS.state()\ndef at_import(obs, rules, params):  # type: ignore\n"
        "    yield from ()\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(policy)
    capsys.readouterr()
    assert main(["validate", "machines"]) == 1
    line = 1 + (policy / GATE).read_text(encoding="utf-8").splitlines().index("  - embargo_rules")
    # One line: the names the plugin would have registered are not reported as unknown.
    assert capsys.readouterr().out.splitlines() == [
        f"{GATE}:{line}:5: plugin 'embargo_rules' cannot be imported: RegistrationRefused: "
        "invariant 'at_import': the shipped invariant catalogue is read-only; a plugin "
        "registers an invariant in register(plugin) with plugin.invariants.state() or "
        "plugin.invariants.transition()"
    ]


def test_a_plugin_invariant_named_as_a_shipped_one_is_a_duplicate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = policy_copy(tmp_path, "a", "Version a.")
    rules = policy / RULES
    text = rules.read_text(encoding="utf-8")
    rules.write_text(
        text.replace("@plugin.invariants.state()", '@plugin.invariants.state(name="progress")'),
        encoding="utf-8",
    )
    monkeypatch.chdir(policy)
    capsys.readouterr()
    assert main(["validate", "machines"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(
        "plugin 'embargo_rules' registers invariant 'progress', which the policy's invariant "
        "catalogue already has; choose another name"
    )
    assert all("embargo_respected" in line for line in out[1:])  # declared, not registered


def test_the_service_reloader_takes_up_an_edit_of_a_plugin_module_alone(tmp_path: Path) -> None:
    policy = policy_copy(tmp_path, "a", "Version 1.")
    reloader = PolicyReloader.open(policy / "machines", policy / "config" / "queues.yaml")
    before = reloader.hash
    assert reloader.check() is None  # nothing edited
    rules = policy / RULES
    rules.write_text(
        rules.read_text(encoding="utf-8").replace("Version 1.", "Version 2."), encoding="utf-8"
    )
    change = reloader.check()
    assert change is not None and change.machines is not None
    info = change.machines.invariants.get("embargo_respected")
    assert info is not None and info.summary == "Version 2."
    assert change.hash != before and reloader.last_error is None
    assert reloader.check() is None  # taken up once

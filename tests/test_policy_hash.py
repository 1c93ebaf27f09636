"""The policy hash: stable for one policy wherever it lives, different for any edit of a
machine file, of a listed plugin's source as imported, or of the config."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from fixture_policy import FIXTURES, GATE_YAML, REQUEST_YAML, copy_policy

from stovepipe_fsm.apps.service.operators import render_status
from stovepipe_fsm.machine.loader import LoadedPolicy
from stovepipe_fsm.machine.policy_hash import HASH_DIGITS, policy_hash
from stovepipe_fsm.process.catalog import load_policy

FREEZE_POLICY = FIXTURES / "plugins" / "freeze_window"
CONFIG = b"defaults: {gate_wait_delay_ms: 100}\n"


def hash_of(policy: Path, config: bytes | None = CONFIG, loaded: LoadedPolicy | None = None) -> str:
    """The hash of ``policy`` as loaded now (or as ``loaded``, an earlier load of it)."""
    machines = policy / "machines"
    loaded = loaded or load_policy(machines)
    return policy_hash(
        machines, loaded.specs.values(), config, plugin_sources=loaded.plugin_sources
    )


def test_one_policy_one_hash_wherever_it_lives(tmp_path: Path) -> None:
    first = hash_of(copy_policy(tmp_path / "a"))
    assert len(first) == HASH_DIGITS and int(first, 16) >= 0
    assert hash_of(copy_policy(tmp_path / "b")) == first
    assert hash_of(copy_policy(tmp_path / "a2")) == hash_of(copy_policy(tmp_path / "b2"))


def test_any_edit_of_a_machine_file_or_the_config_changes_it(tmp_path: Path) -> None:
    policy = copy_policy(tmp_path / "p")
    before = hash_of(policy)
    assert hash_of(policy, CONFIG + b"# a comment\n") != before
    assert hash_of(policy, None) != before
    for name in (REQUEST_YAML.name, GATE_YAML.name):
        path = policy / "machines" / name
        original = path.read_bytes()
        path.write_bytes(original + b"# a comment\n")
        assert hash_of(policy) != before, name
        path.write_bytes(original)
    assert hash_of(policy) == before


def test_a_listed_plugin_counts_with_its_source_as_imported(tmp_path: Path) -> None:
    module = "freeze_rules"
    first, second = tmp_path / "a", tmp_path / "b"
    shutil.copytree(FREEZE_POLICY, first)
    shutil.copytree(FREEZE_POLICY, second)
    source = second / f"{module}.py"
    source.write_text(source.read_text() + "# another version of the plugin\n")
    in_first = hash_of(first)
    loaded = load_policy(second / "machines")
    in_second = hash_of(second, loaded=loaded)
    assert in_second != in_first  # only the plugin's source differs
    # An edit after the import is not code in force (that load runs what it imported):
    # same hash for that load; the next load imports the edit, and its hash says so.
    source.write_text(source.read_text() + "# edited after the import\n")
    assert hash_of(second, loaded=loaded) == in_second
    assert hash_of(second) not in (in_first, in_second)
    assert module not in sys.modules  # the policy's own copy, not the process's


def test_status_shows_the_policy_line_first() -> None:
    doc = {
        "requests": [],
        "queues": [],
        "slot_holders": {},
        "policy": {"hash": "0123456789abcdef", "loaded_at_ms": 0, "replica": "host:7"},
    }
    lines = render_status(doc).splitlines()
    assert lines[0] == "policy: 0123456789abcdef (loaded 1970-01-01T00:00:00Z by host:7)"
    assert lines[1] == "queues:"
    del doc["policy"]
    assert render_status(doc).splitlines()[0] == "queues:"

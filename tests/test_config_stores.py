"""ConfigStore adapters: the hot-reloading file store and the static in-memory store."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from stovepipe_fsm.adapters.file import FileConfigStore
from stovepipe_fsm.adapters.memory.clock import ManualClock
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.config.loader import load_queue_config
from stovepipe_fsm.domain.entities import QueueConfig
from stovepipe_fsm.domain.queue_names import InvalidQueueName
from stovepipe_fsm.located.errors import SpecError
from stovepipe_fsm.machine.parameters import defaults_of
from stovepipe_fsm.ports import ConfigStore
from stovepipe_fsm.process.catalog import load_process_machines

DECLARED = load_process_machines(Path(__file__).resolve().parents[1] / "machines").parameters


def shipped(**values: Any) -> QueueConfig:
    """A queue's config under the shipped declarations: what ``values`` leaves unset
    takes its declared default, as every resolved config does."""
    return QueueConfig.of(**{**defaults_of(DECLARED), **values})

GOOD = "defaults: {max_concurrent: 2}\nqueues:\n  mono/main: {max_concurrent: 3}\n"
EDITED = "defaults: {max_concurrent: 4}\nqueues:\n  mono/main: {max_concurrent: 5}\n"
BAD = "defaults: {max_concurrent: 0}\n"
ALSO_BAD = "defaults: {max_concurrent: true, gate_wait_delay_ms: 1}\n"


class Editor:
    """Writes the config file like an operator would, always moving mtime forward.

    Filesystems with coarse timestamps could give two quick writes the same mtime;
    stepping it explicitly keeps each test about reload logic, not timestamp ticks.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mtime_ns = 1_000_000_000_000_000_000

    def write(self, text: str) -> None:
        self.path.write_text(text, encoding="utf-8")
        self._touch()

    def replace_atomically(self, text: str) -> None:
        staging = self.path.with_suffix(".tmp")
        staging.write_text(text, encoding="utf-8")
        os.replace(staging, self.path)
        self._touch()

    def _touch(self) -> None:
        self._mtime_ns += 1_000_000_000
        os.utime(self.path, ns=(self._mtime_ns, self._mtime_ns))


@pytest.fixture
def editor(tmp_path: Path) -> Editor:
    edit = Editor(tmp_path / "queues.yaml")
    edit.write(GOOD)
    return edit


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(10_000)


@pytest.fixture
def store(editor: Editor, clock: ManualClock) -> FileConfigStore:
    return FileConfigStore(
        editor.path, clock=clock, display_name="queues.yaml", parameters=DECLARED
    )


def config_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "stovepipe_fsm.config" and r.levelno == logging.WARNING
    ]


# --- the file store ---------------------------------------------------------------


def test_file_store_is_a_config_store(store: FileConfigStore) -> None:
    port: ConfigStore = store
    assert port.get("mono/main") == shipped(max_concurrent=3, gate_wait_delay_ms=5000)
    assert port.get("other") == shipped(max_concurrent=2, gate_wait_delay_ms=5000)
    assert port.configured_queues() == ("mono/main",)
    assert store.last_error is None


def test_invalid_file_at_start_raises(tmp_path: Path) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text(BAD, encoding="utf-8")
    with pytest.raises(SpecError, match=r"queues.yaml:1:28: .*minimum of 1"):
        FileConfigStore(path, display_name="queues.yaml", parameters=DECLARED)


def test_missing_file_at_start_raises(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="file not found"):
        FileConfigStore(tmp_path / "absent.yaml", parameters=DECLARED)


def test_get_rejects_invalid_queue_names(store: FileConfigStore) -> None:
    with pytest.raises(InvalidQueueName, match="wildcard"):
        store.get("mono/*")


def test_negative_interval_is_refused(editor: Editor) -> None:
    with pytest.raises(ValueError, match="check_interval_s"):
        FileConfigStore(editor.path, check_interval_s=-1, parameters=DECLARED)


def test_edit_is_picked_up_after_the_check_interval(
    store: FileConfigStore, editor: Editor, clock: ManualClock
) -> None:
    editor.write(EDITED)
    clock.advance(999)
    assert store.get("mono/main").param("max_concurrent") == 3  # not re-checked yet
    clock.advance(1)
    assert store.get("mono/main").param("max_concurrent") == 5
    assert store.get("other").param("max_concurrent") == 4


def test_file_is_checked_at_most_once_per_interval(
    editor: Editor, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileConfigStore(editor.path, clock=clock, check_interval_s=2.5, parameters=DECLARED)
    calls: list[object] = []
    real_stat = os.stat

    def counting_stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        calls.append(path)
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", counting_stat)
    for _ in range(10):
        store.get("q")
    assert calls == []
    clock.advance(2500)
    for _ in range(10):
        store.get("q")
    assert len(calls) == 1


def test_unchanged_file_is_not_parsed_again(store: FileConfigStore, clock: ManualClock) -> None:
    before = store.policy
    clock.advance(5000)
    assert store.refresh() is False
    assert store.get("q") == shipped(max_concurrent=2, gate_wait_delay_ms=5000)
    assert store.policy is before


def test_same_size_edit_is_detected_through_mtime(store: FileConfigStore, editor: Editor) -> None:
    assert len(EDITED) == len(GOOD)
    editor.write(EDITED)
    assert store.refresh() is True
    assert store.get("mono/main").param("max_concurrent") == 5


def test_atomic_replace_is_detected(store: FileConfigStore, editor: Editor) -> None:
    editor.replace_atomically(EDITED)
    assert store.refresh() is True
    assert store.get("other").param("max_concurrent") == 4


def test_bad_edit_keeps_last_good_and_reports_once(
    store: FileConfigStore,
    editor: Editor,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="stovepipe_fsm.config")
    editor.write(BAD)
    clock.advance(1000)
    assert store.get("mono/main").param("max_concurrent") == 3
    error = store.last_error
    assert error is not None
    assert [str(i) for i in error.issues] == [
        "queues.yaml:1:28: defaults.max_concurrent: 0 is less than the minimum of 1"
    ]
    for _ in range(3):
        clock.advance(1000)
        assert store.get("other").param("max_concurrent") == 2
    [warning] = config_warnings(caplog)
    assert "queues.yaml:1:28" in warning.getMessage()
    assert "keeping the last good configuration" in warning.getMessage()

    editor.write(ALSO_BAD)  # a different bad version gets its own warning
    clock.advance(1000)
    assert store.get("mono/main").param("max_concurrent") == 3
    assert len(config_warnings(caplog)) == 2
    assert store.last_error is not None and store.last_error is not error


def test_fixed_edit_clears_the_error(
    store: FileConfigStore, editor: Editor, clock: ManualClock
) -> None:
    editor.write(BAD)
    clock.advance(1000)
    store.get("q")
    assert store.last_error is not None
    editor.write(EDITED)
    clock.advance(1000)
    assert store.get("mono/main").param("max_concurrent") == 5
    assert store.last_error is None


def test_deleted_file_keeps_last_good_until_it_returns(
    store: FileConfigStore,
    editor: Editor,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    editor.path.unlink()
    for _ in range(3):
        clock.advance(1000)
        assert store.get("mono/main").param("max_concurrent") == 3
    assert store.last_error is not None
    assert "file not found" in str(store.last_error)
    assert len(config_warnings(caplog)) == 1
    editor.write(EDITED)
    clock.advance(1000)
    assert store.get("mono/main").param("max_concurrent") == 5
    assert store.last_error is None


def test_syntax_error_edit_keeps_last_good(
    store: FileConfigStore, editor: Editor, clock: ManualClock
) -> None:
    editor.write("defaults: {max_concurrent: 2\n")
    clock.advance(1000)
    assert store.get("q").param("max_concurrent") == 2
    assert store.last_error is not None
    assert store.last_error.issues[0].rule == "syntax"


def test_clock_stepping_back_does_not_stall_reloads(
    store: FileConfigStore, editor: Editor, clock: ManualClock
) -> None:
    editor.write(EDITED)
    clock.set(0)
    assert store.get("other").param("max_concurrent") == 4


def test_default_clock_with_zero_interval_checks_every_call(editor: Editor) -> None:
    store = FileConfigStore(editor.path, check_interval_s=0, parameters=DECLARED)
    editor.write(EDITED)
    assert store.get("other").param("max_concurrent") == 4


def test_policy_matches_a_fresh_load(store: FileConfigStore, editor: Editor) -> None:
    assert store.policy == load_queue_config(
        editor.path, display_name="queues.yaml", parameters=DECLARED
    )


# --- the static store -------------------------------------------------------------


def test_static_store_defaults_to_built_ins() -> None:
    store: ConfigStore = StaticConfigStore(parameters=DECLARED)
    assert store.get("any/queue") == QueueConfig()
    assert store.configured_queues() == ()


def test_static_store_from_mapping_resolves_like_the_file(tmp_path: Path) -> None:
    content = {
        "defaults": {"max_attempts": 3},
        "queues": {"mono/main": {"max_concurrent": 2}, "mobile/*": {"gate_wait_delay_ms": 10}},
    }
    store = StaticConfigStore(content, parameters=DECLARED)
    assert store.get("mono/main") == shipped(
        max_concurrent=2, gate_wait_delay_ms=5000, max_attempts=3
    )
    assert store.get("mobile/ios") == shipped(
        max_concurrent=1, gate_wait_delay_ms=10, max_attempts=3
    )
    assert store.configured_queues() == ("mono/main",)


def test_static_store_from_policy(editor: Editor) -> None:
    policy = load_queue_config(editor.path, parameters=DECLARED)
    store = StaticConfigStore(policy, parameters=DECLARED)
    assert store.policy is policy
    assert store.get("mono/main").param("max_concurrent") == 3


def test_static_store_from_queue_config_sets_defaults() -> None:
    store = StaticConfigStore(
        QueueConfig.of(max_concurrent=4, repository="repo"), parameters=DECLARED
    )
    assert store.get("q") == shipped(
        max_concurrent=4, gate_wait_delay_ms=5000, repository="repo"
    )


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ({"defaults": {"max_concurrent": 0}}, "minimum of 1"),
        ({"defaults": {"max_concurrent": True}}, "not of type 'integer'"),
        ({"queues": {"a*": {}, "*a": {}}}, "ties with"),
        ({"queues": {"bad name": {}}}, "invalid queue name"),
        ({"colour": "blue"}, "unknown key 'colour'"),
    ],
)
def test_static_store_validates_content(content: dict[str, object], fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        StaticConfigStore(content, name="scenario", parameters=DECLARED)


def test_static_store_validates_queue_config_values() -> None:
    with pytest.raises(SpecError, match=r"defaults\.max_concurrent"):
        StaticConfigStore(QueueConfig.of(max_concurrent=0), parameters=DECLARED)


def test_static_store_rejects_invalid_queue_names() -> None:
    with pytest.raises(InvalidQueueName):
        StaticConfigStore(parameters=DECLARED).get("")

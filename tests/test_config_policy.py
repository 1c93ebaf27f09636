"""Resolution precedence and tie detection of the per-queue policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stovepipe_fsm.config.loader import load_queue_config
from stovepipe_fsm.config.policy import PolicyEntry, QueuePolicy, Settings
from stovepipe_fsm.domain.entities import QueueConfig
from stovepipe_fsm.domain.queue_names import InvalidQueueName
from stovepipe_fsm.located.errors import Location, SpecError, SpecIssue
from stovepipe_fsm.machine.parameters import defaults_of
from stovepipe_fsm.process.catalog import load_process_machines

DECLARED = load_process_machines(Path(__file__).resolve().parents[1] / "machines").parameters


def shipped(**values: Any) -> QueueConfig:
    """A queue's config under the shipped declarations: what ``values`` leaves unset
    takes its declared default, as every resolved config does."""
    return QueueConfig.of(**{**defaults_of(DECLARED), **values})

LAYERED = """\
defaults:
  max_concurrent: 2
  max_attempts: 7
queues:
  "*": {gate_wait_delay_ms: 100}
  "mobile/*": {gate_wait_delay_ms: 200, max_concurrent: 3}
  "mobile/ios/*": {gate_wait_delay_ms: 300}
  mobile/ios/main: {max_attempts: 9}
"""


@pytest.fixture
def layered(tmp_path: Path) -> QueuePolicy:
    path = tmp_path / "queues.yaml"
    path.write_text(LAYERED, encoding="utf-8")
    return load_queue_config(path, parameters=DECLARED)


def load_text(tmp_path: Path, text: str) -> QueuePolicy:
    path = tmp_path / "queues.yaml"
    path.write_text(text, encoding="utf-8")
    return load_queue_config(path, display_name="queues.yaml", parameters=DECLARED)


def tie_issues_of(tmp_path: Path, text: str) -> list[SpecIssue]:
    with pytest.raises(SpecError) as caught:
        load_text(tmp_path, text)
    return [i for i in caught.value.issues if i.rule == "tie"]


# --- precedence -------------------------------------------------------------------


def test_built_in_defaults_without_any_override(tmp_path: Path) -> None:
    policy = load_text(tmp_path, "queues: {}\n")
    assert policy.resolve("any/queue") == shipped(
        max_concurrent=1, gate_wait_delay_ms=5000, max_attempts=5
    )


def test_defaults_block_overrides_built_ins_field_by_field(tmp_path: Path) -> None:
    policy = load_text(tmp_path, "defaults: {gate_wait_delay_ms: 250}\n")
    assert policy.resolve("q") == shipped(max_concurrent=1, gate_wait_delay_ms=250)


def test_general_pattern_beats_defaults(layered: QueuePolicy) -> None:
    assert layered.resolve("web/main") == shipped(
        max_concurrent=2, gate_wait_delay_ms=100, max_attempts=7
    )


def test_specific_pattern_beats_general_pattern(layered: QueuePolicy) -> None:
    assert layered.resolve("mobile/android") == shipped(
        max_concurrent=3, gate_wait_delay_ms=200, max_attempts=7
    )


def test_more_specific_pattern_wins_and_entries_do_not_stack(layered: QueuePolicy) -> None:
    # 'mobile/*' also matches, but only the winner's fields apply: max_concurrent comes
    # from defaults, not from the less specific pattern.
    assert layered.resolve("mobile/ios/beta") == shipped(
        max_concurrent=2, gate_wait_delay_ms=300, max_attempts=7
    )


def test_exact_name_beats_every_pattern(layered: QueuePolicy) -> None:
    assert layered.resolve("mobile/ios/main") == shipped(
        max_concurrent=2, gate_wait_delay_ms=5000, max_attempts=9
    )


def test_exact_name_beats_a_pattern_with_as_many_literal_characters(tmp_path: Path) -> None:
    policy = load_text(
        tmp_path, 'queues:\n  "ab*": {max_concurrent: 5}\n  ab: {max_concurrent: 4}\n'
    )
    assert policy.resolve("ab").param("max_concurrent") == 4
    assert policy.resolve("abc").param("max_concurrent") == 5


def test_winning_entry_names_the_key_and_its_location(layered: QueuePolicy) -> None:
    entry = layered.winning_entry("mobile/ios/beta")
    assert entry is not None and entry.key == "mobile/ios/*"
    assert entry.location is not None and (entry.location.line, entry.location.column) == (7, 3)
    fallback = layered.winning_entry("mobile")
    assert fallback is not None and fallback.key == "*"


def test_winning_entry_is_none_when_only_defaults_apply(tmp_path: Path) -> None:
    policy = load_text(tmp_path, 'queues:\n  "mobile/*": {}\n')
    assert policy.winning_entry("web/main") is None


def test_configured_queues_lists_exact_names_in_file_order(tmp_path: Path) -> None:
    policy = load_text(tmp_path, 'queues:\n  z/q: {}\n  "p/*": {}\n  a/q: {}\n')
    assert policy.configured_queues() == ("z/q", "a/q")


@pytest.mark.parametrize("name", ["", "a b", "x/*", "/x", 7])
def test_resolve_rejects_invalid_queue_names(layered: QueuePolicy, name: object) -> None:
    with pytest.raises(InvalidQueueName):
        layered.resolve(name)  # type: ignore[arg-type]


def test_settings_apply_only_what_is_set() -> None:
    base = QueueConfig.of(max_concurrent=4, repository="r")
    assert Settings().apply(base) is base
    assert Settings(ref="main").apply(base) == QueueConfig.of(
        max_concurrent=4, repository="r", ref="main"
    )


# --- ties -------------------------------------------------------------------------


def test_tie_is_reported_at_both_locations(tmp_path: Path) -> None:
    issues = tie_issues_of(
        tmp_path, 'queues:\n  mono/main: {}\n  "mobile/*": {}\n  "*/mobile": {}\n'
    )
    assert [str(i.location) for i in issues] == ["queues.yaml:3:3", "queues.yaml:4:3"]
    first, second = issues
    assert "'mobile/*' ties with '*/mobile' at queues.yaml:4:3" in first.message
    assert "'*/mobile' ties with 'mobile/*' at queues.yaml:3:3" in second.message
    assert "both match 'mobile/mobile'" in first.message


@pytest.mark.parametrize(
    ("left", "right"),
    [("a/*", "b/*"), ("*/ios", "*/web"), ("x*y", "y*x"), ("mobile/*/main", "server/*/main")],
)
def test_equal_specificity_without_overlap_is_not_a_tie(
    tmp_path: Path, left: str, right: str
) -> None:
    policy = load_text(tmp_path, f'queues:\n  "{left}": {{}}\n  "{right}": {{}}\n')
    assert len(policy.entries) == 2


def test_overlapping_patterns_of_different_specificity_are_not_a_tie(tmp_path: Path) -> None:
    policy = load_text(
        tmp_path,
        'queues:\n  "mobile/*": {max_attempts: 2}\n  "*/main": {max_attempts: 3}\n',
    )
    # 'mobile/*' has 7 literal characters, '*/main' has 5.
    assert policy.resolve("mobile/main").max_attempts == 2


def test_three_way_tie_reports_every_pair(tmp_path: Path) -> None:
    issues = tie_issues_of(tmp_path, 'queues:\n  "a*": {}\n  "*a": {}\n  "*b": {}\n')
    # a* ~ *a (both match 'a'), a* ~ *b (both match 'ab'); *a and *b never meet.
    assert sorted((str(i.location), i.message.split(" ties with ")[1][:4]) for i in issues) == [
        ("queues.yaml:2:3", "'*a'"),
        ("queues.yaml:2:3", "'*b'"),
        ("queues.yaml:3:3", "'a*'"),
        ("queues.yaml:4:3", "'a*'"),
    ]


def test_hand_built_policy_refuses_a_tie() -> None:
    here = Location("built", 1, 1)
    there = Location("built", 2, 1)
    with pytest.raises(SpecError) as caught:
        QueuePolicy(entries=(PolicyEntry("a*", location=here), PolicyEntry("*a", location=there)))
    assert [i.location for i in caught.value.issues] == [here, there]


def test_hand_built_policy_refuses_a_repeated_exact_name() -> None:
    with pytest.raises(SpecError, match="listed twice"):
        QueuePolicy(entries=(PolicyEntry("a/b"), PolicyEntry("a/b")))


def test_a_resolved_config_is_kept_per_queue_and_the_memo_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Resolving is done once per queue name; the answers are those of a fresh policy,
    a bad name is still refused, and the memo starts over at its bound."""
    import stovepipe_fsm.config.policy as policy_module

    def policy() -> QueuePolicy:
        return QueuePolicy(
            defaults=Settings(max_attempts=2),
            entries=(PolicyEntry("team/*", Settings(max_attempts=3)),),
        )

    memo = policy()
    first = memo.resolve("team/app")
    assert memo.resolve("team/app") is first
    assert first == policy().resolve("team/app") and first.max_attempts == 3
    assert memo.resolve("other/app").max_attempts == 2
    with pytest.raises(InvalidQueueName):
        memo.resolve("bad name")
    monkeypatch.setattr(policy_module, "MAX_RESOLVED_QUEUES", 2)
    memo.resolve("third/app")  # the memo held two names: it starts over with this one
    assert memo.resolve("team/app") is not first
    assert memo.resolve("team/app") == first

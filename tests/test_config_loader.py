"""Loading config/queues.yaml: the shipped file, every kind of bad input, located."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from stovepipe_fsm.config.loader import (
    check_queue_config,
    load_queue_config,
    policy_from_mapping,
)
from stovepipe_fsm.config.policy import QueuePolicy, Settings
from stovepipe_fsm.domain.entities import RUNTIME_KEYS, QueueConfig
from stovepipe_fsm.located.errors import SpecError, SpecIssue
from stovepipe_fsm.located.schema import load_schema, schema_issues
from stovepipe_fsm.located.yaml_source import read_yaml
from stovepipe_fsm.process.catalog import load_process_machines

ROOT = Path(__file__).resolve().parents[1]
DECLARED = load_process_machines(ROOT / "machines").parameters
SHIPPED = ROOT / "config" / "queues.yaml"
SCHEMA_FILE = ROOT / "stovepipe_fsm" / "located" / "schemas" / "queues.schema.json"


#: What culprit.yaml declares, as every queue resolves it by default.
CULPRIT_DEFAULTS = {
    "probe_slots": 0,
    "confirm_reds": 2,
    "max_probes": 32,
    "max_blamelist": 256,
    "flake_aware": False,
    "flake_rate_percent": 1,
    "confidence_percent": 99,
}


def write(tmp_path: Path, text: str, name: str = "queues.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def issues_of(path: Path) -> list[SpecIssue]:
    with pytest.raises(SpecError) as caught:
        load_queue_config(path, display_name=path.name, parameters=DECLARED)
    return list(caught.value.issues)


def where(issue: SpecIssue) -> str:
    return f"{issue.location.file}:{issue.location.line}:{issue.location.column}"


# --- the shipped file -------------------------------------------------------------


def test_shipped_config_passes_schema_and_loads() -> None:
    doc = read_yaml(SHIPPED, display_name="config/queues.yaml")
    assert schema_issues(doc, "queues") == []
    assert check_queue_config(SHIPPED, parameters=DECLARED) == []
    policy = load_queue_config(SHIPPED, parameters=DECLARED)
    assert policy.configured_queues() == ("monorepo/main",)
    assert policy.resolve("monorepo/main").param("max_concurrent") == 1
    assert policy.resolve("mobile/ios").param("gate_wait_delay_ms") == 2000
    assert policy.resolve("other/queue") == QueueConfig.of(
        max_concurrent=1,
        gate_wait_delay_ms=5000,
        paused=False,
        full_build_paths=[],
        max_baseline_lag=0,
        max_validation_ms=0,
        every_head=False,
        keep_newest=0,
        skip_paths=[],
        recent_greens=8,
        **CULPRIT_DEFAULTS,
    )


def test_shipped_config_round_trips_through_the_schema_as_json() -> None:
    # What an editor or CI tool sees when it feeds the YAML to the published schema.
    data = read_yaml(SHIPPED).data
    again = json.loads(json.dumps(data))
    assert again == data
    assert list(Draft202012Validator(load_schema("queues")).iter_errors(again)) == []
    assert policy_from_mapping(again, parameters=DECLARED).resolve(
        "mobile/ios"
    ) == load_queue_config(SHIPPED, parameters=DECLARED).resolve("mobile/ios")


def test_schema_file_is_well_formed_and_documents_every_property() -> None:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].endswith("/queues.schema.json")
    settings_props = schema["$defs"]["settings"]["properties"]
    # The published file lists the runtime's own keys; parameters come from the machines.
    assert set(settings_props) == set(RUNTIME_KEYS)
    for block in (*schema["properties"].values(), *settings_props.values()):
        assert block.get("title") and block.get("description")
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["settings"]["additionalProperties"] is True


def test_declared_parameters_are_the_only_keys_beyond_the_runtime_ones(tmp_path: Path) -> None:
    path = write(tmp_path, "defaults:\n  max_concurent: 2\n")
    [issue] = issues_of(path)
    assert str(issue) == (
        "queues.yaml:2:3: unknown key 'max_concurent' in defaults; allowed: "
        "confidence_percent, confirm_reds, every_head, flake_aware, flake_rate_percent, "
        "full_build_paths, gate_wait_delay_ms, keep_newest, max_attempts, max_baseline_lag, "
        "max_blamelist, max_concurrent, max_probes, max_validation_ms, paused, probe_slots, "
        "recent_greens, ref, repository, skip_paths"
    )
    # Loaded without the declarations (an operator command), any further key is kept.
    policy = load_queue_config(path)
    assert policy.resolve("q").param("max_concurent") == 2


def _all_fields() -> list[tuple[str, object]]:
    return [
        ("max_concurrent", 3),
        ("gate_wait_delay_ms", 10),
        ("max_attempts", 2),
        ("repository", "repos/mono"),
        ("ref", "refs/heads/main"),
        ("paused", "true"),
        ("full_build_paths", "[WORKSPACE]"),
        ("max_baseline_lag", 4),
        ("max_validation_ms", 60000),
        ("every_head", "true"),
        ("keep_newest", 2),
        ("skip_paths", '["docs/**"]'),
        ("recent_greens", 3),
    ]


def test_every_knob_is_loaded(tmp_path: Path) -> None:
    body = "".join(f"  {name}: {value}\n" for name, value in _all_fields())
    policy = load_queue_config(write(tmp_path, f"defaults:\n{body}"), parameters=DECLARED)
    assert policy.resolve("q") == QueueConfig.of(
        max_concurrent=3,
        gate_wait_delay_ms=10,
        max_attempts=2,
        repository="repos/mono",
        ref="refs/heads/main",
        paused=True,
        full_build_paths=["WORKSPACE"],
        max_baseline_lag=4,
        max_validation_ms=60000,
        every_head=True,
        keep_newest=2,
        skip_paths=["docs/**"],
        recent_greens=3,
        **CULPRIT_DEFAULTS,
    )


# --- bad values, each located -----------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("max_concurrent", "0", "less than the minimum of 1"),
        ("max_concurrent", "-1", "less than the minimum of 1"),
        ("max_concurrent", "true", "not of type 'integer'"),
        ("max_concurrent", '"5"', "not of type 'integer'"),
        ("max_concurrent", "1.5", "not of type 'integer'"),
        ("gate_wait_delay_ms", "0", "less than the minimum of 1"),
        ("gate_wait_delay_ms", "-1", "less than the minimum of 1"),
        ("gate_wait_delay_ms", "false", "not of type 'integer'"),
        ("gate_wait_delay_ms", "86400001", "greater than the maximum"),
        ("max_attempts", "0", "less than the minimum of 1"),
        ("max_attempts", '"5"', "not of type 'integer'"),
        ("repository", '""', "should be non-empty"),
        ("ref", "7", "not of type 'string'"),
        ("max_baseline_lag", "-1", "less than the minimum of 0"),
        ("max_baseline_lag", "2.5", "not of type 'integer'"),
        ("max_validation_ms", "-5", "less than the minimum of 0"),
        ("max_validation_ms", '"1h"', "not of type 'integer'"),
        ("recent_greens", "0", "less than the minimum of 1"),
        ("recent_greens", "65", "greater than the maximum of 64"),
    ],
)
def test_bad_default_value_is_located(
    tmp_path: Path, field: str, value: str, fragment: str
) -> None:
    path = write(tmp_path, f"# policy\ndefaults:\n  {field}: {value}\n")
    [issue] = issues_of(path)
    value_column = len(f"  {field}: ") + 1
    assert where(issue) == f"queues.yaml:3:{value_column}"
    assert f"defaults.{field}" in issue.message
    assert fragment in issue.message


@pytest.mark.parametrize("value", ["0", "-1", "true", '"5"'])
def test_bad_entry_value_is_located(tmp_path: Path, value: str) -> None:
    path = write(
        tmp_path,
        'queues:\n  monorepo/main: {max_concurrent: 2}\n  "mobile/*":\n'
        f"    max_concurrent: {value}\n",
    )
    [issue] = issues_of(path)
    assert where(issue) == "queues.yaml:4:21"
    assert "queues.mobile/*.max_concurrent" in issue.message


def test_float_with_zero_fraction_is_stored_as_int(tmp_path: Path) -> None:
    config = load_queue_config(
        write(tmp_path, "defaults: {max_concurrent: 2.0}\n"), parameters=DECLARED
    ).resolve("q")
    assert config.param("max_concurrent") == 2
    assert type(config.param("max_concurrent")) is int


@pytest.mark.parametrize(
    ("text", "location", "key"),
    [
        ("defaults: {}\ncolour: blue\n", "queues.yaml:2:1", "colour"),
        ("defaults:\n  max_concurent: 2\n", "queues.yaml:2:3", "max_concurent"),
        ("queues:\n  a/b:\n    max_concurrent: 1\n    extra: 1\n", "queues.yaml:4:5", "extra"),
    ],
)
def test_unknown_key_is_located(tmp_path: Path, text: str, location: str, key: str) -> None:
    [issue] = issues_of(write(tmp_path, text))
    assert where(issue) == location
    assert f"unknown key {key!r}" in issue.message


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing but a comment\n# and another\n"])
def test_empty_or_comment_only_file_is_an_error(tmp_path: Path, text: str) -> None:
    [issue] = issues_of(write(tmp_path, text))
    assert where(issue) == "queues.yaml:1:1"
    assert "empty" in issue.message


@pytest.mark.parametrize("text", ["- a\n- b\n", "42\n", "defaults: 3\n", "queues: [a]\n"])
def test_wrong_shape_is_an_error(tmp_path: Path, text: str) -> None:
    issues = issues_of(write(tmp_path, text))
    assert issues and all("not of type" in i.message for i in issues)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    [issue] = check_queue_config(
        tmp_path / "nope.yaml", display_name="nope.yaml", parameters=DECLARED
    )
    assert str(issue) == "nope.yaml:1:1: file not found"


def test_duplicate_queue_key_is_a_syntax_error(tmp_path: Path) -> None:
    [issue] = issues_of(write(tmp_path, "queues:\n  a/b: {}\n  a/b: {}\n"))
    assert where(issue) == "queues.yaml:3:3"
    assert "duplicate key 'a/b'" in issue.message


def test_null_blocks_set_nothing(tmp_path: Path) -> None:
    policy = load_queue_config(write(tmp_path, "defaults:\nqueues:\n  a/b:\n"), parameters=DECLARED)
    assert policy.defaults == Settings()
    assert policy.configured_queues() == ("a/b",)
    assert policy.resolve("a/b") == QueueConfig.of(
        max_concurrent=1,
        gate_wait_delay_ms=5000,
        paused=False,
        full_build_paths=[],
        max_baseline_lag=0,
        max_validation_ms=0,
        every_head=False,
        keep_newest=0,
        skip_paths=[],
        recent_greens=8,
        **CULPRIT_DEFAULTS,
    )


# --- queue-name and pattern keys --------------------------------------------------


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ('"a b"', "whitespace at position 1"),
        ('"/lead"', "empty '/' segment"),
        ('"trail/"', "empty '/' segment"),
        ('"a//b"', "empty '/' segment"),
        ('"a>b"', "wildcard '>'"),
        ('""', "must not be empty"),
        ('"' + "q" * 201 + '"', "at most 200"),
    ],
)
def test_invalid_exact_name_is_located_with_reason(tmp_path: Path, key: str, reason: str) -> None:
    [issue] = issues_of(write(tmp_path, f"queues:\n  ok/name: {{}}\n  {key}: {{}}\n"))
    assert where(issue) == "queues.yaml:3:3"
    assert issue.rule == "queue-name"
    assert "invalid queue name" in issue.message
    assert reason in issue.message


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ('"/*"', "empty '/' segment"),
        ('"*/"', "empty '/' segment"),
        ('"a//*"', "empty '/' segment"),
        ('"a *"', "whitespace at position 1"),
        ('"a**"', "write a single '*'"),
    ],
)
def test_pattern_that_cannot_match_is_located(tmp_path: Path, key: str, reason: str) -> None:
    [issue] = issues_of(write(tmp_path, f"queues:\n  {key}: {{}}\n"))
    assert where(issue) == "queues.yaml:2:3"
    assert issue.rule == "pattern"
    assert reason in issue.message


def test_all_issues_are_reported_in_one_go(tmp_path: Path) -> None:
    text = (
        "defaults:\n"
        "  max_concurrent: true\n"
        "  bogus: 1\n"
        "queues:\n"
        '  "bad name": {}\n'
        '  "x*": {}\n'
        '  "*x": {gate_wait_delay_ms: 0}\n'
    )
    issues = issues_of(write(tmp_path, text))
    assert [(where(i), i.rule) for i in issues] == [
        ("queues.yaml:2:19", "schema"),
        ("queues.yaml:3:3", "schema"),
        ("queues.yaml:5:3", "queue-name"),
        ("queues.yaml:6:3", "tie"),
        ("queues.yaml:7:3", "tie"),
        ("queues.yaml:7:30", "schema"),
    ]
    assert (
        check_queue_config(
            tmp_path / "queues.yaml", display_name="queues.yaml", parameters=DECLARED
        )
        == issues
    )


def test_issue_text_is_file_line_column_message(tmp_path: Path) -> None:
    path = write(tmp_path, "defaults: {max_concurrent: 0}\n")
    with pytest.raises(SpecError) as caught:
        load_queue_config(path, display_name="config/queues.yaml", parameters=DECLARED)
    assert str(caught.value) == (
        "config/queues.yaml:1:28: defaults.max_concurrent: 0 is less than the minimum of 1"
    )


# --- in-memory content ------------------------------------------------------------


def test_mapping_content_is_validated_like_a_file() -> None:
    with pytest.raises(SpecError) as caught:
        policy_from_mapping(
            {"defaults": {"max_concurrent": True}, "queues": {"a b": {}}}, parameters=DECLARED
        )
    messages = [str(i) for i in caught.value.issues]
    assert any("defaults.max_concurrent: True is not of type 'integer'" in m for m in messages)
    assert any("invalid queue name 'a b'" in m for m in messages)
    assert all(m.startswith("<memory>:1:1: ") for m in messages)


def test_mapping_content_builds_the_same_policy_as_the_file(tmp_path: Path) -> None:
    text = 'defaults: {max_attempts: 3}\nqueues:\n  "m/*": {max_concurrent: 2}\n'
    from_file = load_queue_config(write(tmp_path, text), parameters=DECLARED)
    from_mapping = policy_from_mapping(
        {"defaults": {"max_attempts": 3}, "queues": {"m/*": {"max_concurrent": 2}}},
        parameters=DECLARED,
    )
    assert isinstance(from_mapping, QueuePolicy)
    assert from_mapping.defaults == from_file.defaults
    assert [(e.key, e.settings) for e in from_mapping.entries] == [
        (e.key, e.settings) for e in from_file.entries
    ]

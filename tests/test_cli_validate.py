"""``stovepipe-fsm validate``: the command reviewers and CI run after editing the YAML.

Defects are injected into a copy of the tests' own policy (``tests/fixtures``, laid out
like the shipped ``machines/`` and ``config/``) in a temporary directory; the command
must name every one as ``file:line:column: message`` (or as JSON), exit 1, and
never show a traceback.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixture_policy import copy_policy

from stovepipe_fsm.apps.cli import main

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("machines/request.yaml", "machines/queue_gate.yaml", "config/queues.yaml")
ISSUE_LINE = r"^[^:\s]+:\d+:\d+: .+$"


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the fixture machines and config; the working directory during the test."""
    copy_policy(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"expected exactly one {old!r} in {path.name}"
    path.write_text(text.replace(old, new), encoding="utf-8")


def line_of(path: Path, needle: str) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    [number] = [i for i, line in enumerate(lines, 1) if needle in line]
    return number


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["validate", *args])
    out, err = capsys.readouterr()
    return code, out, err


# --- clean input ---------------------------------------------------------------------


def test_shipped_files_by_default(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys)
    assert (code, out) == (0, "")
    assert err.strip() == "validated 3 file(s): ok"


def test_shipped_files_in_the_repository(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    code, out, err = run(capsys, *SHIPPED)
    assert (code, out, err.strip()) == (0, "", "validated 3 file(s): ok")


def test_directory_argument_validates_every_yaml_in_it(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tree / "machines" / "notes.txt").write_text("not yaml: [", encoding="utf-8")
    code, out, _ = run(capsys, "machines", "--format", "json")
    assert code == 0
    assert json.loads(out) == {
        "files": ["machines/queue_gate.yaml", "machines/request.yaml"],
        "issues": [],
    }


# --- injected defects ----------------------------------------------------------------


def test_each_defect_is_one_located_line_and_exit_1(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = tree / "machines" / "queue_gate.yaml"
    request = tree / "machines" / "request.yaml"
    config = tree / "config" / "queues.yaml"
    edit(
        gate,
        "    after: [mark_processing, release_lost_claim, announce, publish_build, ack]\n",
        "    after: [publish_build, mark_processing, release_lost_claim, announce, ack]\n",
    )
    edit(request, "    holds_slot: true\n", "    holds_slot: true\n    owner: build\n")
    edit(config, "  monorepo/main: {max_concurrent: 1}\n", "  monorepo/main: {max_concurrent: 0}\n")

    code, out, err = run(capsys)
    assert code == 1
    lines = out.splitlines()
    assert len(lines) == 3
    publish = line_of(gate, "[publish_build, mark_processing")
    owner = line_of(request, "owner: build")
    limit = line_of(config, "max_concurrent: 0")
    assert lines[0].startswith(f"machines/request.yaml:{owner}:5: unknown key 'owner'")
    assert lines[1].startswith(
        f"machines/queue_gate.yaml:{publish}:13: persist before publish: 'publish_build'"
    )
    limit_column = config.read_text().splitlines()[limit - 1].index("0}") + 1
    assert lines[2].startswith(f"config/queues.yaml:{limit}:{limit_column}: ")
    assert "less than the minimum of 1" in lines[2]
    assert err.strip() == "validated 3 file(s): 3 issue(s)"
    assert "Traceback" not in out + err


def test_every_defect_of_one_file_is_reported_in_one_run(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = tree / "machines" / "request.yaml"
    edit(request, "kind: lifecycle\n", "kind: lifecycle\ncolour: blue\n")
    edit(request, "    dest: succeeded\n", "    dest: 5\n")
    edit(request, "  - name: cancelled\n", "  - name: Cancelled\n")
    code, out, _ = run(capsys, "machines/request.yaml")
    assert code == 1
    found = [line.split(": ", 1)[0] for line in out.splitlines()]
    assert found == [
        f"machines/request.yaml:{line_of(request, 'colour: blue')}:1",
        f"machines/request.yaml:{line_of(request, 'name: Cancelled')}:11",
        f"machines/request.yaml:{line_of(request, 'dest: 5')}:11",
    ]


def test_json_output_shape(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gate = tree / "machines" / "queue_gate.yaml"
    edit(gate, "    unless: slot_conflict\n", "")
    code, out, err = run(capsys, "--format", "json")
    assert code == 1
    assert err == ""  # machine-readable output only
    report = json.loads(out)
    assert set(report) == {"files", "issues"}
    assert report["files"] == list(SHIPPED)
    assert report["issues"], "expected issues"
    for issue in report["issues"]:
        assert set(issue) == {"file", "line", "column", "rule", "message"}
        assert isinstance(issue["line"], int) and isinstance(issue["column"], int)
        assert issue["file"] == "machines/queue_gate.yaml"
    rules = {i["rule"] for i in report["issues"]}
    assert rules == {"nondeterministic", "persist-before-publish"}
    [nondet] = [i for i in report["issues"] if i["rule"] == "nondeterministic"]
    second_admit = [
        n for n, line in enumerate(gate.read_text().splitlines(), 1) if "trigger: admit" in line
    ][1]
    assert (nondet["line"], nondet["column"]) == (second_admit, 5)


def test_config_file_is_detected_and_located(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tree / "config" / "queues.yaml"
    edit(config, "  gate_wait_delay_ms: 5000 ", "  gate_wait_delay_ms: soon ")
    code, out, _ = run(capsys, "config/queues.yaml", "--format", "json")
    assert code == 1
    [issue] = json.loads(out)["issues"]
    line = line_of(config, "gate_wait_delay_ms: soon")
    assert (issue["file"], issue["line"], issue["column"]) == ("config/queues.yaml", line, 23)
    assert issue["rule"] == "schema"
    assert "'soon' is not of type 'integer'" in issue["message"]


def test_config_under_another_name_is_still_detected(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tree / "staging-policy.yaml"
    entry = "  mobile/ios: {max_attempts: -2}"
    path.write_text(f"queues:\n{entry}\n", encoding="utf-8")
    code, out, _ = run(capsys, "staging-policy.yaml")
    assert code == 1
    [line] = out.splitlines()
    assert line.startswith(f"staging-policy.yaml:2:{entry.index('-2') + 1}: ")
    assert "less than the minimum of 1" in line


def test_bad_yaml_is_located_without_a_traceback(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = tree / "machines" / "queue_gate.yaml"
    edit(gate, "[derive_strategy, claim_slot]\n", "[derive_strategy, claim_slot\n")
    code, out, err = run(capsys)
    assert code == 1
    [line] = out.splitlines()
    assert line.startswith("machines/queue_gate.yaml:")
    assert "YAML syntax error" in line
    opened = line_of(gate, "[derive_strategy, claim_slot")
    assert f"while parsing a flow sequence at line {opened}, column 12" in line
    assert "Traceback" not in out + err


def test_duplicate_key_in_config_names_both_lines(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tree / "config" / "queues.yaml"
    edit(config, "  max_attempts: 5 ", "  max_attempts: 5\n  max_concurrent: 2 ")
    code, out, _ = run(capsys)
    assert code == 1
    first = line_of(config, "max_concurrent: 1          #")
    [line] = out.splitlines()
    assert line.startswith(f"config/queues.yaml:{line_of(config, 'max_concurrent: 2')}:3: ")
    assert f"duplicate key 'max_concurrent' (first defined at line {first})" in line


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"", "file is empty"),
        (b"# nothing yet\n", "file is empty"),
        (b"name: caf\xe9\n", "not valid UTF-8"),
    ],
)
def test_unusable_files_are_issues_not_crashes(
    tree: Path, capsys: pytest.CaptureFixture[str], content: bytes, fragment: str
) -> None:
    (tree / "machines" / "request.yaml").write_bytes(content)
    code, out, err = run(capsys)
    assert code == 1
    [line] = out.splitlines()
    assert line.startswith("machines/request.yaml:1:")
    assert fragment in line
    assert "Traceback" not in out + err


def test_missing_file_is_reported(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "machines/reqest.yaml")
    assert code == 1
    assert out.strip() == "machines/reqest.yaml:1:1: file not found"


# --- as a real process ---------------------------------------------------------------


def test_as_a_subprocess(tree: Path) -> None:
    request = tree / "machines" / "request.yaml"
    edit(request, "    source: [accepted, processing]\n", "    source: '*'\n")
    command = [sys.executable, "-m", "stovepipe_fsm.apps.cli", "validate"]

    bad = subprocess.run(command, cwd=tree, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1, bad.stderr
    lines = bad.stdout.splitlines()
    star = line_of(request, "source: '*'")
    assert len(lines) == 4  # one per terminal state the '*' sweeps in
    assert all(line.startswith(f"machines/request.yaml:{star}:13: source '*'") for line in lines)
    assert bad.stderr.strip() == "validated 3 file(s): 4 issue(s)"
    assert "Traceback" not in bad.stderr

    good = subprocess.run(
        [*command, "--format", "json", *SHIPPED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout) == {"files": list(SHIPPED), "issues": []}


def test_unknown_format_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["validate", "--format", "xml"])
    assert caught.value.code == 2
    assert "invalid choice: 'xml'" in capsys.readouterr().err


# --- across files ----------------------------------------------------------------------


def test_two_machine_files_with_one_name_are_reported(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copyfile(tree / "machines" / "request.yaml", tree / "machines" / "request_copy.yaml")
    code, out, _ = run(capsys, "machines")
    assert code == 1
    [line] = out.splitlines()
    assert line.startswith("machines/request_copy.yaml:")
    assert "machine name 'request' is already used by machines/request.yaml" in line


def test_a_directory_without_yaml_is_bad_input(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tree / "empty").mkdir()
    code, out, err = run(capsys, "empty")
    assert code == 2
    assert out == ""
    assert "empty: no .yaml files to validate" in err


def test_a_misspelt_queue_config_is_checked_as_config(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tree / "config" / "queues.yaml").write_text("queue:\n  a/b: {}\n", encoding="utf-8")
    code, out, _ = run(capsys, "config/queues.yaml")
    assert code == 1
    assert out.strip() == (
        "config/queues.yaml:1:1: unknown key 'queue' in document; "
        "allowed: defaults, invariants, queues"
    )

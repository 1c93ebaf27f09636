"""``whatif`` with a column per policy: ``--policy DIR`` and ``--vary PARAM=V1,V2,...``.

The walkthrough under the shipped policy, two example policy directories and the
shipped policy at max_concurrent 1, 2 and 3, in one run: a column each, in the order
given, with the two-policy form left as it was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stovepipe_fsm.apps.cli import EXIT_OK, EXIT_USAGE, main

ROOT = Path(__file__).resolve().parent.parent
WALKTHROUGH = "examples/walkthrough.yaml"
SERIAL = "examples/policies/serial_every_head"
CANCEL = "examples/policies/cancel_in_progress"
SIX = [
    WALKTHROUGH,
    "--policy",
    SERIAL,
    "--policy",
    CANCEL,
    "--vary",
    "max_concurrent=1,2,3",
]
LABELS = [
    "policy",
    "serial_every_head",
    "cancel_in_progress",
    "max_concurrent=1",
    "max_concurrent=2",
    "max_concurrent=3",
]


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["whatif", *args])
    out, err = capsys.readouterr()
    return code, out, err


def doc_of(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = run([*args, "--json"], capsys)
    assert code == EXIT_OK, err
    loaded: dict[str, Any] = json.loads(out)
    return loaded


def test_a_column_per_policy_in_the_order_given(capsys: pytest.CaptureFixture[str]) -> None:
    doc = doc_of(SIX, capsys)
    assert [p["label"] for p in doc["policies"]] == LABELS
    assert doc["policies"][3]["set"] == {"max_concurrent": 1}
    assert doc["policies"][1]["machines"] == f"{SERIAL}/machines"
    (queue,) = doc["queues"]
    assert len(queue["figures"]) == len(doc["total"]) == len(doc["completes"]) == 6
    shipped, serial, cancel, one, two, three = doc["total"]
    assert serial["supersedes"] == 0 and shipped["supersedes"] == 4
    assert cancel["preempted"] == 2 and shipped["preempted"] == 0
    # --vary wins over the max_concurrent 1 the walkthrough's own config sets.
    assert one == shipped
    assert [f["supersedes"] for f in (one, two, three)] == [4, 2, 0]
    a = next(d for d in doc["differences"] if d["uri"] == "A")
    assert a["outcomes"] == ["succeeded", "succeeded", "preempted", *["succeeded"] * 3]


def test_the_text_is_one_table_with_a_column_per_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(SIX, capsys)
    assert code == EXIT_OK, err
    header = next(line for line in out.splitlines() if line.startswith("queue "))
    assert header.split() == ["queue", "figure", *LABELS]
    preempted = next(line for line in out.splitlines() if line.split()[:2] == ["preempted", "0"])
    assert preempted.split() == ["preempted", "0", "0", "2", "0", "0", "0"]
    assert (
        "max_concurrent=2: machines + config/queues.yaml (max_concurrent=2 on every queue)" in out
    )


def test_the_vs_policy_is_the_second_column(capsys: pytest.CaptureFixture[str]) -> None:
    vs = ["--vs-machines", f"{SERIAL}/machines", "--vs-config", f"{SERIAL}/config/queues.yaml"]
    doc = doc_of([WALKTHROUGH, *vs, "--policy", CANCEL], capsys)
    assert [p["label"] for p in doc["policies"]] == ["policy", "vs policy", "cancel_in_progress"]
    # The same policy twice is two columns, told apart.
    doc = doc_of([WALKTHROUGH, "--policy", CANCEL, "--policy", CANCEL], capsys)
    assert [p["label"] for p in doc["policies"]][1:] == [
        "cancel_in_progress",
        "cancel_in_progress #2",
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([], "nothing to compare"),
        (["--policy", "docs"], "--policy docs: not a policy directory"),
        (["--vary", "max_concurrent"], "write PARAM=V1,V2,..."),
        (["--vary", "max_concurrent=1,,2"], "write PARAM=V1,V2,..."),
        (["--vary", "max_concurrent=0"], "--vary max_concurrent=0:1:1: defaults.max_concurrent"),
    ],
)
def test_what_names_no_policy_is_refused(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run([WALKTHROUGH, *args], capsys)
    assert code == EXIT_USAGE
    assert said in err
    assert out == ""

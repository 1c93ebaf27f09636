"""``status`` text: aligned columns with short commit ids (``--json`` keeps them whole),
the policy line with when each part was loaded and the last refused edit, last green
with its age; ``dlq list`` with a header."""

from __future__ import annotations

import time

from stovepipe_fsm.adapters.jetstream.dead_letter import DeadLetter
from stovepipe_fsm.apps.service.dlq import StoredLetter, render_letters
from stovepipe_fsm.apps.service.operators import render_status

SHA = "4f2a9c1e0b7d3a5c6e8f90a1b2c3d4e5f6a7b8c9"
SHA2 = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d"


def row(n: int, uri: str, state: str, strategy: str = "", base: str = "") -> dict[str, object]:
    return {
        "id": f"request/mono/main/{n}",
        "queue": "mono/main",
        "uri": uri,
        "state": state,
        "build_strategy": strategy,
        "base_uri": base,
        "superseded_by": "",
        "ingested_at_ms": 1,
        "admitted_at_ms": 0,
        "ended_at_ms": 0,
    }


def test_request_columns_line_up_and_commits_are_short() -> None:
    now_ms = int(time.time() * 1000)
    doc = {
        "requests": [
            row(9, SHA, "succeeded", "full"),
            row(10, SHA2, "processing", "incremental_since_green", SHA),
            row(11, "feature", "accepted"),
        ],
        "queues": [
            {"name": "mono/main", "in_flight_count": 1, "last_green_uri": SHA,
             "latest_request_id": "request/mono/main/11"}
        ],
        "slot_holders": {"mono/main": ["request/mono/main/10"]},
        "queue_details": {
            "mono/main": {
                "parameters": {"max_concurrent": 2, "paused": False, "skip_paths": ["docs/**"]},
                "holders": [],
                "waiting": 0,
                "oldest_waiting": None,
                "last_green": {"uri": SHA, "request_id": "request/mono/main/9",
                               "at_ms": now_ms - 180_000},
            }
        },
    }
    lines = render_status(doc).splitlines()
    assert SHA not in "\n".join(lines) and SHA[:10] in "\n".join(lines)
    table = lines[lines.index("requests:") + 1 :]
    assert table[0].split() == ["request", "commit", "state", "strategy", "base"]
    for column in ("commit", "state", "strategy", "base"):
        at = table[0].index(column)
        assert all(line[at - 2 : at] == "  " and line[at] != " " for line in table[1:3]), (
            column, table,
        )
    assert table[2].endswith(f"incremental_since_green  {SHA[:10]}")
    assert "    last green: 4f2a9c1e0b for 3m" in lines
    assert "    parameters: max_concurrent=2, paused=false, skip_paths=[docs/**]" in lines


def test_the_policy_lines_say_when_each_part_loaded_and_the_last_refused_edit() -> None:
    policy = {
        "hash": "0123456789abcdef",
        "loaded_at_ms": 0,
        "replica": "host:7",
        "machines_loaded_at_ms": 60_000,
        "config_loaded_at_ms": 120_000,
        "refused": {
            "part": "config",
            "error": "queues.yaml:3:18: max_concurrent: -1 is less than the minimum of 1\nmore",
            "at_ms": 180_000,
            "now": True,
        },
    }
    doc = {"requests": [], "queues": [], "slot_holders": {}, "policy": policy}
    lines = render_status(doc).splitlines()
    assert lines[1] == (
        "    machines loaded 1970-01-01T00:01:00Z, config loaded 1970-01-01T00:02:00Z"
    )
    assert lines[2] == "    last refused edit (config) at 1970-01-01T00:03:00Z, not in force:"
    assert lines[3] == "      queues.yaml:3:18: max_concurrent: -1 is less than the minimum of 1"
    # A service run on machines alone has no hash: said so, not left blank.
    doc["policy"] = {"hash": "", "loaded_at_ms": 0, "replica": "h:1"}
    assert render_status(doc).splitlines()[0].startswith("policy: unhashed (loaded ")


def test_dlq_list_has_a_header_over_aligned_columns() -> None:
    letters = [
        StoredLetter(7, "s", 0, DeadLetter("mono/main", "request/mono/main/3", "x", 5, 9)),
        StoredLetter(12, "s", 0, None, "not readable"),
    ]
    lines = render_letters(letters).splitlines()
    assert lines[0].split() == ["id", "stored", "at", "stage", "queue", "request", "attempts",
                                "reason"]
    at = lines[0].index("queue")
    assert lines[1][at:].startswith("mono/main") and lines[2][at:].startswith("-")

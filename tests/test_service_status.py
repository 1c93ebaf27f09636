"""``status`` text: slot holders per queue, the newest requests of each queue."""

from __future__ import annotations

from typing import Any

from stovepipe_fsm.apps.service.operators import render_status, trimmed_status


def request(queue: str, n: int, state: str = "superseded") -> dict[str, Any]:
    return {
        "id": f"request/{queue}/{n}",
        "queue": queue,
        "uri": f"c{n}",
        "state": state,
        "build_strategy": "",
        "base_uri": "",
    }


def document() -> dict[str, Any]:
    return {
        "requests": [request("a/q", n) for n in range(1, 13)] + [request("b/q", 1, "accepted")],
        "queues": [
            {
                "name": "a/q",
                "in_flight_count": 1,
                "last_green_uri": "c0",
                "latest_request_id": "request/a/q/12",
            },
            {
                "name": "b/q",
                "in_flight_count": 0,
                "last_green_uri": "",
                "latest_request_id": "request/b/q/1",
            },
        ],
        "slot_holders": {"a/q": ["request/a/q/12"], "b/q": []},
    }


def test_queues_show_their_slot_holders() -> None:
    lines = render_status(document()).splitlines()
    assert lines[1].startswith("  a/q: in_flight=1 holders=request/a/q/12 last_green=c0")
    assert lines[2].startswith("  b/q: in_flight=0 holders=- last_green=-")


def test_only_the_newest_requests_of_each_queue_unless_all() -> None:
    text = render_status(document(), recent=10)
    assert "requests (2 older not shown; --all):" in text
    assert "request/a/q/2 " not in text and "request/a/q/3 " in text
    assert "request/b/q/1 " in text  # another queue's requests are not crowded out
    everything = render_status(document(), recent=None)
    assert "requests:" in everything and "request/a/q/1 " in everything


def test_status_json_keeps_the_newest_requests_of_each_queue_unless_all() -> None:
    doc = document()
    trimmed = trimmed_status(doc, 10)
    ids = [r["id"] for r in trimmed["requests"]]
    assert ids == [f"request/a/q/{n}" for n in range(3, 13)] + ["request/b/q/1"]
    assert trimmed["requests_not_shown"] == 2
    assert doc["requests"] == document()["requests"]  # the document itself is untouched
    everything = trimmed_status(doc, None)
    assert len(everything["requests"]) == 13 and "requests_not_shown" not in everything

"""The checker explores an operator's ``retry`` racing new heads, and catches a retry
that lets an older commit become latest over a newer head.

``--max-retries N`` lets each path run the real verb (``pipeline/verbs.py``, through the
``retry`` timeline step) on any head that ended failed or cancelled, at every point of
the path: before or after a newer head's ingest, its admission, its outcome. The verb
refuses a head behind a newer one on a queue that coalesces; a refused retry writes
nothing and is no edge. Off by default (it multiplies the space).
"""

from __future__ import annotations

import pytest
from test_check_cancels import SMALL, STATES, _repo_root, run_check  # noqa: F401

from stovepipe_fsm.pipeline import verbs
from stovepipe_fsm.simulation.broker import run_sync
from stovepipe_fsm.simulation.world import World

#: No faults but the retry: the space stays small enough for the fast tier.
NO_FAULTS = ["--max-crashes", "0", "--max-duplicates", "0", "--max-outages", "0"]


def test_retries_explored_hold_every_invariant_and_reach_more_states(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, plain = run_check(capsys, *SMALL, *NO_FAULTS)
    assert code == 0, plain
    assert "operator retry" not in plain
    code, with_retries = run_check(capsys, *SMALL, *NO_FAULTS, "--max-retries", "1")
    assert code == 0, with_retries
    assert "1 operator retry(ies)" in with_retries
    (before,) = STATES.findall(plain)
    (after,) = STATES.findall(with_retries)
    assert int(after) > int(before)


def test_a_retry_that_ignores_a_newer_head_is_caught(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verb run as if the queue validated every head: a failed older head is retried
    after a newer one was ingested, its new request becomes latest and the newer head is
    superseded. The check names the broken property."""

    def blind_retry(world: World, request_id: str) -> verbs.RetryResult:
        return run_sync(
            verbs.retry(
                world.stages.lifecycle,
                world.stages.ingest,
                world.uri_index,
                request_id,
                by="timeline",
                coalesces=False,
            )
        )

    monkeypatch.setattr(World, "retry", blind_retry)
    code, out = run_check(capsys, *SMALL, *NO_FAULTS, "--max-retries", "1")
    assert code != 0, out
    assert "retries_only_latest" in out
    assert "trunk validation moved backwards" in out

"""The rules of the operator verbs about queues and of the policy an operator command
takes, without a broker: which pause is refused, the records each verb leaves, which of
them a request's history shows, and the recorded-or-loaded request machine states."""

from __future__ import annotations

import pytest

from stovepipe_fsm.domain.errors import IllegalOperation
from stovepipe_fsm.domain.trail_record import OPERATOR, TrailRecord
from stovepipe_fsm.pipeline.policy_in_force import (
    PolicyUnavailable,
    initial_state,
    terminal_states,
)
from stovepipe_fsm.pipeline.queue_verbs import (
    dlq_prune_record,
    pause_record,
    refuse_unpausable,
    resume_record,
    with_queue_verbs,
)
from stovepipe_fsm.process.catalog import load_process_machines


def test_a_pause_is_refused_only_by_a_recorded_policy_without_the_paused_parameter() -> None:
    refuse_unpausable([], "")  # no policy recorded: the pause waits for one
    refuse_unpausable(["paused", "max_concurrent"], "cafe")
    with pytest.raises(IllegalOperation, match=r"policy in force \(cafe\) declares no 'paused'"):
        refuse_unpausable(["max_concurrent"], "cafe")
    with pytest.raises(IllegalOperation, match=r"\(unhashed\)"):
        refuse_unpausable(["max_concurrent"], "")


def test_a_pause_and_the_resume_that_lifts_it_share_the_pause_in_their_tags() -> None:
    paused = pause_record("team/*", 1_000, "oncall", "incident 42")
    assert (paused.kind, paused.queue, paused.request_id) == (OPERATOR, "team/*", "")
    assert paused.at_ms == 1_000 and paused.tag == "pause|team/*|1000"
    assert dict(paused.detail) == {"verb": "pause", "by": "oncall", "what": "paused: incident 42"}
    again = pause_record("team/*", 1_000, "oncall", "incident 42")
    assert again == paused  # the same pause paused again: the same record
    resumed = resume_record("team/*", 1_000, "", 5_000)
    assert resumed.at_ms == 5_000 and resumed.tag == "resume|team/*|1000"
    assert dict(resumed.detail) == {"verb": "resume", "by": "operator", "what": "resumed"}


def test_a_dlq_prune_record_names_the_range_it_deleted() -> None:
    one = dlq_prune_record("", [7], 60.0, "ops", 9_000)
    assert one.queue == "**" and one.tag == "dlq prune||7|1"
    assert dict(one.detail)["what"] == "deleted 1 dead letter(s) (7) older than 60s"
    many = dlq_prune_record("team/*", [3, 4, 9], 86400.0, "ops", 9_000)
    assert many.queue == "team/*" and many.tag == "dlq prune|team/*|3..9|3"


def _request(at_ms: int) -> TrailRecord:
    return TrailRecord("ingested", "team/app", "request/team/app/1", at_ms, tag="ingested")


def test_a_history_shows_the_verbs_of_its_queue_while_it_was_open() -> None:
    records = [_request(2_000)]
    before = pause_record("team/*", 1_000, "", "")  # in force when it was ingested
    # An earlier pause, lifted before it was ingested.
    lifted_before = [pause_record("team/*", 500, "", ""), resume_record("team/*", 500, "", 600)]
    elsewhere = pause_record("tools/x", 2_500, "", "")
    resumed = resume_record("team/*", 1_000, "", 3_000)
    late = pause_record("team/app", 9_000, "", "")  # after it ended
    verbs = [before, *lifted_before, elsewhere, resumed, late]
    shown = with_queue_verbs(records, verbs, ended_at_ms=4_000)
    assert shown == [before, records[0], resumed]
    assert with_queue_verbs(records, verbs, ended_at_ms=0)[-1] == late  # still open


def test_an_operator_command_takes_the_recorded_states_else_the_machines() -> None:
    shipped = load_process_machines("machines")
    assert initial_state("waiting", "no/such/dir") == "waiting"
    assert initial_state("", "machines") == shipped.roles.initial
    assert terminal_states(["done"], "no/such/dir") == frozenset({"done"})
    assert terminal_states([], "machines") == shipped.request.terminal
    with pytest.raises(PolicyUnavailable, match="no service has recorded the policy"):
        terminal_states([], "no/such/dir")

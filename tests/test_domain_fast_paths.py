"""The domain's fast paths answer exactly as the slow ones they stand for.

A long replay runs each of these hundreds of thousands of times, so each has a cheaper
form than the obvious library call; these tests hold the cheap form to the library's
answer, including on the inputs where a cache or a shortcut could go wrong.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from stovepipe_fsm.domain import hooks
from stovepipe_fsm.domain.entities import Queue, QueueConfig, Request, evolve
from stovepipe_fsm.domain.queue_names import (
    InvalidQueueName,
    validate_queue_name,
    validate_stored_queue_name,
)

REQUEST = Request(
    id="request/team/app/3",
    queue="team/app",
    uri="B",
    state="accepted",
    ingested_at_ms=5,
    retry_of="request/team/app/1",
)
QUEUE = Queue(
    name="team/app",
    slot_holders=("request/team/app/1", "request/team/app/2"),
    leases=(("request/team/app/1", 9_000),),
    serial_holder="request/team/app/2",
    version=4,
)


@pytest.mark.parametrize(
    ("entity", "changes"),
    [
        (REQUEST, {"state": "processing", "admitted_at_ms": 7}),
        (REQUEST, {"version": 2}),
        (REQUEST, {}),
        (QUEUE, {"slot_holders": (), "leases": (), "serial_holder": ""}),
        (QueueConfig.of(max_concurrent=2), {"max_attempts": 9}),
    ],
)
def test_evolve_makes_what_replace_makes(entity: object, changes: dict[str, object]) -> None:
    made = evolve(entity, **changes)
    expected = dataclasses.replace(entity, **changes)  # type: ignore[type-var]
    assert made == expected
    assert hash(made) == hash(expected)
    assert type(made) is type(expected)
    assert made is not entity
    assert dataclasses.asdict(made) == dataclasses.asdict(expected)  # type: ignore[call-overload]


def test_evolve_leaves_the_original_alone_and_stays_frozen() -> None:
    made = evolve(REQUEST, state="processing")
    assert REQUEST.state == "accepted"
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.state = "failed"  # type: ignore[misc]


def test_evolve_refuses_an_unknown_field_as_replace_does() -> None:
    with pytest.raises(TypeError):
        evolve(REQUEST, colour="red")


def test_evolve_runs_post_init_of_a_dataclass_that_has_one() -> None:
    @dataclasses.dataclass(frozen=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:
            if self.value < 0:
                raise ValueError("negative")

    assert evolve(Checked(1), value=2) == Checked(2)
    with pytest.raises(ValueError, match="negative"):
        evolve(Checked(1), value=-1)


@pytest.mark.parametrize(
    "name",
    ["validation.repository.started|request/team/app/1|2", "", "é|ü|日本", "x" * 5_000],
)
def test_event_ids_are_the_uuid5_of_their_name(name: str) -> None:
    expected = str(uuid.uuid5(hooks._NAMESPACE, name))
    assert hooks.name_based_id(name) == expected
    assert uuid.UUID(hooks.name_based_id(name)).version == 5


def test_event_ids_of_the_hook_events_are_unchanged() -> None:
    started = hooks.started_event("team/app", "request/team/app/1", 2, now_ms=0)
    assert started.id == str(
        uuid.uuid5(hooks._NAMESPACE, "validation.repository.started|request/team/app/1|2")
    )
    ended = hooks.ended_event("team/app", "request/team/app/1", "succeeded", 3, now_ms=0)
    assert ended.id == str(
        uuid.uuid5(hooks._NAMESPACE, "validation.repository.ended|request/team/app/1|3")
    )


@pytest.mark.parametrize("validate", [validate_stored_queue_name, validate_queue_name])
def test_a_refused_queue_name_is_refused_every_time(validate: object) -> None:
    assert callable(validate)
    for _ in range(3):  # a cache of valid names must never learn an invalid one
        with pytest.raises(InvalidQueueName, match="wildcard"):
            validate("team/*")
        with pytest.raises(InvalidQueueName, match="empty '/' segment"):
            validate("team//app")
    assert validate("team/app") == "team/app"
    assert validate("team/app") == "team/app"


def test_a_lookalike_name_is_refused_after_its_stored_form_was_accepted() -> None:
    lookalike = "m\u0430in"  # Cyrillic a: a stored form, never a new name
    assert validate_stored_queue_name(lookalike) == lookalike
    for _ in range(2):
        with pytest.raises(InvalidQueueName, match="mixes scripts"):
            validate_queue_name(lookalike)
    with pytest.raises(InvalidQueueName, match="must be a string"):
        validate_queue_name(3)

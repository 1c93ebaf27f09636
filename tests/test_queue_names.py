"""Queue names that print alike are one queue or no queue: NFC, one script, no lookalikes."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from nats_server import JsEnv

from stovepipe_fsm.adapters.jetstream import open_kv_stores
from stovepipe_fsm.apps.service.operators import render_status, status_document
from stovepipe_fsm.config.loader import load_queue_config
from stovepipe_fsm.domain.entities import Queue
from stovepipe_fsm.domain.ids import parse_request_id
from stovepipe_fsm.domain.queue_names import (
    InvalidQueueName,
    normalize_queue_name,
    validate_queue_name,
    validate_stored_queue_name,
)
from stovepipe_fsm.located.errors import SpecError

CAFE_NFC = "caf\u00e9/main"
CAFE_NFD = unicodedata.normalize("NFD", CAFE_NFC)
CYRILLIC_A = "m\u0430in"  # prints as "main"


@pytest.mark.parametrize(
    "name",
    [
        "monorepo/main",
        "org/repo/release/1.2",
        CAFE_NFC,
        "\u00e9quipe/\u00fcber",  # Latin letters beyond ASCII
        "\u30c1\u30fc\u30e0/\u672c\u7dda",  # Katakana and Han, written together
        "\u043a\u043e\u043c\u0430\u043d\u0434\u0430/2",  # Cyrillic with ASCII digits
    ],
)
def test_names_of_one_script_are_valid(name: str) -> None:
    assert validate_queue_name(name) == name


def test_a_decomposed_name_is_refused_and_normalised_for_the_caller() -> None:
    assert CAFE_NFD != CAFE_NFC
    with pytest.raises(InvalidQueueName, match="not in Unicode NFC form") as info:
        validate_queue_name(CAFE_NFD)
    assert repr(CAFE_NFC) in str(info.value)  # says what to write instead
    assert normalize_queue_name(CAFE_NFD) == CAFE_NFC


@pytest.mark.parametrize(
    ("name", "words"),
    [
        (CYRILLIC_A, "mixes scripts (Latin at position 0, Cyrillic at position 1)"),
        ("\u0391lpha/main", "mixes scripts (Greek at position 0, Latin at position 1)"),
        ("\u65e5\u672c/main", "mixes scripts"),
        ("\uff4d\uff41\uff49\uff4e", "compatibility form of 'm'"),  # fullwidth
        ("\U0001d426ain", "compatibility form of 'm'"),  # mathematical bold
        ("team\u2215app", "may hold letters only"),  # division slash
        ("team\u2010app", "may hold letters only"),  # hyphen
        ("v\u0661", "may hold letters only"),  # Arabic-Indic digit one
        ("\u0301abc", "combining mark on no letter"),
    ],
)
def test_lookalikes_are_refused_with_the_reason(name: str, words: str) -> None:
    with pytest.raises(InvalidQueueName, match=r"position \d") as info:
        validate_queue_name(name)
    assert words in str(info.value)


def test_stored_names_keep_working_under_the_form_rule() -> None:
    """A queue created before the lookalike rule is still read back, addressed and
    parsed; only a new name must pass the whole rule."""
    assert validate_stored_queue_name(CYRILLIC_A) == CYRILLIC_A
    assert parse_request_id(f"request/{CYRILLIC_A}/3").queue == CYRILLIC_A


def test_config_keys_and_globs_follow_the_rule(tmp_path: Path) -> None:
    config = tmp_path / "queues.yaml"
    config.write_text(
        f'queues:\n  "{CAFE_NFD}": {{}}\n  "{CYRILLIC_A}": {{}}\n  "\u043a\u043e\u0434/*": {{}}\n',
        encoding="utf-8",
    )
    with pytest.raises(SpecError) as info:
        load_queue_config(config)
    text = str(info.value)
    assert f"{config}:2:3:" in text and "not in Unicode NFC form" in text
    assert f"{config}:3:3:" in text and "mixes scripts" in text
    assert ":4:" not in text  # a Cyrillic glob is fine: '*' adds no script


async def test_status_shows_a_stored_name_that_breaks_the_rule_escaped(js_env: JsEnv) -> None:
    stores = await open_kv_stores(js_env.js, js_env.topology)
    await stores.queues.create(Queue(name=CYRILLIC_A))  # created before the rule
    await stores.queues.create(Queue(name="monorepo/main"))
    doc = await status_document(js_env.js, js_env.topology)
    [named] = doc["name_problems"]
    assert named["queue"] == CYRILLIC_A and named["escaped"] == "'m\\u0430in'"
    text = render_status(doc)
    assert "queue name 'm\\u0430in' breaks the name rule: " in text
    assert "mixes scripts" in text

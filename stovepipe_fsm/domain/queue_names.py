"""Queue-name rules.

Queue names travel as NATS subject tokens and KV keys (through a reversible encoding in
the JetStream adapter) and appear inside request ids, so they are validated once, here,
with an error that says exactly what is wrong.

Two levels:

- :func:`validate_stored_queue_name`, the *form* every name must have to be stored and
  encoded at all (no whitespace, control characters or wildcards, no empty ``/``
  segment, bounded length). Names read back from the store, subjects and request ids are
  checked against this only, so a queue created before the rule below keeps working.
- :func:`validate_queue_name`, what a *new* name must also be (ingest, config keys and
  globs, timelines): no two names may print alike yet be different queues. So a name is
  in Unicode NFC (``e`` with an acute accent is one code point, U+00E9, never ``e`` plus
  the combining U+0301: :func:`normalize_queue_name` composes it for the caller), has
  no compatibility characters (fullwidth or mathematical letters: NFKC would change
  them), has outside ASCII only letters (and the combining marks NFC leaves on them; no
  U+2215 DIVISION SLASH standing in for ``/``), and all its letters belong to one script
  (ASCII letters are Latin; Han, Kana and Hangul count as one script, as they are
  written together). ``monorepo/main``, ``equipe/cafe`` with accents, or a name all in
  Kana and Han are valid; ``main`` with its ``a`` replaced by the Cyrillic U+0430 is not.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

MAX_QUEUE_NAME_LENGTH = 200
FORBIDDEN_CHARACTERS = frozenset("*>")
#: Scripts written together in one name (Japanese, Korean, Chinese text mixes them).
_CJK_SCRIPTS = frozenset(
    {"CJK", "HIRAGANA", "KATAKANA", "KATAKANA-HIRAGANA", "HANGUL", "BOPOMOFO", "IDEOGRAPHIC"}
)


class InvalidQueueName(ValueError):
    """A queue name breaks one of the rules below; the message says which."""


def validate_stored_queue_name(name: object) -> str:
    """Return ``name`` if it has the form of a queue name, else raise
    :class:`InvalidQueueName`.

    Rules: a non-empty string of at most ``MAX_QUEUE_NAME_LENGTH`` characters, without
    whitespace, control characters, or the wildcard characters ``*`` and ``>``, and not
    starting or ending with ``/`` or containing an empty ``//`` segment.
    """
    if not isinstance(name, str):
        raise InvalidQueueName(f"queue name must be a string, got {type(name).__name__}")
    return _stored_form(name)


# A service or a replay meets the same few queue names on every head: each valid name is
# checked character by character once (an invalid one raises, and is never cached).
@lru_cache(maxsize=8192)
def _stored_form(name: str) -> str:
    if not name:
        raise InvalidQueueName("queue name must not be empty")
    if len(name) > MAX_QUEUE_NAME_LENGTH:
        raise InvalidQueueName(
            f"queue name is {len(name)} characters; at most {MAX_QUEUE_NAME_LENGTH} allowed"
        )
    for index, char in enumerate(name):
        if char.isspace():
            raise InvalidQueueName(f"queue name {name!r} contains whitespace at position {index}")
        if unicodedata.category(char).startswith("C"):
            raise InvalidQueueName(
                f"queue name {name!r} contains control character U+{ord(char):04X} "
                f"at position {index}"
            )
        if char in FORBIDDEN_CHARACTERS:
            raise InvalidQueueName(
                f"queue name {name!r} contains wildcard {char!r} at position {index}"
            )
    if name.startswith("/") or name.endswith("/") or "//" in name:
        raise InvalidQueueName(f"queue name {name!r} has an empty '/' segment")
    return name


def validate_queue_name(name: object) -> str:
    """Return ``name`` if it is a valid *new* queue name (see the module docstring), else
    raise :class:`InvalidQueueName` saying what is wrong and where."""
    return _new_form(validate_stored_queue_name(name))


@lru_cache(maxsize=8192)
def _new_form(text: str) -> str:
    composed = unicodedata.normalize("NFC", text)
    if composed != text:
        raise InvalidQueueName(
            f"queue name {text!r} is not in Unicode NFC form (a letter is written as a "
            f"base letter plus a combining mark); write it composed: {composed!r}"
        )
    _refuse_lookalikes(text)
    return text


def normalize_queue_name(name: object) -> str:
    """``name`` composed to NFC, then validated: what ingest stores for what a user typed
    (a name typed on a system that writes decomposed letters finds the same queue)."""
    if isinstance(name, str):
        name = unicodedata.normalize("NFC", name)
    return validate_queue_name(name)


def _refuse_lookalikes(name: str) -> None:
    first_of: dict[str, int] = {}  # script -> position of its first letter
    previous_is_letter = False
    for index, char in enumerate(name):
        where = f"U+{ord(char):04X} {unicodedata.name(char, '?')} at position {index}"
        if char.isascii():
            previous_is_letter = char.isalpha()
            if previous_is_letter:
                first_of.setdefault("Latin", index)
            continue
        compatible = unicodedata.normalize("NFKC", char)
        if compatible != char:
            raise InvalidQueueName(
                f"queue name {name!r} contains {where}, a compatibility form of "
                f"{compatible!r}; write {compatible!r} instead"
            )
        category = unicodedata.category(char)
        if category.startswith("M"):
            if not previous_is_letter:
                raise InvalidQueueName(
                    f"queue name {name!r} contains {where}, a combining mark on no letter"
                )
            continue
        if not category.startswith("L"):
            raise InvalidQueueName(
                f"queue name {name!r} contains {where}; outside ASCII a queue name may "
                "hold letters only (symbols and digits that look like ASCII ones would "
                "make names that print alike)"
            )
        previous_is_letter = True
        first_of.setdefault(_script(char), index)
    if len(first_of) > 1:
        scripts = ", ".join(f"{script} at position {at}" for script, at in first_of.items())
        raise InvalidQueueName(
            f"queue name {name!r} mixes scripts ({scripts}); letters of one script only, "
            "so that no two queue names print alike"
        )


def _script(letter: str) -> str:
    """The script of a non-ASCII letter, from the first word of its Unicode name."""
    word = unicodedata.name(letter, "UNKNOWN").split()[0]
    if word in _CJK_SCRIPTS:
        return "Han/Kana/Hangul"
    return word.capitalize()

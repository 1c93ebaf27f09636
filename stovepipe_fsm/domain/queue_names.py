"""Queue-name rules.

Queue names travel as NATS subject tokens and KV keys (through a reversible encoding in
the JetStream adapter) and appear inside request ids, so they are validated once, here,
with an error that says exactly what is wrong.
"""

from __future__ import annotations

import unicodedata

MAX_QUEUE_NAME_LENGTH = 200
FORBIDDEN_CHARACTERS = frozenset("*>")


class InvalidQueueName(ValueError):
    """A queue name breaks one of the rules below; the message says which."""


def validate_queue_name(name: object) -> str:
    """Return ``name`` if it is a usable queue name, else raise :class:`InvalidQueueName`.

    Rules: a non-empty string of at most ``MAX_QUEUE_NAME_LENGTH`` characters, without
    whitespace, control characters, or the wildcard characters ``*`` and ``>``, and not
    starting or ending with ``/`` or containing an empty ``//`` segment.
    """
    if not isinstance(name, str):
        raise InvalidQueueName(f"queue name must be a string, got {type(name).__name__}")
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

"""The one reversible encoding of queue names (and other text) into NATS names.

Queue names may hold ``/``, ``.``, ``=``, ``_``, non-ASCII letters ... (see
``domain/queue_names.py``), but they travel as NATS subject tokens and JetStream KV keys:

- a subject token may not contain ``.``, ``*``, ``>`` or whitespace;
- a KV key may hold only ``[-/_=.a-zA-Z0-9]`` and may not start or end with ``.``.

Encoding: characters of the *safe set* ``[A-Za-z0-9-/=]`` (legal in both) are kept, so
common names stay readable (``monorepo/main`` is its own token); every other character is
written as its UTF-8 bytes, each as ``_`` plus two upper-case hex digits (``.`` →
``_2E``, ``_`` → ``_5F``, ``é`` → ``_C3_A9``). Escaping ``_`` itself makes the code
prefix-free, hence injective: two different names never share a token. Decoding accepts
only the canonical form (no needless escapes, no lower-case hex), so ``decode`` and
``encode`` are exact inverses on their ranges.

Stream and consumer *names* are stricter still (no ``/``, and they become file names on
the server), so :func:`encode_name_token` escapes ``/`` too and bounds the length; it is
one-way, used only where nothing needs to read the queue back from the name.
"""

from __future__ import annotations

import hashlib
import re

from ...domain.queue_names import validate_stored_queue_name

ESCAPE = "_"
TOKEN_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-/=")
NAME_SAFE = TOKEN_SAFE - {"/"}
MAX_NAME_TOKEN_LENGTH = 96
_HEX = "0123456789ABCDEF"
_KV_KEY_RE = re.compile(r"^[-/_=.a-zA-Z0-9]+$")
_SUBJECT_TOKEN_FORBIDDEN = frozenset(".*>")
_HASH_MARK = "_H"  # never produced by encode(): 'H' is not a hex digit


class InvalidToken(ValueError):
    """A token is not the canonical encoding of any text."""


def _encode(text: str, safe: frozenset[str]) -> str:
    if safe.issuperset(text):
        return text  # nothing to escape: most names (every key is encoded per read)
    parts: list[str] = []
    for char in text:
        if char in safe:
            parts.append(char)
        else:
            parts.extend(f"{ESCAPE}{byte:02X}" for byte in char.encode("utf-8"))
    return "".join(parts)


def encode_token(text: str) -> str:
    """Encode any non-empty text as a subject token that is also a valid KV key."""
    if not text:
        raise ValueError("cannot encode empty text: a subject token must not be empty")
    return _encode(text, TOKEN_SAFE)


def decode_token(token: str) -> str:
    """Inverse of :func:`encode_token`; :class:`InvalidToken` for anything not canonical."""
    if not token:
        raise InvalidToken("empty token")
    out = bytearray()
    index = 0
    while index < len(token):
        char = token[index]
        if char == ESCAPE:
            digits = token[index + 1 : index + 3]
            if len(digits) != 2 or any(d not in _HEX for d in digits):
                raise InvalidToken(f"token {token!r}: bad escape at position {index}")
            out.append(int(digits, 16))
            index += 3
        elif char in TOKEN_SAFE:
            out.extend(char.encode("ascii"))
            index += 1
        else:
            raise InvalidToken(f"token {token!r}: character {char!r} at position {index}")
    try:
        text = out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidToken(f"token {token!r}: escapes are not UTF-8 ({exc.reason})") from None
    if encode_token(text) != token:
        raise InvalidToken(f"token {token!r} is not canonical; expected {encode_token(text)!r}")
    return text


def encode_queue_token(queue: str) -> str:
    """The subject token / KV key of a queue name (validated first)."""
    return encode_token(validate_stored_queue_name(queue))


def decode_queue_token(token: str) -> str:
    """The queue name a token encodes; :class:`InvalidToken` if it is not a valid one."""
    queue = decode_token(token)
    try:
        return validate_stored_queue_name(queue)
    except ValueError as exc:
        raise InvalidToken(f"token {token!r} decodes to an invalid queue name: {exc}") from None


def encode_name_token(text: str, max_length: int = MAX_NAME_TOKEN_LENGTH) -> str:
    """A stream/consumer-name-safe form of ``text``: readable when short, hashed when long.

    Names become directory names on the server, so they must stay short; a long encoding
    keeps a readable prefix and appends a digest of the full text behind a mark that
    :func:`encode_token` never produces, so a hashed name cannot equal a plain one.
    """
    if not text:
        raise ValueError("cannot encode empty text as a name")
    encoded = _encode(text, NAME_SAFE)
    if len(encoded) <= max_length:
        return encoded
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
    keep = max(0, max_length - len(_HASH_MARK) - len(digest))
    return f"{encoded[:keep]}{_HASH_MARK}{digest}"


def hashed_key(text: str) -> str:
    """A short KV key standing for ``text``; distinct from every :func:`encode_token` result."""
    return f"{_HASH_MARK}{hashlib.sha256(text.encode('utf-8')).hexdigest()}"


def is_subject_token(token: str) -> bool:
    """Whether ``token`` may stand between two dots of a NATS subject."""
    return bool(token) and not any(c in _SUBJECT_TOKEN_FORBIDDEN or c.isspace() for c in token)


def is_kv_key(key: str) -> bool:
    """Whether ``key`` is a legal JetStream KV key (same rule as the nats client's)."""
    return bool(_KV_KEY_RE.match(key)) and not key.startswith(".") and not key.endswith(".")


# -- KV keys of the buckets -----------------------------------------------------------


def queue_key(queue: str) -> str:
    """Key of a queue row (queues bucket) and of its counter (counters bucket)."""
    return encode_queue_token(queue)


def request_key(request_id: str) -> str:
    """Key of a request (requests bucket): the encoded id, ``request/monorepo/main/7`` as is.

    Any non-empty id has a key, so looking up a malformed id is a plain miss, not a crash.
    """
    return encode_token(request_id)


MAX_URI_KEY_PART = 400


def uri_key(queue: str, uri: str) -> str:
    """Key of a (queue, uri) dedup entry: ``<queue token>.<uri token>``.

    ``.`` never occurs inside an encoded token, so the split is unambiguous. A URI whose
    encoding is longer than ``MAX_URI_KEY_PART`` is keyed by its SHA-256 instead (NATS
    subjects have a practical length limit); the entry's value still records the URI.
    """
    if not uri:
        raise ValueError("cannot index an empty uri")
    encoded = encode_token(uri)
    if len(encoded) > MAX_URI_KEY_PART:
        encoded = hashed_key(uri)
    return f"{encode_queue_token(queue)}.{encoded}"

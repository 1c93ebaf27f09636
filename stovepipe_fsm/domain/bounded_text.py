"""Text from outside, cut to a bound before it is stored, published or logged.

A request id or an error message can be as long as whoever wrote it liked (a 600 KB id
arrives as easily as a short one). Records and log lines must stay small whatever they
quote, yet two different long values must stay distinguishable, so a cut value keeps
its head and ends with its length and a digest of the whole.
"""

from __future__ import annotations

import hashlib

#: What a clipped value ends with: ``…[<n> chars, sha256:<16 hex>]`` (at most 50 chars).
_TAIL_RESERVE = 50


def clip(text: str, limit: int = 1024) -> str:
    """``text`` itself when it has at most ``limit`` characters, else its first characters
    followed by its length and the start of its SHA-256 (the result has ``limit`` at most).
    """
    if limit < _TAIL_RESERVE:
        raise ValueError(f"limit must be >= {_TAIL_RESERVE}, got {limit}")
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    tail = f"…[{len(text)} chars, sha256:{digest}]"
    return text[: limit - len(tail)] + tail

"""Queue-name patterns: ``*`` matches any run of characters, nothing else is special.

Queue names can never contain ``*`` (see ``domain/queue_names.py``), so a config key
with a ``*`` in it is unambiguously a pattern and every other character of the pattern
matches itself. ``*`` also matches ``/``: queue names are not paths, and a single rule
is easier to predict than shell-style segment semantics.

Precedence between patterns is by *specificity* = the number of literal (non-``*``)
characters; more literal characters win. Two patterns with the same specificity are only
a problem when some string matches both, which :func:`common_match` decides exactly.
"""

from __future__ import annotations

STAR = "*"


def is_pattern(key: str) -> bool:
    """True when a ``queues:`` key is a pattern rather than an exact queue name."""
    return STAR in key


def specificity(pattern: str) -> int:
    """Number of literal characters: the more a pattern pins down, the higher it ranks."""
    return len(pattern) - pattern.count(STAR)


def glob_match(pattern: str, name: str) -> bool:
    """Whether ``name`` matches ``pattern`` as a whole.

    The classic two-pointer wildcard match: on a mismatch, retry from the most recent
    ``*`` letting it swallow one more character. Only the latest ``*`` needs revisiting
    (an earlier one can never do better), so this runs in O(len(pattern) * len(name))
    worst case, never exponential like a backtracking regex on many stars.
    """
    p = n = 0
    star_p = -1  # index of the last '*' seen in pattern
    star_n = 0  # position in name where that '*' started matching
    while n < len(name):
        if p < len(pattern) and pattern[p] == STAR:
            star_p, star_n = p, n
            p += 1
        elif p < len(pattern) and pattern[p] == name[n]:
            p += 1
            n += 1
        elif star_p >= 0:
            star_n += 1
            p, n = star_p + 1, star_n
        else:
            return False
    while p < len(pattern) and pattern[p] == STAR:
        p += 1
    return p == len(pattern)


def common_match(left: str, right: str) -> str | None:
    """The shortest string matching both patterns (smallest first on equal length), or None.

    Dynamic programming over pairs of positions ``(i, j)`` in the two patterns; the entry
    is the shortest string that takes ``left[i:]`` and ``right[j:]`` to their ends
    together. A ``*`` may step over itself matching nothing, or swallow a character that
    the *other* pattern consumes with a literal. Both stars swallowing the same character
    is never needed: deleting that character from any common match leaves a shorter
    common match. So every character of the answer comes from a literal, which bounds the
    answer by the literal characters of both patterns and keeps the table finite.
    """
    rows, cols = len(left), len(right)
    table: list[list[str | None]] = [[None] * (cols + 1) for _ in range(rows + 1)]
    table[rows][cols] = ""
    for i in range(rows, -1, -1):
        for j in range(cols, -1, -1):
            if i == rows and j == cols:
                continue
            options: list[str] = []
            a = left[i] if i < rows else None
            b = right[j] if j < cols else None
            if a == STAR:
                _add(options, "", table[i + 1][j])
            if b == STAR:
                _add(options, "", table[i][j + 1])
            if a is not None and b is not None:
                if a == STAR and b != STAR:
                    _add(options, b, table[i][j + 1])
                elif a != STAR and b == STAR:
                    _add(options, a, table[i + 1][j])
                elif a == b != STAR:
                    _add(options, a, table[i + 1][j + 1])
            table[i][j] = min(options, key=lambda s: (len(s), s)) if options else None
    return table[0][0]


def _add(options: list[str], prefix: str, rest: str | None) -> None:
    if rest is not None:
        options.append(prefix + rest)


def globs_overlap(left: str, right: str) -> bool:
    """Whether some string matches both patterns."""
    return common_match(left, right) is not None

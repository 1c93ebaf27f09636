"""Queue-name patterns: matching, specificity and the exact overlap decision."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stovepipe_fsm.config.globs import (
    common_match,
    glob_match,
    globs_overlap,
    is_pattern,
    specificity,
)

patterns = st.text(alphabet="ab*", max_size=6)
names = st.text(alphabet="ab", max_size=8)


def regex_match(pattern: str, name: str) -> bool:
    """Independent oracle: the pattern as an anchored regex, '*' being '.*'."""
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, name, re.DOTALL) is not None


def brute_force_overlap(left: str, right: str) -> bool:
    """Try every string over the alphabet up to a length no shortest witness exceeds.

    A shortest common match never has a character swallowed by both stars (dropping
    it keeps both matches), so each of its characters is a literal of one pattern.
    """
    bound = specificity(left) + specificity(right) + 1
    for length in range(bound + 1):
        for chars in itertools.product("ab", repeat=length):
            candidate = "".join(chars)
            if regex_match(left, candidate) and regex_match(right, candidate):
                return True
    return False


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("mobile/*", "mobile/ios", True),
        ("mobile/*", "mobile/ios/release", True),  # '*' crosses '/'
        ("mobile/*", "mobile/", True),
        ("mobile/*", "mobile", False),
        ("mobile/*", "xmobile/ios", False),
        ("*/main", "monorepo/main", True),
        ("*/main", "monorepo/main2", False),
        ("a*b*c", "aXXbYYc", True),
        ("a*b*c", "acb", False),
        ("*", "", True),
        ("", "", True),
        ("", "a", False),
        ("exact", "exact", True),
    ],
)
def test_glob_match_examples(pattern: str, name: str, expected: bool) -> None:
    assert glob_match(pattern, name) is expected


@given(patterns, names)
def test_glob_match_agrees_with_regex(pattern: str, name: str) -> None:
    assert glob_match(pattern, name) == regex_match(pattern, name)


def test_glob_match_many_stars_is_fast() -> None:
    # A backtracking regex takes exponential time here; the matcher is polynomial.
    pattern = "*a" * 30 + "*b"
    assert glob_match(pattern, "a" * 200) is False


@pytest.mark.parametrize(
    ("key", "pattern", "rank"),
    [("monorepo/main", False, 13), ("mobile/*", True, 7), ("*", True, 0), ("a*b*", True, 2)],
)
def test_is_pattern_and_specificity(key: str, pattern: bool, rank: int) -> None:
    assert is_pattern(key) is pattern
    assert specificity(key) == rank


@pytest.mark.parametrize(
    ("left", "right", "witness"),
    [
        ("a/*", "b/*", None),
        ("*/x", "*/y", None),
        ("mobile/*", "*/ios", "mobile/ios"),
        ("a*", "*a", "a"),
        ("*", "anything*", "anything"),
        ("a*b", "a*c", None),
        ("ab*", "*ba", "aba"),
    ],
)
def test_common_match_examples(left: str, right: str, witness: str | None) -> None:
    assert common_match(left, right) == witness
    assert common_match(right, left) == witness


@settings(max_examples=300, deadline=None)
@given(patterns, patterns)
def test_overlap_agrees_with_brute_force(left: str, right: str) -> None:
    assert globs_overlap(left, right) == brute_force_overlap(left, right)


@given(patterns, patterns)
def test_witness_matches_both_and_is_shortest(left: str, right: str) -> None:
    witness = common_match(left, right)
    if witness is None:
        return
    assert glob_match(left, witness)
    assert glob_match(right, witness)
    shorter = (
        "".join(chars)
        for length in range(len(witness))
        for chars in itertools.product("ab", repeat=length)
    )
    assert not any(glob_match(left, s) and glob_match(right, s) for s in shorter)


@given(patterns, patterns)
def test_overlap_is_symmetric(left: str, right: str) -> None:
    assert globs_overlap(left, right) == globs_overlap(right, left)

"""IAM's `*` and `?` wildcards, checked against a reference matcher and by properties (hypothesis)."""

from __future__ import annotations

from functools import cache

from hypothesis import given
from hypothesis import strategies as st

from servestack.local.iam.wildcards import arn_matches, compile_arn_pattern, wildcard_match

# Characters that mean something to regular expressions or to ARNs, to catch any leak of regex syntax.
ALPHABET = st.sampled_from(list("ab.:/[]()+^$|\\{}-Zz0"))
TEXT = st.text(ALPHABET, max_size=12)
PATTERN = st.text(st.one_of(ALPHABET, st.sampled_from(["*", "?"])), max_size=10)


def reference_match(pattern: str, value: str) -> bool:
    """The textbook dynamic programme: `*` eats any run, `?` exactly one character, the rest itself."""

    @cache
    def match(p: int, v: int) -> bool:
        if p == len(pattern):
            return v == len(value)
        if pattern[p] == "*":
            return match(p + 1, v) or (v < len(value) and match(p, v + 1))
        if v < len(value) and (pattern[p] == "?" or pattern[p] == value[v]):
            return match(p + 1, v + 1)
        return False

    return match(0, 0)


@given(PATTERN, TEXT)
def test_matcher_agrees_with_the_reference(pattern: str, value: str) -> None:
    # GIVEN any pattern and value over regex-special characters / WHEN matched / THEN as the reference says
    assert wildcard_match(pattern, value) is reference_match(pattern, value)


@given(TEXT)
def test_a_pattern_without_wildcards_matches_only_itself(value: str) -> None:
    # GIVEN a literal pattern / THEN it matches itself and not itself plus one character
    assert wildcard_match(value, value)
    assert not wildcard_match(value, value + "a")


@given(TEXT)
def test_star_matches_everything(value: str) -> None:
    assert wildcard_match("*", value)


@given(TEXT, st.data())
def test_replacing_characters_with_question_marks_still_matches(value: str, data: st.DataObject) -> None:
    # GIVEN a value and some of its positions / WHEN those characters become `?` / THEN the pattern matches
    positions = data.draw(st.sets(st.integers(0, max(0, len(value) - 1))))
    pattern = "".join("?" if index in positions else char for index, char in enumerate(value))
    assert wildcard_match(pattern, value)
    # ... and never a value of another length
    assert not wildcard_match(pattern, value + "z")


@given(TEXT, st.data())
def test_inserting_a_star_anywhere_still_matches(value: str, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(value)))
    assert wildcard_match(value[:cut] + "*" + value[cut:], value)


@given(st.text(st.sampled_from(list("abcXYZ:*")), max_size=10), st.text(st.sampled_from(list("abcXYZ:")), max_size=10))
def test_actions_match_case_insensitively_arns_case_sensitively(pattern: str, value: str) -> None:
    # GIVEN a pattern and a value / WHEN both are compared with the case swapped on one side
    insensitive = wildcard_match(pattern.swapcase(), value, case_sensitive=False)
    # THEN case-insensitive matching ignores the swap, case-sensitive matching follows the reference
    assert insensitive is reference_match(pattern.lower(), value.lower())
    assert wildcard_match(pattern.swapcase(), value) is reference_match(pattern.swapcase(), value)


def test_arn_like_matches_segment_by_segment() -> None:
    # GIVEN ArnLike's rule: each of the six segments on its own
    compiled = compile_arn_pattern("arn:aws:s3:::bucket-*")
    assert compiled is not None
    # THEN a * stays inside its segment, and the sixth segment keeps its colons
    assert arn_matches(compiled, "arn:aws:s3:::bucket-one")
    assert arn_matches(compiled, "arn:aws:s3:::bucket-a:b")
    assert not arn_matches(compiled, "arn:aws:sqs:::bucket-one")
    region_star = compile_arn_pattern("arn:aws:sqs:us-*:123456789012:queue")
    assert region_star is not None
    assert arn_matches(region_star, "arn:aws:sqs:us-east-1:123456789012:queue")
    # a * in the region cannot run into the next segment, as a plain wildcard would
    sneaky = "arn:aws:sqs:us-east-1:1:123456789012:queue"
    assert wildcard_match("arn:aws:sqs:us-*:123456789012:queue", sneaky)
    assert not arn_matches(region_star, sneaky)
    assert compile_arn_pattern("not-an-arn") is None

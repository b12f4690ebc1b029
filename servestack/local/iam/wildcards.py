"""IAM's two wildcards, `*` (any run of characters, including none) and `?` (exactly one character).

Policies use them in `Action` (case-insensitive: `s3:get*` matches `s3:GetObject`), in `Resource` and in
the `...Like` condition operators (case-sensitive). Nothing else in a pattern is special: a `.` or a `[` is
itself. Patterns are compiled once, when a policy is loaded, into one anchored regular expression per
policy element (its values joined as alternatives), so a request costs one `fullmatch` per element.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def glob_to_regex(pattern: str) -> str:
    """The regular-expression source (unanchored) that matches what the IAM pattern matches."""
    parts: list[str] = []
    for char in pattern:
        if char == "*":
            parts.append(".*")
        elif char == "?":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return "".join(parts)


def compile_globs(patterns: Iterable[str], *, case_sensitive: bool) -> re.Pattern[str]:
    """One expression matching a value when any of `patterns` matches all of it (use `fullmatch`)."""
    alternatives = "|".join(f"(?:{glob_to_regex(pattern)})" for pattern in patterns)
    flags = re.DOTALL | (0 if case_sensitive else re.IGNORECASE)
    return re.compile(alternatives, flags)


def wildcard_match(pattern: str, value: str, *, case_sensitive: bool = True) -> bool:
    """Whether `value` matches the IAM pattern (for one-off checks; policies use `compile_globs`)."""
    return compile_globs([pattern], case_sensitive=case_sensitive).fullmatch(value) is not None


ARN_SEGMENTS = 6  # arn:partition:service:region:account:resource


def compile_arn_pattern(pattern: str) -> tuple[re.Pattern[str], ...] | None:
    """`ArnLike`/`ArnEquals`: each of the six colon-separated segments is matched on its own, so a `*` in
    the region cannot run into the account (IAM User Guide, "Amazon Resource Name (ARN) condition
    operators"). The sixth segment (the resource) keeps its own colons. None: not an ARN pattern."""
    segments = pattern.split(":", ARN_SEGMENTS - 1)
    if len(segments) != ARN_SEGMENTS:
        return None
    return tuple(compile_globs([segment], case_sensitive=True) for segment in segments)


def arn_matches(compiled: tuple[re.Pattern[str], ...], value: str) -> bool:
    segments = value.split(":", ARN_SEGMENTS - 1)
    if len(segments) != ARN_SEGMENTS:
        return False
    return all(part.fullmatch(segment) is not None for part, segment in zip(compiled, segments, strict=True))

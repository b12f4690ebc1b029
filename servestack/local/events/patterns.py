"""EventBridge event patterns, matched as EventBridge matches them
(https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-event-patterns.html and its comparison operators,
https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-create-pattern-operators.html):

- a pattern is an object; each of its fields must match the event's field of that name (fields the pattern does
  not name are ignored), a nested object matching a nested object;
- a field's pattern is an array of values, matched when the event's value is any of them. Where the event's
  value is an array (or the field is inside an array of objects, as each container's `exitCode` of an ECS task
  event), it matches when any of its values does;
- a value is a literal (string, number, boolean, null; numbers compare as numbers) or one operator object:
  `prefix`, `suffix`, `anything-but` (a literal, a list of them, or a `prefix`/`suffix`), `exists`, `numeric`,
  `equals-ignore-case`, `wildcard`;
- `$or` is a list of patterns, any of which must match alongside the object's other fields.

An operator this module does not know raises PatternError: a rule local mode cannot read faithfully is reported,
never matched by guess.
"""

from __future__ import annotations

import fnmatch
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any

_NUMERIC: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, "=": operator.eq, ">=": operator.ge, ">": operator.gt,
}  # fmt: skip
_TEXT: dict[str, Callable[[str, str], bool]] = {
    "prefix": str.startswith,
    "suffix": str.endswith,
    "equals-ignore-case": lambda value, text: value.lower() == text.lower(),
    "wildcard": lambda value, text: fnmatch.fnmatchcase(value, text),
}


class PatternError(ValueError):
    """An event pattern local mode does not read (an operator it does not know, a field that is not an array)."""


def matches(pattern: Mapping[str, Any], event: Any) -> bool:
    """Whether `event` (an event, or a part of one) matches `pattern`; PatternError for a pattern not read here."""
    for key, expected in pattern.items():
        if key == "$or":
            if not isinstance(expected, list) or not expected:
                raise PatternError(f"$or: {expected!r} is not a list of patterns")
            if not any(matches(alternative, event) for alternative in expected):
                return False
            continue
        values = list(_values(event, key))
        if isinstance(expected, Mapping):
            if not any(isinstance(value, Mapping) and matches(expected, value) for value in values):
                return False
        elif isinstance(expected, list):
            if not any(_one(item, values) for item in expected):
                return False
        else:
            raise PatternError(f"{key}: {expected!r} is neither an array of values nor a nested pattern")
    return True


def check(pattern: Mapping[str, Any]) -> None:
    """Raise PatternError when the pattern uses what `matches` does not read (checked once, at read time)."""
    for key, expected in pattern.items():
        if key == "$or":
            if not isinstance(expected, list) or not expected:
                raise PatternError(f"$or: {expected!r} is not a list of patterns")
            for alternative in expected:
                check(alternative)
        elif isinstance(expected, Mapping):
            check(expected)
        elif isinstance(expected, list):
            for item in expected:
                _one(item, [])
        else:
            raise PatternError(f"{key}: {expected!r} is neither an array of values nor a nested pattern")


def _values(event: Any, key: str) -> Iterator[Any]:
    """The event's values of `key`: one, or each item of an array, or each item's own when `event` is an array of
    objects; nothing when the field is absent."""
    if isinstance(event, list):
        for item in event:
            yield from _values(item, key)
        return
    if not isinstance(event, Mapping) or key not in event:
        return
    value = event[key]
    if isinstance(value, list):
        yield from value
    else:
        yield value


def _one(item: Any, values: list[Any]) -> bool:
    """Whether one value of a field's pattern matches any of the event's values of that field."""
    if not isinstance(item, Mapping):
        return any(_equal(item, value) for value in values)
    if len(item) != 1:
        raise PatternError(f"{item!r}: an operator object holds one operator")
    ((name, argument),) = item.items()
    if name == "exists":
        return bool(values) == bool(argument)
    if name in _TEXT:  # the argument is checked before any value, so that `check` refuses a bad one
        text, compare = _text(name, argument), _TEXT[name]
        return any(isinstance(v, str) and compare(v, text) for v in values)
    if name == "numeric":
        bounds = _bounds(argument)
        return any(_within(bounds, v) for v in values)
    if name == "anything-but":  # a field that is absent is not "anything but": it does not match
        excluded = argument if isinstance(argument, list) else [argument]
        for one in excluded:
            if isinstance(one, Mapping) and set(one) - {"prefix", "suffix"}:
                raise PatternError(f"anything-but: {one!r}: only literals, a prefix or a suffix")
        return any(not any(_one(one, [v]) for one in excluded) for v in values)
    raise PatternError(f"{name}: an operator local mode does not match (it reads {_KNOWN})")


_KNOWN = "prefix, suffix, anything-but, exists, numeric, equals-ignore-case, wildcard and $or"


def _equal(expected: Any, value: Any) -> bool:
    if isinstance(expected, bool) or isinstance(value, bool):
        return expected is value
    if isinstance(expected, int | float) and isinstance(value, int | float):
        return float(expected) == float(value)
    return bool(expected == value)


def _text(name: str, argument: Any) -> str:
    if not isinstance(argument, str):
        raise PatternError(f"{name}: {argument!r} is not a string")
    return argument


def _bounds(argument: Any) -> list[tuple[Callable[[float, float], bool], float]]:
    if not isinstance(argument, list) or not argument or len(argument) % 2:
        raise PatternError(f"numeric: {argument!r} is not pairs of a comparison and a number")
    bounds = []
    for comparison, bound in zip(argument[::2], argument[1::2], strict=True):
        if comparison not in _NUMERIC or isinstance(bound, bool) or not isinstance(bound, int | float):
            raise PatternError(f"numeric: {comparison!r} {bound!r} is not a comparison and a number")
        bounds.append((_NUMERIC[comparison], float(bound)))
    return bounds


def _within(bounds: list[tuple[Callable[[float, float], bool], float]], value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return all(compare(float(value), bound) for compare, bound in bounds)

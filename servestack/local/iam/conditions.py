"""The `Condition` element: operators, `...IfExists`, `ForAnyValue:` / `ForAllValues:`, and how they combine.

Rules (IAM User Guide, "Condition operators" and "Conditions with multiple context keys or values"):
- operators in one block, and keys under one operator, are ANDed; the values of one key are ORed; for a
  negated operator (`StringNotEquals`, `ArnNotLike`, ...) they are NORed (the request value may match none);
- a key absent from the request context makes a condition false, except that a negated operator is then
  true, `...IfExists` is then true, `ForAllValues:` is then true and `Null` tests exactly that absence;
- `ForAnyValue:` is true when at least one request value passes, `ForAllValues:` when every one does
  (an empty set passes); without a set prefix a multi-valued key passes when any value does.
Condition key names are case-insensitive; values are compared as each operator says.

Every operator value is parsed when the policy is loaded: a number that is not a number, a date that is not
a date or an unknown operator raises `PolicyError` then, as IAM refuses such a policy when it is created.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from servestack.inference.errors import ConfigurationError
from servestack.local.iam.wildcards import arn_matches, compile_arn_pattern, compile_globs

# The request context: condition key (lower-cased) -> its values (one for a single-valued key).
Context = Mapping[str, tuple[str, ...]]


class PolicyError(ConfigurationError):
    """A policy IAM would refuse at create time: malformed JSON, unknown element or operator, bad value."""

    error_type = "PolicyError"


Matcher = Callable[[str], bool]


def _string(value: str) -> Matcher:
    return lambda actual: actual == value


def _string_ignore_case(value: str) -> Matcher:
    folded = value.casefold()
    return lambda actual: actual.casefold() == folded


def _string_like(value: str) -> Matcher:
    pattern = compile_globs([value], case_sensitive=True)
    return lambda actual: pattern.fullmatch(actual) is not None


def _parse_number(text: str) -> Decimal | None:
    try:
        number = Decimal(text.strip())
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def _numeric(compare: Callable[[Decimal, Decimal], bool]) -> Callable[[str], Matcher]:
    def prepare(value: str) -> Matcher:
        expected = _parse_number(value)
        if expected is None:
            raise ValueError(f"{value!r} is not a number")

        def match(actual: str) -> bool:
            number = _parse_number(actual)
            return number is not None and compare(number, expected)

        return match

    return prepare


ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(?:[Tt ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:[Zz]|[+-]\d{2}:?\d{2})?$")


def parse_date(text: str) -> datetime | None:
    """ISO 8601 (`2026-11-30`, `2026-11-30T12:00:00Z`, with an offset) or epoch seconds, as IAM accepts."""
    text = text.strip()
    if re.fullmatch(r"-?\d+(?:\.\d+)?", text):
        try:
            return datetime.fromtimestamp(float(text), tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
    if not ISO_DATE.match(text):
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _date(compare: Callable[[datetime, datetime], bool]) -> Callable[[str], Matcher]:
    def prepare(value: str) -> Matcher:
        expected = parse_date(value)
        if expected is None:
            raise ValueError(f"{value!r} is not an ISO 8601 date or epoch seconds")

        def match(actual: str) -> bool:
            moment = parse_date(actual)
            return moment is not None and compare(moment, expected)

        return match

    return prepare


def _bool(value: str) -> Matcher:
    expected = value.strip().lower()
    if expected not in ("true", "false"):
        raise ValueError(f"{value!r} is not true or false")
    return lambda actual: actual.strip().lower() == expected


def _binary(value: str) -> Matcher:
    try:
        expected = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ValueError(f"{value!r} is not base64") from error

    def match(actual: str) -> bool:
        try:
            return base64.b64decode(actual, validate=True) == expected
        except (binascii.Error, ValueError):
            return False

    return match


def _ip(value: str) -> Matcher:
    try:
        network = ipaddress.ip_network(value.strip(), strict=False)
    except ValueError as error:
        raise ValueError(f"{value!r} is not an IP address or CIDR range") from error

    def match(actual: str) -> bool:
        try:
            return ipaddress.ip_address(actual.strip()) in network
        except ValueError:
            return False

    return match


def _arn(value: str) -> Matcher:
    compiled = compile_arn_pattern(value)
    if compiled is None:
        # IAM accepts the policy; such a value simply never matches an ARN.
        return lambda actual: False
    return lambda actual: arn_matches(compiled, actual)


@dataclass(frozen=True)
class OperatorKind:
    prepare: Callable[[str], Matcher]
    negated: bool = False


OPERATORS: dict[str, OperatorKind] = {
    "StringEquals": OperatorKind(_string),
    "StringNotEquals": OperatorKind(_string, negated=True),
    "StringEqualsIgnoreCase": OperatorKind(_string_ignore_case),
    "StringNotEqualsIgnoreCase": OperatorKind(_string_ignore_case, negated=True),
    "StringLike": OperatorKind(_string_like),
    "StringNotLike": OperatorKind(_string_like, negated=True),
    "NumericEquals": OperatorKind(_numeric(lambda a, b: a == b)),
    "NumericNotEquals": OperatorKind(_numeric(lambda a, b: a == b), negated=True),
    "NumericLessThan": OperatorKind(_numeric(lambda a, b: a < b)),
    "NumericLessThanEquals": OperatorKind(_numeric(lambda a, b: a <= b)),
    "NumericGreaterThan": OperatorKind(_numeric(lambda a, b: a > b)),
    "NumericGreaterThanEquals": OperatorKind(_numeric(lambda a, b: a >= b)),
    "DateEquals": OperatorKind(_date(lambda a, b: a == b)),
    "DateNotEquals": OperatorKind(_date(lambda a, b: a == b), negated=True),
    "DateLessThan": OperatorKind(_date(lambda a, b: a < b)),
    "DateLessThanEquals": OperatorKind(_date(lambda a, b: a <= b)),
    "DateGreaterThan": OperatorKind(_date(lambda a, b: a > b)),
    "DateGreaterThanEquals": OperatorKind(_date(lambda a, b: a >= b)),
    "Bool": OperatorKind(_bool),
    "BinaryEquals": OperatorKind(_binary),
    "IpAddress": OperatorKind(_ip),
    "NotIpAddress": OperatorKind(_ip, negated=True),
    "ArnEquals": OperatorKind(_arn),
    "ArnLike": OperatorKind(_arn),
    "ArnNotEquals": OperatorKind(_arn, negated=True),
    "ArnNotLike": OperatorKind(_arn, negated=True),
}
NULL = "Null"
SET_PREFIXES = ("ForAnyValue:", "ForAllValues:")
IF_EXISTS = "IfExists"


def allowed_operators() -> str:
    names = [*OPERATORS, NULL]
    return ", ".join(names) + f" (each but Null also with the {IF_EXISTS} suffix and a {'/'.join(SET_PREFIXES)} prefix)"


def condition_value(value: Any, *, where: str, operator: str) -> str:
    """A policy's condition value as the string IAM compares (`true` for JSON true, `5` for 5)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise PolicyError(
        f"{where}: the value of {operator} must be a string, number or boolean, or a list of them",
        field=where,
        value=value,
        allowed="string, number, boolean",
    )


@dataclass(frozen=True)
class ConditionTest:
    """One `operator: {key: values}` pair of a statement's `Condition`, compiled."""

    operator: str  # as written in the policy
    key: str  # lower-cased
    set_prefix: str | None
    if_exists: bool
    negated: bool
    matchers: tuple[Matcher, ...]
    null_expected: frozenset[bool] | None = None  # Null's values: true = "the key is absent"

    def holds(self, context: Context) -> bool:
        values = context.get(self.key)
        present = values is not None and len(values) > 0
        if self.null_expected is not None:
            return (not present) in self.null_expected
        if values is None:
            if self.if_exists or self.set_prefix == "ForAllValues:":
                return True
            if self.set_prefix == "ForAnyValue:":
                return False
            return self.negated
        if self.set_prefix == "ForAllValues:":
            return all(self._passes(value) for value in values)
        if not values:  # an empty set: ForAnyValue finds nothing; a plain operator has nothing to compare
            return self.set_prefix is None and self.negated
        if self.set_prefix == "ForAnyValue:":
            return any(self._passes(value) for value in values)
        if self.negated:  # a multi-valued key without a set prefix: no value may match
            return all(self._passes(value) for value in values)
        return any(self._passes(value) for value in values)

    def _passes(self, value: str) -> bool:
        matched = any(matcher(value) for matcher in self.matchers)
        return not matched if self.negated else matched


def compile_condition_block(block: Any, *, where: str) -> tuple[ConditionTest, ...]:
    if not isinstance(block, Mapping) or not block:
        raise PolicyError(
            f"{where}: Condition must be an object of operator -> {{key: value(s)}}",
            field=f"{where}.Condition",
            value=block,
            allowed="a non-empty JSON object",
        )
    tests: list[ConditionTest] = []
    for operator, keys in block.items():
        tests.extend(_compile_operator(str(operator), keys, where=where))
    return tuple(tests)


def _compile_operator(operator: str, keys: Any, *, where: str) -> list[ConditionTest]:
    set_prefix = next((prefix for prefix in SET_PREFIXES if operator.startswith(prefix)), None)
    base = operator[len(set_prefix) :] if set_prefix else operator
    if_exists = base.endswith(IF_EXISTS) and base != IF_EXISTS
    if if_exists:
        base = base[: -len(IF_EXISTS)]
    kind = OPERATORS.get(base)
    if (kind is None and base != NULL) or (base == NULL and (if_exists or set_prefix)):
        raise PolicyError(
            f"{where}: unknown condition operator {operator!r}",
            field=f"{where}.Condition",
            value=operator,
            allowed=allowed_operators(),
        )
    if not isinstance(keys, Mapping) or not keys:
        raise PolicyError(
            f"{where}: {operator} must map condition keys to values",
            field=f"{where}.Condition.{operator}",
            value=keys,
            allowed="a non-empty JSON object",
        )
    tests = []
    for key, raw in keys.items():
        raw_values = raw if isinstance(raw, list) else [raw]
        if not raw_values:
            raise PolicyError(
                f"{where}: {operator} {key} has no values",
                field=f"{where}.Condition.{operator}.{key}",
                value=raw,
                allowed="one value or a non-empty list",
            )
        values = [
            condition_value(value, where=f"{where}.Condition.{operator}.{key}", operator=operator)
            for value in raw_values
        ]
        if base == NULL:
            expected = {_null_value(value, where=where, key=str(key)) for value in values}
            # Null with both "true" and "false" is ORed into "always true".
            tests.append(
                ConditionTest(operator, str(key).lower(), None, False, False, (), null_expected=frozenset(expected))
            )
            continue
        assert kind is not None
        try:
            matchers = tuple(kind.prepare(value) for value in values)
        except ValueError as error:
            raise PolicyError(
                f"{where}: {operator} {key}: {error}",
                field=f"{where}.Condition.{operator}.{key}",
                value=raw,
                allowed=f"values {base} can compare",
            ) from error
        tests.append(ConditionTest(operator, str(key).lower(), set_prefix, if_exists, kind.negated, matchers))
    return tests


def _null_value(value: str, *, where: str, key: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise PolicyError(
            f"{where}: Null {key} must be true or false",
            field=f"{where}.Condition.Null.{key}",
            value=value,
            allowed="true, false",
        )
    return lowered == "true"


def normalise_context(context: Mapping[str, str | Sequence[str]] | None) -> dict[str, tuple[str, ...]]:
    """Request context keys lower-cased, each value a tuple of strings."""
    if not context:
        return {}
    normalised: dict[str, tuple[str, ...]] = {}
    for key, value in context.items():
        normalised[key.lower()] = (value,) if isinstance(value, str) else tuple(value)
    return normalised

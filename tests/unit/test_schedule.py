"""EventBridge schedule expressions: parsing, errors and next fire times."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from servestack.local.scheduler.expressions import ScheduleError, parse_schedule

T0 = datetime(2026, 11, 30, 12, 34, 56, tzinfo=UTC)  # a Monday


@pytest.mark.parametrize(
    ("expression", "timezone", "expected"),
    [
        ("cron(0 2 * * ? *)", "UTC", "2026-12-01T02:00:00+00:00"),
        ("cron(0 2 * * ? *)", "Europe/Paris", "2026-12-01T02:00:00+01:00"),
        ("cron(*/15 * * * ? *)", "UTC", "2026-11-30T12:45:00+00:00"),
        ("cron(0 9 ? * MON-FRI *)", "UTC", "2026-12-01T09:00:00+00:00"),
        ("cron(0 9 ? * 2 *)", "UTC", "2026-12-07T09:00:00+00:00"),  # 2 = Monday in AWS numbering
        ("cron(0 0 L * ? *)", "UTC", "2026-12-31T00:00:00+00:00"),
        ("cron(30 8 ? * MON#1 *)", "UTC", "2026-12-07T08:30:00+00:00"),
        ("cron(0 12 1 JAN ? 2027)", "UTC", "2027-01-01T12:00:00+00:00"),
        ("rate(5 minutes)", "UTC", "2026-11-30T12:39:56+00:00"),
        ("rate(1 day)", "UTC", "2026-12-01T12:34:56+00:00"),
    ],
)
def test_next_fire_time(expression: str, timezone: str, expected: str) -> None:
    # GIVEN a schedule / WHEN asked for the next fire after T0 / THEN it is the expected instant
    fire = parse_schedule(expression, timezone).next_after(T0)
    assert fire == datetime.fromisoformat(expected)
    assert fire > T0


def test_last_day_of_month_fires_on_the_day_itself_before_the_time() -> None:
    before = datetime(2026, 11, 29, 23, 59, 30, tzinfo=UTC)
    assert parse_schedule("cron(0 0 L * ? *)").next_after(before) == datetime(2026, 11, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("cron(0 2 * * * *)", "exactly one of day-of-month"),
        ("cron(0 2 ? * ? *)", "exactly one of day-of-month"),
        ("cron(0 24 * * ? *)", "hours: 24 is not in 0..23"),
        ("cron(0 2 * FOO ? *)", "month: 'FOO' is not 1-12 or JAN/"),
        ("cron(0 2 * * ?)", "is not 'cron(<6 fields>)'"),
        ("rate(1 minutes)", "rate: 1 'minutes' is not allowed"),
        ("rate(5 minute)", "rate: 5 'minute' is not allowed"),
        ("every day", "is not 'cron(<6 fields>)' or 'rate("),
    ],
)
def test_bad_expressions_name_the_field(expression: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        parse_schedule(expression)

"""EventBridge schedule expressions: `cron(min hour day-of-month month day-of-week year)` and `rate(n unit)`.

AWS's cron has six fields; one of day-of-month / day-of-week must be `?`. Supported: `*`, `?`, lists `,`,
ranges `-`, steps `/`, month names JAN-DEC, weekday names SUN-SAT (1 = SUN ... 7 = SAT), `L` (last day of
the month) in day-of-month, and `#` (nth weekday, e.g. `MON#1`) in day-of-week. Times are evaluated in the
schedule's time zone, as EventBridge Scheduler does.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

MONTHS = {
    name: i
    for i, name in enumerate(["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"], 1)
}
WEEKDAYS = {name: i for i, name in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"], 1)}
RATE = re.compile(r"^rate\((\d+) (minute|minutes|hour|hours|day|days)\)$")
CRON = re.compile(r"^cron\((\S+) (\S+) (\S+) (\S+) (\S+) (\S+)\)$")
UNITS = {"minute": 60, "hour": 3600, "day": 86_400}


class ScheduleError(ValueError):
    """The expression is not one EventBridge accepts; the message names the field and what is allowed."""


def _values(text: str, field: str, lo: int, hi: int, names: dict[str, int] | None = None) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        step = 1
        if "/" in part:
            part, step_text = part.split("/", 1)
            if not step_text.isdigit() or int(step_text) < 1:
                raise ScheduleError(f"{field}: step {step_text!r} is not a positive integer")
            step = int(step_text)
        if part in ("*", "?"):
            start, stop = lo, hi
        elif "-" in part:
            a, b = part.split("-", 1)
            start, stop = _one(a, field, lo, hi, names), _one(b, field, lo, hi, names)
        else:
            start = _one(part, field, lo, hi, names)
            stop = hi if step > 1 else start
        if start > stop:
            raise ScheduleError(f"{field}: range {part!r} runs backwards")
        out.update(range(start, stop + 1, step))
    return frozenset(out)


def _one(text: str, field: str, lo: int, hi: int, names: dict[str, int] | None) -> int:
    value = names.get(text.upper()) if names else None
    if value is None:
        if not text.isdigit():
            allowed = f"{lo}-{hi}" + (f" or {'/'.join(names)}" if names else "")
            raise ScheduleError(f"{field}: {text!r} is not {allowed}")
        value = int(text)
    if not lo <= value <= hi:
        raise ScheduleError(f"{field}: {value} is not in {lo}..{hi}")
    return value


@dataclass(frozen=True)
class Cron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int] | None  # None: day-of-month is `?`
    last_day: bool
    months: frozenset[int]
    weekdays: frozenset[int] | None  # None: day-of-week is `?`; AWS numbering 1 = Sunday
    nth_weekday: tuple[int, int] | None
    years: frozenset[int]

    def day_matches(self, day: datetime) -> bool:
        if day.month not in self.months or day.year not in self.years:
            return False
        aws_weekday = (day.isoweekday() % 7) + 1  # Monday (1) -> 2 ... Sunday (7) -> 1
        if self.nth_weekday is not None:
            weekday, nth = self.nth_weekday
            return aws_weekday == weekday and (day.day - 1) // 7 + 1 == nth
        if self.weekdays is not None:
            return aws_weekday in self.weekdays
        if self.last_day:
            return day.day == calendar.monthrange(day.year, day.month)[1]
        return self.days is None or day.day in self.days


@dataclass(frozen=True)
class Schedule:
    expression: str
    timezone: str = "UTC"
    cron: Cron | None = None
    every_sec: int | None = None

    def next_after(self, moment: datetime) -> datetime:
        """The first fire time strictly after `moment` (an aware datetime), in the schedule's zone."""
        zone = ZoneInfo(self.timezone)
        local = moment.astimezone(zone)
        if self.every_sec is not None:
            return local + timedelta(seconds=self.every_sec)
        cron = self.cron
        assert cron is not None
        start = (local + timedelta(minutes=1)).replace(second=0, microsecond=0)
        day = start.replace(hour=0, minute=0)
        for _ in range(366 * 8):
            if cron.day_matches(day):
                for hour in sorted(cron.hours):
                    for minute in sorted(cron.minutes):
                        candidate = day.replace(hour=hour, minute=minute)
                        if candidate >= start:
                            return candidate
            day = (day + timedelta(days=1)).replace(hour=0, minute=0)
        raise ScheduleError(f"{self.expression}: never fires in the next 8 years")


def parse_schedule(expression: str, timezone: str = "UTC") -> Schedule:
    """Parse `cron(...)` or `rate(...)`; raise `ScheduleError` naming the bad field."""
    ZoneInfo(timezone)
    rate = RATE.match(expression.strip())
    if rate:
        n, unit = int(rate.group(1)), rate.group(2)
        if n < 1:
            raise ScheduleError(f"rate: {n} is not a positive number")
        if (n == 1) != (not unit.endswith("s")):
            raise ScheduleError(f"rate: {n} {unit!r} is not allowed (AWS wants '1 {unit.rstrip('s')}', '{n} ...s')")
        return Schedule(expression, timezone, every_sec=n * UNITS[unit.rstrip("s")])
    cron = CRON.match(expression.strip())
    if not cron:
        raise ScheduleError(f"{expression!r} is not 'cron(<6 fields>)' or 'rate(<n> minute(s)|hour(s)|day(s))'")
    minute, hour, dom, month, dow, year = cron.groups()
    if (dom == "?") == (dow == "?"):
        raise ScheduleError(f"{expression}: exactly one of day-of-month ({dom}) and day-of-week ({dow}) must be '?'")
    nth: tuple[int, int] | None = None
    weekdays: frozenset[int] | None = None
    if dow != "?":
        if "#" in dow:
            name, _, count = dow.partition("#")
            nth = (_one(name, "day-of-week", 1, 7, WEEKDAYS), _one(count, "day-of-week #", 1, 5, None))
        else:
            weekdays = _values(dow, "day-of-week", 1, 7, WEEKDAYS)
    last_day = dom == "L"
    days = None if dom in ("?", "L") else _values(dom, "day-of-month", 1, 31)
    return Schedule(
        expression,
        timezone,
        cron=Cron(
            minutes=_values(minute, "minutes", 0, 59),
            hours=_values(hour, "hours", 0, 23),
            days=days,
            last_day=last_day,
            months=_values(month, "month", 1, 12, MONTHS),
            weekdays=weekdays,
            nth_weekday=nth,
            years=_values(year, "year", 1970, 2199),
        ),
    )

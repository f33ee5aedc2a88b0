"""Cron expressions as Cron Triggers read them: when a schedule fires next.

Lives here: ``CronSchedule`` (five fields, minute hour day-of-month month
day-of-week, in UTC: numbers, ``*``, ranges, steps and lists; days of the
week 0 to 7, both 0 and 7 Sunday) and ``next_after(ms)``. Must not know:
the runtime that fires it.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
_SEARCH_DAYS = 366 * 5  #: next_after raises for a schedule that never fires in five years (30 February)


def _values(text: str, what: str, low: int, high: int) -> frozenset[int]:
    found: set[int] = set()
    for part in text.split(","):
        span, _, step_text = part.partition("/")
        step = _number(step_text, what) if step_text else 1
        if span == "*":
            first, last = low, high
        elif "-" in span:
            first, last = (_number(n, what) for n in span.split("-", 1))
        else:
            first = last = _number(span, what)
            if step_text:
                last = high  # "5/15": from 5, every 15
        if not low <= first <= last <= high or step < 1:
            raise ValueError(f"cron {what} {part!r} is not within {low}-{high}")
        found.update(range(first, last + 1, step))
    return frozenset(found)


def _number(text: str, what: str) -> int:
    if not text.isdigit():
        raise ValueError(f"cron {what} {text!r} is not a number (names, L, W and # are not supported here)")
    return int(text)


@dataclass(frozen=True)
class CronSchedule:
    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  #: 0 Sunday .. 6 Saturday
    any_day: bool  #: day of month starts with "*"
    any_weekday: bool  #: day of week starts with "*"

    @classmethod
    def parse(cls, expression: str) -> CronSchedule:
        fields = expression.split()
        if len(fields) != 5:
            raise ValueError(f"a cron expression has five fields (minute hour day month weekday): {expression!r}")
        minutes, hours, days, months, weekdays = (
            _values(text, what, low, high) for text, (what, low, high) in zip(fields, _FIELDS))
        # A field that starts with "*" ("*", "*/2") leaves the other day field
        # to decide alone, as cron has it.
        return cls(expression, minutes, hours, days, months, frozenset(d % 7 for d in weekdays),
                   fields[2].startswith("*"), fields[4].startswith("*"))

    def _day_matches(self, day: datetime.date) -> bool:
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:  # one of them unrestricted: the other decides
            return in_month and in_week
        return in_month or in_week  # both restricted: either one, as cron has it

    def next_after(self, ms: float) -> float:
        """The first time this schedule fires strictly after ``ms`` (epoch ms, UTC)."""
        start = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).replace(second=0, microsecond=0)
        start += datetime.timedelta(minutes=1)
        day = start.date()
        for _ in range(_SEARCH_DAYS):
            if day.month in self.months and self._day_matches(day):
                for hour in sorted(self.hours):
                    for minute in sorted(self.minutes):
                        at = datetime.datetime(day.year, day.month, day.day, hour, minute, tzinfo=datetime.UTC)
                        if at >= start:
                            return at.timestamp() * 1000
            day += datetime.timedelta(days=1)
        raise ValueError(f"cron {self.expression!r} never fires")

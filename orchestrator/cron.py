"""Cron expressions in a time zone: which instants a schedule fires at (`orchestrator.schedules`).

Five fields, as crontab(5) has them: minute (0-59), hour (0-23), day of month (1-31), month
(1-12 or jan-dec) and day of week (0-7 or sun-sat; 0 and 7 are Sunday). Each field is `*` or a
comma list of values and ranges (`a-b`), each with an optional step (`*/15`, `1-31/2`, `5/10`:
from 5 to the end by 10). `@hourly`, `@daily` (`@midnight`), `@weekly`, `@monthly` and
`@yearly` (`@annually`) stand for their five fields. As in cron, when both the day of month and
the day of week are restricted (neither starts with `*`), a day matching either fires.

The fields are read as wall-clock time in the schedule's zone (an IANA name, through `zoneinfo`),
so "0 9 * * mon-fri" in Europe/Paris fires at 09:00 Paris time in winter and in summer. Where
the clocks change:

- a local time that does not exist (the hour skipped in spring) fires once, at the instant
  `zoneinfo` reads it as (the offset before the change): 02:30 on the day New York skips from
  02:00 to 03:00 fires at 03:30 EDT; another tick landing on the same instant (03:30) is that
  same tick, fired once;
- a local time that happens twice (the hour repeated in autumn) fires once, at its first
  occurrence, when the hour field names hours ("30 1 * * *": a daily job runs once that day);
  when it is every hour (`*`, an interval like "*/30 * * * *"), it fires at both occurrences,
  every tick of real time: 01:00 and 01:30 EDT, then 01:00 and 01:30 EST.

A tick is an instant (UNIX seconds, on the minute): what a schedule's run id is derived from.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from orchestrator.errors import InvalidInputError

#: How far ahead (and back) a tick is searched, in days: a 29 February ticks once in 8 years at most.
SEARCH_DAYS = 8 * 366 + 1

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), start=1)}
_DAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}
#: Each field's name, bounds and names.
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
RULE = (
    'five fields "minute hour day-of-month month day-of-week" (like "*/15 * * * *" or '
    '"0 9 * * mon-fri") or one of @hourly, @daily, @weekly, @monthly, @yearly'
)


@dataclass(frozen=True)
class Cron:
    """A parsed expression: the values each field allows."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 is Sunday
    #: Whether both day fields are restricted: then a day matching either fires (cron's rule).
    either_day: bool
    #: Whether every hour fires (`*`): an interval, which fires in a repeated hour too.
    every_hour: bool = False

    def day_matches(self, day: dt.date) -> bool:
        """Whether the expression fires on `day` (at its hours and minutes)."""
        if day.month not in self.months:
            return False
        by_date, by_weekday = day.day in self.days, (day.weekday() + 1) % 7 in self.weekdays
        return (by_date or by_weekday) if self.either_day else (by_date and by_weekday)


def parse(text: object) -> Cron:
    """The expression, or InvalidInputError saying which field is wrong and what is allowed."""
    if not isinstance(text, str):
        raise InvalidInputError(f"cron must be a str, not {type(text).__name__}")
    spec = _MACROS.get(text.strip().lower(), text)
    fields = spec.split()
    if len(fields) != 5:
        raise InvalidInputError(f"cron {text!r} has {len(fields)} fields: give {RULE}")
    values = [_field(f, *shape, text) for f, shape in zip(fields, _FIELDS, strict=True)]
    weekdays = frozenset(0 if d == 7 else d for d in values[4])
    return Cron(
        text=text.strip(),
        minutes=tuple(sorted(values[0])),
        hours=tuple(sorted(values[1])),
        days=frozenset(values[2]),
        months=frozenset(values[3]),
        weekdays=weekdays,
        either_day=not fields[2].startswith("*") and not fields[4].startswith("*"),
        every_hour=len(values[1]) == 24,
    )


def zone(name: object) -> ZoneInfo:
    """The IANA time zone `name` ("UTC", "Europe/Paris"), or InvalidInputError."""
    if not isinstance(name, str) or not name:
        raise InvalidInputError(f"timezone must be an IANA zone name like 'UTC' or 'Europe/Paris', not {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInputError(
            f"timezone {name!r} is not a time zone this host knows: give an IANA name like 'UTC' or 'Europe/Paris'"
        ) from None


def next_tick(cron: Cron, tz: ZoneInfo, after: float) -> float:
    """The first instant the expression fires at strictly after `after` (UNIX seconds);
    InvalidInputError if it never fires (like "0 0 30 2 *")."""
    day = dt.datetime.fromtimestamp(after, tz).date() - dt.timedelta(days=1)  # a gap may shift a tick back
    for _ in range(SEARCH_DAYS):
        later = [t for t in _ticks_of(cron, tz, day) if t > after]
        if later:
            return min(later)
        day += dt.timedelta(days=1)
    raise InvalidInputError(f"cron {cron.text!r} never fires (no day in {SEARCH_DAYS} matches it)")


def latest_tick(cron: Cron, tz: ZoneInfo, at_or_before: float, *, not_before: float) -> float | None:
    """The last instant the expression fires at in [`not_before`, `at_or_before`], or None."""
    day = dt.datetime.fromtimestamp(at_or_before, tz).date() + dt.timedelta(days=1)  # a gap may shift one on
    floor = dt.datetime.fromtimestamp(not_before, tz).date() - dt.timedelta(days=1)
    while day >= floor:
        earlier = [t for t in _ticks_of(cron, tz, day) if not_before <= t <= at_or_before]
        if earlier:
            return max(earlier)
        day -= dt.timedelta(days=1)
    return None


def _ticks_of(cron: Cron, tz: ZoneInfo, day: dt.date) -> list[float]:
    """The instants the expression fires at on local `day`: each local time at its first
    occurrence, and for an expression of every hour also at its second (the hour repeated)."""
    if not cron.day_matches(day):
        return []
    found: list[float] = []
    for hour in cron.hours:
        for minute in cron.minutes:
            first = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz)
            found.append(first.timestamp())
            second = first.replace(fold=1).timestamp()  # later only for a time the clocks repeat
            if cron.every_hour and second > found[-1]:
                found.append(second)
    return found


def _field(text: str, name: str, low: int, high: int, names: dict[str, int], whole: str) -> set[int]:
    allowed: set[int] = set()
    for item in text.split(","):
        try:
            allowed |= _item(item.lower(), low, high, names)
        except ValueError:
            raise InvalidInputError(
                f"cron {whole!r}: the {name} field {text!r} is not valid: use *, numbers {low}-{high}"
                + (f" or names ({', '.join(names)})" if names else "")
                + ", ranges a-b, lists a,b and steps */n; give "
                + RULE
            ) from None
    return allowed


def _item(item: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    """One comma item: `*`, `a`, `a-b`, each with an optional `/step`. ValueError if invalid."""
    base, _, step_text = item.partition("/")
    step = int(step_text) if step_text else 1
    if base == "*":
        start, end = low, high
    elif "-" in base:
        first, _, last = base.partition("-")
        start, end = _value(first, names), _value(last, names)
    else:
        start = _value(base, names)
        end = high if step_text else start
    if step < 1 or not low <= start <= end <= high:
        raise ValueError(item)
    return set(range(start, end + 1, step))


def _value(text: str, names: dict[str, int]) -> int:
    if text in names:
        return names[text]
    if not text.isdigit():
        raise ValueError(text)
    return int(text)


__all__ = ["RULE", "Cron", "latest_tick", "next_tick", "parse", "zone"]

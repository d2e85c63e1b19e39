"""Instants and durations as users write them on the command line and in settings files."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from bergstream.errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")
_UNITS = {
    "us": timedelta(microseconds=1),
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
}
# Spark's interval words, as in a trigger interval or a watermark delay.
_WORDS = {
    "microsecond": "us", "millisecond": "ms", "second": "s", "sec": "s", "minute": "m", "min": "m",
    "hour": "h", "day": "d",
}  # fmt: skip


def parse_duration(text: str | timedelta, what: str = "duration") -> timedelta:
    """`90s`, `15m`, `1.5h`, `2d`, `500ms`, or as Spark writes intervals: `15 minutes`, `1 hour`."""
    if isinstance(text, timedelta):
        return text
    match = _DURATION.match(str(text).lower())
    unit = match.group(2) if match else ""
    unit = _WORDS.get(unit.removesuffix("s") if unit not in _UNITS else unit, unit)
    if match is None or unit not in _UNITS:
        raise ConfigError(f"{what} {text!r}: write a number and a unit, such as 15m, 90s, 1h or 2d")
    return _UNITS[unit] * float(match.group(1))


def parse_instant(text: str | datetime, what: str = "time") -> datetime:
    """An ISO-8601 instant; a time without a zone is refused rather than guessed."""
    if isinstance(text, datetime):
        value = text
    else:
        try:
            value = datetime.fromisoformat(str(text).strip().replace("z", "Z"))
        except ValueError as error:
            raise ConfigError(
                f"{what} {text!r} is not an ISO-8601 time such as 2026-11-20T00:00:00Z"
            ) from error
    if value.tzinfo is None:
        raise ConfigError(f"{what} {text!r} has no time zone: add Z for UTC, or an offset such as +01:00")
    return value.astimezone(UTC)


def format_duration(span: timedelta) -> str:
    """The shortest of the forms `parse_duration` reads back."""
    micros = span // timedelta(microseconds=1)
    for unit in ("d", "h", "m", "s", "ms"):
        size = _UNITS[unit] // timedelta(microseconds=1)
        if micros and micros % size == 0:
            return f"{micros // size}{unit}"
    return f"{micros}us"


def format_instant(value: datetime) -> str:
    text = value.astimezone(UTC).isoformat()
    return text.replace("+00:00", "Z")

"""Times as users write them and as sej shows them (parse_time, format_time), and datetimes as ns.

Accepted forms (all give int nanoseconds since the Unix epoch, UTC):

- ``now``
- relative to now: a sign and one or more number+unit parts, units ``w d h m s``:
  ``-2h``, ``-30m``, ``-45s``, ``-7d``, ``-1w``, ``-1h30m``, ``+10m``
- ISO 8601: ``2024-04-05``, ``2024-04-05T19:34:38Z``, ``2024-04-05T21:34:38+02:00``,
  ``2024-04-05 19:34:38.901234567`` (up to nanoseconds); without an offset it is UTC
- a plain integer: nanoseconds since the epoch (``1712345678901234567``, also negative)
"""

from __future__ import annotations

import datetime as dt
import re
import time

from .errors import InvalidArgumentError

NS = 10**9
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_UNITS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
_RELATIVE = re.compile(r"([+-])((?:\d+[wdhms])+)")
_PART = re.compile(r"(\d+)([wdhms])")
_INTEGER = re.compile(r"-?\d+")
_FRACTION = re.compile(r"(.*\d\d:?\d\d:?\d\d)[.,](\d+)(.*)")

EXPECTED = (
    "expected ISO 8601 (2024-04-05T19:34:38Z, naive means UTC), a relative time "
    "(-2h, -30m, -45s, -7d, -1w), 'now', or integer nanoseconds since the epoch"
)


class TimeError(InvalidArgumentError):
    """A string that is not a time; the message names it."""


def parse_time(text: str, now_ns: int | None = None) -> int:
    """Nanoseconds since the Unix epoch for a time argument; TimeError naming `text` if it is not one."""
    s = text.strip()
    now = time.time_ns() if now_ns is None else now_ns
    if s.lower() == "now":
        return now
    if _INTEGER.fullmatch(s):
        return _in_range(int(s), text)
    m = _RELATIVE.fullmatch(s)
    if m:
        seconds = sum(int(n) * _UNITS[u] for n, u in _PART.findall(m.group(2)))
        return _in_range(now + (seconds * NS if m.group(1) == "+" else -seconds * NS), text)
    return _in_range(_parse_iso(s, text), text)


def _parse_iso(s: str, text: str) -> int:
    fraction_ns = 0
    m = _FRACTION.fullmatch(s)
    if m:  # datetime keeps microseconds only: take the fraction apart to keep nanoseconds
        digits = m.group(2)
        if len(digits) > 9:
            raise TimeError(f"{text!r} is not a time: more than 9 fractional digits")
        fraction_ns = int(digits.ljust(9, "0"))
        s = m.group(1) + m.group(3)
    if s.endswith(("z", "Z")):
        s = s[:-1] + "+00:00"
    try:
        when = dt.datetime.fromisoformat(s)
    except ValueError:
        raise TimeError(f"{text!r} is not a time: {EXPECTED}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    delta = when - _EPOCH
    return (delta.days * 86400 + delta.seconds) * NS + delta.microseconds * 1000 + fraction_ns


def _in_range(ns: int, text: str) -> int:
    if not INT64_MIN < ns <= INT64_MAX:
        raise TimeError(f"{text!r} is not a time: outside the 64-bit nanosecond range (years 1677 to 2262)")
    return ns


def format_time(ns: int | None) -> str | None:
    """ISO 8601 UTC with nanoseconds (`2024-04-05T19:34:38.901234567Z`); None for None."""
    if ns is None:
        return None
    seconds, frac = divmod(ns, NS)
    when = _EPOCH + dt.timedelta(seconds=seconds)
    return f"{when:%Y-%m-%dT%H:%M:%S}.{frac:09d}Z"


def to_ns(ts: object) -> int:
    """Nanoseconds since the Unix epoch from an int (ns) or a timezone-aware datetime."""
    if isinstance(ts, dt.datetime):
        if ts.tzinfo is None:
            raise InvalidArgumentError(f"datetime must be timezone-aware, got {ts!r}")
        delta = ts - _EPOCH
        return (delta.days * 86400 + delta.seconds) * NS + delta.microseconds * 1000
    if isinstance(ts, int) and not isinstance(ts, bool):
        return ts
    raise InvalidArgumentError(f"time must be int nanoseconds or an aware datetime, got {ts!r}")


__all__ = ["NS", "TimeError", "format_time", "parse_time", "to_ns"]

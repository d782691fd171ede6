"""Row-at-a-time parsing of PostgreSQL date/time text output and Java-style ISO formatting.

These handle what the vectorised Arrow paths cannot: ``infinity``, BC dates, years past 9999,
``24:00:00``, non-UTC offsets and intervals.  Input is what the server prints with
``DateStyle=ISO`` and ``IntervalStyle=postgres``.  Dates use the proleptic Gregorian calendar,
as both PostgreSQL and ``java.time`` do.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

MICROS_PER_DAY = 86_400_000_000

#: ``PGStatement.DATE_POSITIVE_INFINITY`` / ``DATE_NEGATIVE_INFINITY``: Debezium's stand-ins for
#: ``'infinity'``/``'-infinity'`` timestamps, read as microseconds since the epoch.
TS_POS_INFINITY = 9_223_372_036_825_200_000
TS_NEG_INFINITY = -9_223_372_036_832_400_000
#: Debezium parses date ``'infinity'`` as ``-5877611-06-21`` and ``'-infinity'`` as ``-5877611-06-22``
#: (PostgreSQL's DATEVAL_NOEND/NOBEGIN shifted to the Unix epoch and wrapped to 32 bits).
DATE_POS_INFINITY = -2_147_472_692
DATE_NEG_INFINITY = -2_147_472_691

_DATE = re.compile(r"(\d+)-(\d\d)-(\d\d)( BC)?")
_OFFSET = r"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?"
_TIMESTAMP = re.compile(r"(\d+)-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?" + _OFFSET + "( BC)?")
_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?" + _OFFSET)


def clamp64(value: int) -> int:
    """Saturate to the int64 range (PostgreSQL timestamps reach 294276 AD, past int64 microseconds)."""
    return max(-(2**63), min(2**63 - 1, value))


def days_from_civil(year: int, month: int, day: int) -> int:
    """Return days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def civil_from_days(days: int) -> tuple[int, int, int]:
    """Return (year, month, day) of a day count since 1970-01-01."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, doy - (153 * mp + 2) // 5 + 1


def _offset_seconds(sign: str | None, hh: str | None, mm: str | None, ss: str | None) -> int:
    if not sign or not hh:
        return 0
    secs = int(hh) * 3600 + int(mm or 0) * 60 + int(ss or 0)
    return -secs if sign == "-" else secs


def _micros(frac: str | None) -> int:
    return int(frac.ljust(6, "0")) if frac else 0


def _bad(kind: str, text: str) -> ValueError:
    return ValueError(f"not a PostgreSQL {kind} text value: {text!r}")


def date_days(text: str) -> int:
    """Return epoch days of a ``date`` text value (``infinity`` per Debezium)."""
    if text == "infinity":
        return DATE_POS_INFINITY
    if text == "-infinity":
        return DATE_NEG_INFINITY
    m = _DATE.fullmatch(text)
    if not m:
        raise _bad("date", text)
    year = 1 - int(m[1]) if m[4] else int(m[1])
    return days_from_civil(year, int(m[2]), int(m[3]))


def timestamp_micros(text: str) -> int:
    """Return epoch microseconds (UTC) of a ``timestamp`` or ``timestamptz`` text value."""
    if text == "infinity":
        return TS_POS_INFINITY
    if text == "-infinity":
        return TS_NEG_INFINITY
    m = _TIMESTAMP.fullmatch(text)
    if not m:
        raise _bad("timestamp", text)
    year = 1 - int(m[1]) if m[12] else int(m[1])
    secs = days_from_civil(year, int(m[2]), int(m[3])) * 86400 + int(m[4]) * 3600 + int(m[5]) * 60 + int(m[6])
    return (secs - _offset_seconds(m[8], m[9], m[10], m[11])) * 1_000_000 + _micros(m[7])


def time_micros(text: str, utc: bool = False) -> int:
    """Return microseconds past midnight of a ``time`` (or, shifted to UTC, ``timetz``) value.

    ``24:00:00`` is a full day for ``time`` (as Debezium's Duration) and wraps to midnight
    for ``timetz`` (as ``java.time.OffsetTime``).
    """
    m = _TIME.fullmatch(text)
    if not m:
        raise _bad("time", text)
    secs = int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) - _offset_seconds(m[5], m[6], m[7], m[8])
    micros = secs * 1_000_000 + _micros(m[4])
    return micros % MICROS_PER_DAY if utc else micros


def iso_year(year: int) -> str:
    """Format a year as ``java.time`` ISO formatters do (4+ digits, sign past 9999 or below 0)."""
    if 0 <= year <= 9999:
        return f"{year:04d}"
    return f"+{year}" if year > 0 else f"-{-year:04d}"


def iso_date(days: int) -> str:
    """Format epoch days as ISO-8601 ``yyyy-MM-dd``."""
    year, month, day = civil_from_days(days)
    return f"{iso_year(year)}-{month:02d}-{day:02d}"


def iso_time(micros: int, width: int | None = None) -> str:
    """Format microseconds past midnight as ``HH:mm:ss[.f]``.

    :param micros: microseconds past midnight (``0 <= micros < 1 day``).
    :param width: exact number of fraction digits, or ``None`` to print the fraction only when
        non-zero and without trailing zeros (``DateTimeFormatter.ISO_LOCAL_TIME``).
    """
    secs, frac = divmod(micros, 1_000_000)
    text = f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
    if width is None:
        return text + (f".{frac:06d}".rstrip("0") if frac else "")
    return text + (f".{frac:06d}"[: width + 1] if width > 0 else "")


def iso_datetime(micros: int, width: int | None = None) -> str:
    """Format epoch microseconds as ISO-8601 ``yyyy-MM-ddTHH:mm:ss[.f]`` (UTC, no zone)."""
    days, rem = divmod(micros, MICROS_PER_DAY)
    return f"{iso_date(days)}T{iso_time(rem, width)}"


_INTERVAL = re.compile(
    r"(?:([+-]?\d+) years? ?)?(?:([+-]?\d+) mons? ?)?(?:([+-]?\d+) days? ?)?"
    r"(?:([+-])?(\d+):(\d\d):(\d\d(?:\.\d+)?))?"
)
#: ``MicroDuration.DAYS_PER_MONTH_AVG``
DAYS_PER_MONTH_AVG = 365.25 / 12.0


def interval_fields(text: str) -> tuple[int, int, int, int, int, float]:
    """Split an interval as ``org.postgresql.util.PGInterval`` does.

    Returns years, months, days, hours, minutes and seconds; the time part's sign applies to
    hours, minutes and seconds, and seconds are rounded to microseconds in a double.
    """
    m = _INTERVAL.fullmatch(text)
    if not m or not text:
        raise _bad("interval", text)
    years, months, days = (int(g) if g else 0 for g in m.groups()[:3])
    hours = minutes = 0
    seconds = 0.0
    if m[5] is not None:
        sign = -1 if m[4] == "-" else 1
        hours, minutes = sign * int(m[5]), sign * int(m[6])
        total = math.floor(sign * float(m[7]) * 1_000_000 + 0.5)
        whole = -(-total // 1_000_000) if total < 0 else total // 1_000_000  # Java long division
        seconds = whole + (total - whole * 1_000_000) / 1_000_000
    return years, months, days, hours, minutes, seconds


def interval_micros(text: str) -> int:
    """Return ``MicroDuration.durationMicros``: months are 365.25/12 days, computed in doubles."""
    years, months, days, hours, minutes, seconds = interval_fields(text)
    n_days = (years * 12 + months) * DAYS_PER_MONTH_AVG + days
    n_secs = ((n_days * 24 + hours) * 60 + minutes) * 60 + seconds
    return clamp64(int(n_secs * 1e6))


def interval_iso(text: str) -> str:
    """Return ``io.debezium.time.Interval``'s ``P<y>Y<m>M<d>DT<h>H<m>M<s>S`` form."""
    years, months, days, hours, minutes, seconds = interval_fields(text)
    secs = Decimal(repr(seconds)).normalize() if seconds else Decimal(0)
    return f"P{years}Y{months}M{days}DT{hours}H{minutes}M{secs:f}S"

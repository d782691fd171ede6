"""Date, time, timestamp and interval codecs, per ``time.precision.mode``.

The common shapes (four-digit years, no BC, ``+00`` offsets) are converted with Arrow casts
and string kernels; everything else falls back to :mod:`types_clock` row by row.
``TIMESTAMPTZ``/``TIMETZ`` are always ISO strings in UTC and ``INTERVAL`` follows
``interval.handling.mode``, whatever the time precision mode.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from airflow_cdc.sources.postgres import copyread
from airflow_cdc.sources.postgres import types_clock as clock
from airflow_cdc.sources.postgres.types_base import (
    NULL_STRING,
    Convert,
    Encoding,
    cast_where,
    fill_slow,
    floor_div,
    rowwise,
)

DATE_FAST = r"^\d{4}-\d\d-\d\d$"
TIMESTAMP_FAST = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?$"
TIME_FAST = r"^([01]\d|2[0-3]):\d\d:\d\d(\.\d{1,6})?$"
TIMESTAMPTZ_FAST = r"^(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)(?:\.(\d{1,6}))?\+00$"
TIMETZ_FAST = r"^([01]\d|2[0-3]):\d\d:\d\d(\.\d{1,6})?\+00$"
DATED_TIME_FAST = r"^1970-01-01 ([01]\d|2[0-3]):\d\d:\d\d(\.\d{1,6})?$"

DBZ = "io.debezium.time."
KAFKA = "org.apache.kafka.connect.data."
INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)
NANOS_SAFE_MICROS = INT64_MAX // 1000


def _suffix(text: pa.Array, ok: pa.Array, tail: str) -> pa.Array:
    """Return ``text + tail`` where ``ok``, null elsewhere."""
    return pc.if_else(ok, pc.binary_join_element_wise(text, tail, ""), NULL_STRING)


# -- DATE ---------------------------------------------------------------------------------------


def _date_days(text: pa.Array) -> pa.Array:
    fast = cast_where(text, pa.date32(), DATE_FAST).cast(pa.int32())
    return fill_slow(text, fast, clock.date_days)


def _date_iso(text: pa.Array) -> pa.Array:
    fast = _suffix(text, pc.match_substring_regex(text, DATE_FAST), "Z")
    return fill_slow(text, fast, lambda t: clock.iso_date(clock.date_days(t)) + "Z")


def date_encoding(mode: str) -> Encoding:
    """Return the ``DATE`` encoding for a ``time.precision.mode``."""
    if mode == "isostring":
        return Encoding(pa.string(), "string", _date_iso, DBZ + "IsoDate")
    name = KAFKA + "Date" if mode == "connect" else DBZ + "Date"
    return Encoding(pa.int32(), "int32", _date_days, name)


# -- TIMESTAMP ----------------------------------------------------------------------------------


def _timestamp_micros(text: pa.Array) -> pa.Array:
    return cast_where(text, pa.timestamp("us"), TIMESTAMP_FAST).cast(pa.int64())


def _ts_millis(text: pa.Array) -> pa.Array:
    fast = floor_div(_timestamp_micros(text), 1000)
    return fill_slow(text, fast, lambda t: clock.timestamp_micros(t) // 1000)


def _ts_micros(text: pa.Array) -> pa.Array:
    return fill_slow(text, _timestamp_micros(text), lambda t: clock.clamp64(clock.timestamp_micros(t)))


def _ts_nanos_slow(text: str) -> int:
    # NanoTimestamp maps the infinities to Long.MAX_VALUE / Long.MIN_VALUE
    if text in ("infinity", "-infinity"):
        return INT64_MAX if text == "infinity" else INT64_MIN
    return clock.clamp64(clock.timestamp_micros(text) * 1000)


def _ts_nanos(text: pa.Array) -> pa.Array:
    micros = _timestamp_micros(text)
    in_range = pc.less_equal(pc.abs(micros), NANOS_SAFE_MICROS)  # |micros| * 1000 fits int64
    fast = pc.multiply(pc.if_else(in_range, micros, pa.scalar(None, pa.int64())), 1000)
    return fill_slow(text, fast, _ts_nanos_slow)


def _ts_iso(text: pa.Array) -> pa.Array:
    ok = pc.match_substring_regex(text, TIMESTAMP_FAST)
    fast = _suffix(pc.replace_substring(text, " ", "T", max_replacements=1), ok, "Z")
    return fill_slow(text, fast, lambda t: clock.iso_datetime(clock.timestamp_micros(t)) + "Z")


def timestamp_encoding(mode: str, precision: int) -> Encoding:
    """Return the ``TIMESTAMP(p)`` encoding for a ``time.precision.mode``."""
    if mode == "isostring":
        return Encoding(pa.string(), "string", _ts_iso, DBZ + "IsoTimestamp")
    if mode == "connect":
        return Encoding(pa.int64(), "int64", _ts_millis, KAFKA + "Timestamp")
    if mode == "nanoseconds":
        return Encoding(pa.int64(), "int64", _ts_nanos, DBZ + "NanoTimestamp")
    if mode != "microseconds" and precision <= 3:
        return Encoding(pa.int64(), "int64", _ts_millis, DBZ + "Timestamp")
    return Encoding(pa.int64(), "int64", _ts_micros, DBZ + "MicroTimestamp")


# -- TIME ---------------------------------------------------------------------------------------


def _time_of_day(unit_div: int, unit_mul: int, arrow_type: pa.DataType) -> Convert:
    def convert(text: pa.Array) -> pa.Array:
        dated = pc.binary_join_element_wise("1970-01-01 ", text, "")
        micros = cast_where(dated, pa.timestamp("us"), DATED_TIME_FAST).cast(pa.int64())
        fast = pc.multiply(floor_div(micros, unit_div), unit_mul).cast(arrow_type)
        return fill_slow(text, fast, lambda t: clock.time_micros(t) // unit_div * unit_mul)

    return convert


def _time_iso(text: pa.Array) -> pa.Array:
    fast = _suffix(text, pc.match_substring_regex(text, TIME_FAST), "Z")
    return fill_slow(text, fast, lambda t: clock.iso_time(clock.time_micros(t) % clock.MICROS_PER_DAY) + "Z")


def time_encoding(mode: str, precision: int) -> Encoding:
    """Return the ``TIME(p)`` encoding for a ``time.precision.mode``."""
    millis = _time_of_day(1000, 1, pa.int32())
    if mode == "isostring":
        return Encoding(pa.string(), "string", _time_iso, DBZ + "IsoTime")
    if mode == "connect":
        return Encoding(pa.int32(), "int32", millis, KAFKA + "Time")
    if mode == "nanoseconds":
        return Encoding(pa.int64(), "int64", _time_of_day(1, 1000, pa.int64()), DBZ + "NanoTime")
    if mode == "adaptive" and precision <= 3:
        return Encoding(pa.int32(), "int32", millis, DBZ + "Time")
    return Encoding(pa.int64(), "int64", _time_of_day(1, 1, pa.int64()), DBZ + "MicroTime")


# -- zoned types --------------------------------------------------------------------------------


def _zoned_timestamp(precision: int) -> Convert:
    # ZonedTimestamp prints exactly `precision` fraction digits (ISO_OFFSET_DATE_TIME when 0)
    width = 20 + precision if precision > 0 else 19

    def slow(text: str) -> str:
        if text in ("infinity", "-infinity"):
            return text
        return clock.iso_datetime(clock.timestamp_micros(text), precision or None) + "Z"

    def convert(text: pa.Array) -> pa.Array:
        compiled = copyread.zoned_iso(text, precision)  # one C pass (~30x): the same strings
        if compiled is not None:
            return fill_slow(text, compiled, slow)
        # plain string kernels (a regex replace costs ~4x): "<date>T<time>" without "+00", then
        # ".000000" or "000000" after it (no fraction / a fraction), cut to the column's width
        ok = pc.match_substring_regex(text, TIMESTAMPTZ_FAST)
        iso = pc.utf8_slice_codeunits(pc.replace_substring(text, " ", "T", max_replacements=1), 0, -3)
        pad = pc.if_else(pc.equal(pc.binary_length(iso), 19), ".000000", "000000")
        fast = _suffix(pc.utf8_slice_codeunits(pc.binary_join_element_wise(iso, pad, ""), 0, width), ok, "Z")
        return fill_slow(text, fast, slow)

    return convert


def _zoned_time(text: pa.Array) -> pa.Array:
    ok = pc.match_substring_regex(text, TIMETZ_FAST)
    fast = _suffix(pc.utf8_slice_codeunits(text, 0, -3), ok, "Z")
    return fill_slow(text, fast, lambda t: clock.iso_time(clock.time_micros(t, utc=True)) + "Z")


def temporal_encoding(name: str, typmod: int, mode: str, interval_mode: str) -> Encoding | None:
    """Return the encoding of a date/time type name, or ``None`` if ``name`` is not one.

    :param name: ``pg_type.typname``.
    :param typmod: column type modifier (fractional-second precision, -1 for the default 6).
    :param mode: ``time.precision.mode``.
    :param interval_mode: ``interval.handling.mode``.
    """
    precision = 6 if typmod < 0 else typmod
    if name == "date":
        return date_encoding(mode)
    if name == "time":
        return time_encoding(mode, precision)
    if name == "timestamp":
        return timestamp_encoding(mode, precision)
    if name == "timestamptz":
        return Encoding(pa.string(), "string", _zoned_timestamp(precision), DBZ + "ZonedTimestamp")
    if name == "timetz":
        return Encoding(pa.string(), "string", _zoned_time, DBZ + "ZonedTime")
    if name == "interval":
        if interval_mode == "string":
            return Encoding(pa.string(), "string", rowwise(pa.string(), clock.interval_iso), DBZ + "Interval")
        micros = rowwise(pa.int64(), clock.interval_micros)
        return Encoding(pa.int64(), "int64", micros, DBZ + "MicroDuration")
    return None

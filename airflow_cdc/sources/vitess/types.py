"""Vitess column values -> Debezium's encodings (the Debezium Vitess connector's type table).

Input: the neutral values of :func:`airflow_cdc.sources.vitess.protocol.value_decoder` (int, float,
str, bytes; DECIMAL and temporal types as their MySQL text).  Output per column: the Arrow type,
the Kafka Connect schema name (semantic type) and its parameters, and a value converter.

=======================  ==========  ===============================================
Vitess type              literal     semantic type / notes
=======================  ==========  ===============================================
INT8, UINT8, INT16       INT16
UINT16, INT24, UINT24,   INT32
INT32
UINT32, INT64            INT64
UINT64                   STRING      ``bigint.unsigned.handling.mode=string`` (default);
                                     ``long``: INT64, a value past 2^63-1 a SchemaError;
                                     ``precise``: Decimal (scale 0)
FLOAT32, FLOAT64         FLOAT64
DECIMAL                  STRING      the exact text
CHAR, VARCHAR, TEXT      STRING
BINARY, VARBINARY, BLOB  BYTES
JSON                     STRING      io.debezium.data.Json
ENUM / SET               STRING      io.debezium.data.Enum / EnumSet, ``allowed`` labels
YEAR                     INT32       io.debezium.time.Year
TIMESTAMP                STRING      io.debezium.time.ZonedTimestamp, ISO-8601 in UTC
DATE                     INT32       io.debezium.time.Date (days)
TIME                     INT64       io.debezium.time.MicroTime
DATETIME(0-3)            INT64       io.debezium.time.Timestamp (ms)
DATETIME(4-6)            INT64       io.debezium.time.MicroTimestamp
BIT, GEOMETRY            --          not supported (``include.unknown.datatypes``: BYTES)
=======================  ==========  ===============================================

``time.precision.mode=connect`` gives Kafka's Date / Time (ms) / Timestamp (ms); ``isostring`` gives
the temporal values as strings.  Zero dates (``0000-00-00``) become NULL.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pyarrow as pa

from airflow_cdc.core.errors import SchemaError, UnsupportedType
from airflow_cdc.sources.mysql.schema import enum_labels
from airflow_cdc.sources.vitess.proto import query_pb2 as q

DBZ, KAFKA, DATA = "io.debezium.time.", "org.apache.kafka.connect.data.", "io.debezium.data."
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DATE = dt.date(1970, 1, 1)


@dataclass(frozen=True)
class VitessCodec:
    arrow_type: pa.DataType
    schema_name: str | None
    convert: Callable[[Any], Any]
    parameters: dict[str, str] = field(default_factory=dict)


def _same(v: Any) -> Any:
    return v


def _days(text: str) -> int | None:
    if text.startswith("0000"):
        return None
    return (dt.date.fromisoformat(text) - _EPOCH_DATE).days


def _datetime_micros(text: str) -> int | None:
    if text.startswith("0000"):
        return None
    when = dt.datetime.fromisoformat(text)
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _time_micros(text: str) -> int:
    sign = -1 if text.startswith("-") else 1
    clock, _, frac = text.lstrip("-").partition(".")
    hours, minutes, seconds = (int(x) for x in clock.split(":"))
    micros = int((frac + "000000")[:6]) if frac else 0
    return sign * (((hours * 60 + minutes) * 60 + seconds) * 1_000_000 + micros)


def _zoned(text: str) -> str | None:
    if text.startswith("0000"):
        return None
    when = dt.datetime.fromisoformat(text)
    body = when.strftime("%Y-%m-%dT%H:%M:%S")
    if when.microsecond:
        body += f".{when.microsecond:06d}".rstrip("0")
    return body + "Z"


def _labels(column_type: str) -> str:
    return ",".join(enum_labels(column_type))


_LONG_MAX = (1 << 63) - 1


def _unsigned_bigint(mode: str, column: str) -> VitessCodec:
    """``bigint.unsigned.handling.mode`` for a BIGINT UNSIGNED ``column`` (``table.column``).

    ``long`` as Debezium's Vitess connector: it parses vtgate's decimal text with
    ``Long.valueOf``, so a value above 2^63-1 cannot be converted (its docs: such values "cannot
    be conveyed by using long"; Debezium's MySQL connector, which reads binlog bytes, wraps them
    negative instead).  Here that conversion failure stops the run (``fail``, the only
    ``event.converting.failure.handling.mode``) rather than staging NULL or a wrapped number.
    """
    if mode == "long":

        def signed(v: int) -> int:
            if v > _LONG_MAX:
                raise SchemaError(
                    f"column {column}: a BIGINT UNSIGNED value above 2^63-1 does not fit "
                    "bigint.unsigned.handling.mode=long",
                    hint="set bigint.unsigned.handling.mode to precise (exact decimals) or string "
                    "(the default), then run capture again: nothing of this run was committed",
                )
            return v

        return VitessCodec(pa.int64(), None, signed)
    if mode == "precise":
        return VitessCodec(pa.decimal128(20, 0), None, Decimal)
    return VitessCodec(pa.string(), None, str)


def _temporal(f: q.Field, precision: str) -> VitessCodec:
    t = f.type
    if t == q.TIMESTAMP:
        return VitessCodec(pa.string(), DBZ + "ZonedTimestamp", _zoned)
    if precision == "isostring":
        return VitessCodec(pa.string(), None, _same)
    if t == q.DATE:
        return VitessCodec(pa.int32(), (KAFKA if precision == "connect" else DBZ) + "Date", _days)
    if t == q.TIME:
        if precision == "connect":
            return VitessCodec(pa.int32(), KAFKA + "Time", lambda v: _time_micros(v) // 1000)
        return VitessCodec(pa.int64(), DBZ + "MicroTime", _time_micros)
    if precision == "connect" or f.decimals <= 3:
        name = KAFKA + "Timestamp" if precision == "connect" else DBZ + "Timestamp"

        def millis(v: str) -> int | None:
            micros = _datetime_micros(v)
            return None if micros is None else micros // 1000

        return VitessCodec(pa.int64(), name, millis)
    return VitessCodec(pa.int64(), DBZ + "MicroTimestamp", _datetime_micros)


_FIXED: dict[int, VitessCodec] = {
    q.INT8: VitessCodec(pa.int16(), None, _same),
    q.UINT8: VitessCodec(pa.int16(), None, _same),
    q.INT16: VitessCodec(pa.int16(), None, _same),
    q.UINT16: VitessCodec(pa.int32(), None, _same),
    q.INT24: VitessCodec(pa.int32(), None, _same),
    q.UINT24: VitessCodec(pa.int32(), None, _same),
    q.INT32: VitessCodec(pa.int32(), None, _same),
    q.UINT32: VitessCodec(pa.int64(), None, _same),
    q.INT64: VitessCodec(pa.int64(), None, _same),
    q.FLOAT32: VitessCodec(pa.float64(), None, _same),
    q.FLOAT64: VitessCodec(pa.float64(), None, _same),
    q.DECIMAL: VitessCodec(pa.string(), None, _same),
    q.CHAR: VitessCodec(pa.string(), None, _same),
    q.VARCHAR: VitessCodec(pa.string(), None, _same),
    q.TEXT: VitessCodec(pa.string(), None, _same),
    q.BINARY: VitessCodec(pa.binary(), None, _same),
    q.VARBINARY: VitessCodec(pa.binary(), None, _same),
    q.BLOB: VitessCodec(pa.binary(), None, _same),
    q.JSON: VitessCodec(pa.string(), DATA + "Json", _same),
    q.YEAR: VitessCodec(pa.int32(), DBZ + "Year", _same),
}


def column_codec(
    f: q.Field,
    table: str,
    time_precision: str = "adaptive_time_microseconds",
    bigint_unsigned: str = "string",
    include_unknown: bool = False,
) -> VitessCodec:
    """The Debezium encoding of one column described by a FIELD event.

    :raises UnsupportedType: BIT, GEOMETRY and unknown types, naming the table and column, unless
        ``include_unknown`` (then their bytes pass through).
    """
    if f.type in _FIXED:
        return _FIXED[f.type]
    if f.type == q.UINT64:
        return _unsigned_bigint(bigint_unsigned, f"{table}.{f.name}")
    if f.type in (q.DATE, q.TIME, q.DATETIME, q.TIMESTAMP):
        return _temporal(f, time_precision)
    if f.type in (q.ENUM, q.SET):
        name = DATA + ("Enum" if f.type == q.ENUM else "EnumSet")
        return VitessCodec(pa.string(), name, _same, {"allowed": _labels(f.column_type)})
    if include_unknown:
        return VitessCodec(pa.binary(), None, lambda v: v if isinstance(v, bytes) else str(v).encode())
    raise UnsupportedType(
        f"column {table}.{f.name}: Vitess type {q.Type.Name(f.type)} ({f.column_type or 'unknown'}) "
        "is not supported"
    )

"""SQL Server column values -> Debezium-encoded Arrow arrays (Debezium SQL Server type mapping).

Codecs receive the Python values of :mod:`.client` (pyodbc with its output converters):
``datetime2``/``datetime``/``smalldatetime`` as nanoseconds since 1970 (naive), ``time`` as
nanoseconds since midnight, ``datetimeoffset`` as ``(aware datetime, extra nanoseconds)``, the
other types as pyodbc returns them.  Handling modes: ``decimal.handling.mode``,
``time.precision.mode`` (``adaptive``: precision decides ms / µs / ns; ``connect``: Kafka Connect
millisecond types), ``binary.handling.mode``.

Types Debezium's SQL Server connector has no mapping for -- ``sql_variant`` and the CLR types
``hierarchyid``, ``geometry``, ``geography`` (debezium/debezium ``SqlServerValueConverters`` leaves
them to ``JdbcValueConverters``, which has no schema for their JDBC types, so Debezium drops the
field with a warning; its converter still says "TODO Geometry and geography supported since 6.5.0")
-- are refused with :class:`UnsupportedType` when the source opens, before anything is read.  With
``include.unknown.datatypes`` the CLR types are staged as Debezium's "opaque binary representation"
(their CLR serialisation) under ``binary.handling.mode``.  A captured ``sql_variant`` column is
refused even then, and even when ``column.exclude.list`` drops it (the change and chunk queries read
every captured column): through FreeTDS a sql_variant comes back without its base type, text in
its server encoding, dates repeated, and a ``decimal``/``numeric`` value fails the fetch (ODBC
07006: FreeTDS 1.3 ``SQLGetData`` never finishes a variant's ``SQL_NUMERIC_STRUCT``), so only a
capture instance without the column can be read.  ``timestamp``/``rowversion`` is ``binary(8)``
(JDBC ``BINARY``): bytes.  Alias types arrive as their base type (:func:`.sql.captured_columns`).
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from airflow_cdc.core.errors import UnsupportedType
from airflow_cdc.sources.postgres.types_base import connect_metadata
from airflow_cdc.sources.sqlserver.schema import Column

DBZ, KAFKA, DATA = "io.debezium.time.", "org.apache.kafka.connect.data.", "io.debezium.data."
META_SQLSERVER_TYPE = b"sqlserver.type"
_EPOCH = dt.date(1970, 1, 1)
_INTEGER = {
    "bit": pa.bool_(),
    "tinyint": pa.int16(),
    "smallint": pa.int16(),
    "int": pa.int32(),
    "bigint": pa.int64(),
}
_STRINGS = frozenset({"char", "varchar", "text", "nchar", "nvarchar", "ntext", "sysname", "uniqueidentifier"})
_BINARIES = frozenset({"binary", "varbinary", "image", "timestamp", "rowversion"})
_MONEY = {"money": (19, 4), "smallmoney": (10, 4)}
#: Types without a Debezium mapping, and what ``include.unknown.datatypes`` stages for them.
UNMAPPED = {
    "hierarchyid": "its CLR serialisation",
    "geometry": "its CLR serialisation (not WKB)",
    "geography": "its CLR serialisation (not WKB)",
}
_BINARY_ENCODERS: dict[str, Callable[[bytes], str]] = {
    "base64": lambda b: base64.b64encode(b).decode(),
    "hex": lambda b: b.hex(),
    "base64-url-safe": lambda b: base64.urlsafe_b64encode(b).decode(),
}


@dataclass(frozen=True)
class Modes:
    decimal: str = "precise"
    time_precision: str = "adaptive"
    binary: str = "bytes"
    include_unknown: bool = False


Encoding = tuple[pa.DataType, str, str | None, dict | None, Callable[[list], pa.Array]]


class SqlServerCodec:
    """Converts one column's Python values into its Debezium-encoded Arrow array."""

    __slots__ = ("field", "placeholder", "convert_values")

    def __init__(self, field: pa.Field, convert_values: Callable[[list], pa.Array]) -> None:
        self.field, self.placeholder, self.convert_values = field, None, convert_values

    def convert(self, values: pa.Array) -> pa.Array:
        return self.convert_values(values.to_pylist())


def _each(arrow: pa.DataType, fn: Callable[[Any], Any] | None = None) -> Callable[[list], pa.Array]:
    if fn is None:
        return lambda values: pa.array(values, type=arrow)
    return lambda values: pa.array([None if v is None else fn(v) for v in values], type=arrow)


def encoding(col: Column, modes: Modes, where: str = "") -> Encoding:
    """(Arrow type, Connect type, semantic name, parameters, converter) of one column.

    :param where: ``database.schema.table`` of the column, for the error.
    :raises UnsupportedType: naming the column and type when Debezium has no mapping for it and
        ``include.unknown.datatypes`` is off.
    """
    t = col.type_name.lower()
    if t in _INTEGER:
        arrow = _INTEGER[t]
        return arrow, "boolean" if t == "bit" else str(arrow), None, None, _each(arrow)
    if t in ("real", "float"):
        arrow = pa.float32() if t == "real" else pa.float64()
        return arrow, "float32" if t == "real" else "float64", None, None, _each(arrow)
    if t in ("decimal", "numeric") or t in _MONEY:
        precision, scale = _MONEY.get(t, (col.precision, col.scale))
        return _decimal(precision, scale, modes.decimal)
    if t in ("date", "time", "datetime", "smalldatetime", "datetime2", "datetimeoffset"):
        return _temporal(t, col.scale, modes.time_precision)
    if t == "xml":
        return pa.string(), "string", DATA + "Xml", None, _each(pa.string())
    if t in _STRINGS:
        return pa.string(), "string", None, None, _each(pa.string(), str)
    if t in _BINARIES:
        return _binary(modes.binary)
    if modes.include_unknown and t != "sql_variant":  # Debezium: "an opaque binary representation"
        return _binary(modes.binary, opaque=True)
    raise unsupported(col, where)


def unsupported(col: Column, where: str, key: bool = False) -> UnsupportedType:
    """The error for a column whose type has no Debezium mapping, with the one next step."""
    name = f"{where}.{col.name}" if where else col.name
    if col.type_name.lower() == "sql_variant":
        return _variant_refused(col, name, key)
    form = UNMAPPED.get(col.type_name.lower(), "its value")
    unknown = f"include.unknown.datatypes=true stages {form} as bytes"
    if key:
        step = "set include.unknown.datatypes=true (a key column cannot be excluded)"
    else:
        step = f"add {name.split('.', 1)[-1]} to column.exclude.list"
    return UnsupportedType(
        f"column {name} has SQL Server type {col.type_name!r}, which Debezium's SQL Server connector"
        f" does not map ({unknown})",
        hint=step,
    )


def _variant_refused(col: Column, name: str, key: bool) -> UnsupportedType:
    if key:
        step = "enable CDC on the table with @index_name naming a unique index without sql_variant columns"
    else:
        step = (
            f"enable CDC on the table again with @captured_column_list leaving out {col.name}"
            " (column.exclude.list still reads it)"
        )
    return UnsupportedType(
        f"column {name} has SQL Server type 'sql_variant', which Debezium's SQL Server connector does"
        " not map and which cannot be read through FreeTDS (no base type; decimal values fail the"
        " fetch), so it is refused even with include.unknown.datatypes",
        hint=step,
    )


def _decimal(precision: int, scale: int, mode: str) -> Encoding:
    if mode == "double":
        return pa.float64(), "float64", None, None, _each(pa.float64(), float)
    if mode == "string":
        return pa.string(), "string", None, None, _each(pa.string(), lambda d: format(Decimal(d), "f"))
    arrow = pa.decimal128(precision, scale)
    params = {"scale": str(scale), "connect.decimal.precision": str(precision)}
    return arrow, "bytes", KAFKA + "Decimal", params, _each(arrow, Decimal)


def _binary(mode: str, opaque: bool = False) -> Encoding:
    raw = _opaque if opaque else bytes
    if mode == "bytes":
        return pa.binary(), "bytes", None, None, _each(pa.binary(), raw)
    enc = _BINARY_ENCODERS[mode]
    return pa.string(), "string", None, None, _each(pa.string(), lambda v: enc(raw(v)))


def _opaque(value: Any) -> bytes:
    """An unmapped type's value as bytes: driver bytes as they are, anything else as its text."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return str(value).encode()


def _temporal(t: str, scale: int, mode: str) -> Encoding:
    connect = mode == "connect"
    if t == "date":
        return (
            pa.int32(),
            "int32",
            (KAFKA if connect else DBZ) + "Date",
            None,
            _each(pa.int32(), lambda d: (d - _EPOCH).days),
        )
    if t == "datetimeoffset":
        return pa.string(), "string", DBZ + "ZonedTimestamp", None, _each(pa.string(), zoned_text)
    if t == "time":  # nanoseconds since midnight
        if connect or scale <= 3:
            return (
                pa.int32(),
                "int32",
                (KAFKA if connect else DBZ) + "Time",
                None,
                _each(pa.int32(), lambda ns: ns // 10**6),
            )
        if scale <= 6:
            return pa.int64(), "int64", DBZ + "MicroTime", None, _each(pa.int64(), lambda ns: ns // 1000)
        return pa.int64(), "int64", DBZ + "NanoTime", None, _each(pa.int64())
    # datetime, smalldatetime, datetime2: nanoseconds since the epoch
    precision = 3 if t in ("datetime", "smalldatetime") else scale
    if connect or precision <= 3:
        return (
            pa.int64(),
            "int64",
            (KAFKA if connect else DBZ) + "Timestamp",
            None,
            _each(pa.int64(), lambda ns: ns // 10**6),
        )
    if precision <= 6:
        return pa.int64(), "int64", DBZ + "MicroTimestamp", None, _each(pa.int64(), lambda ns: ns // 1000)
    return pa.int64(), "int64", DBZ + "NanoTimestamp", None, _each(pa.int64())


def zoned_text(value: tuple[dt.datetime, int]) -> str:
    """Debezium's ZonedTimestamp text: ISO-8601 with the value's own offset, fraction trimmed."""
    moment, extra_ns = value
    nanos = moment.microsecond * 1000 + extra_ns
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if nanos:
        text += "." + f"{nanos:09d}".rstrip("0")
    offset = moment.utcoffset() or dt.timedelta(0)
    if not offset:
        return text + "Z"
    minutes = int(offset.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    return f"{text}{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def column_codec(col: Column, modes: Modes, where: str = "") -> SqlServerCodec:
    """The codec of one captured column.

    :raises UnsupportedType: see :func:`encoding`.
    """
    arrow, ctype, name, params, conv = encoding(col, modes, where)
    meta = connect_metadata(ctype, name, params)
    meta[META_SQLSERVER_TYPE] = col.type_name.encode()
    return SqlServerCodec(pa.field(col.name, arrow, nullable=True, metadata=meta), conv)

"""MySQL column values -> Debezium-encoded Arrow arrays (Debezium MySQL connector type mapping).

Codecs receive the neutral Python values of :mod:`rowcodec` (binlog) or of the snapshot reader
(:func:`airflow_cdc.sources.mysql.snapshot.neutral`) and convert whole columns at once.
Handling modes: ``decimal.handling.mode``, ``time.precision.mode`` (``adaptive_time_microseconds``
default, ``adaptive``, ``connect``), ``bigint.unsigned.handling.mode``, ``binary.handling.mode``.
Zero dates become NULL in optional columns and the epoch in mandatory ones, as in Debezium.
``DECIMAL(p, s)`` is an Arrow ``decimal128`` up to 38 digits and Debezium's unscaled bytes beyond.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_cdc.core.connect_json import decimal_unscaled, java_bigint_bytes
from airflow_cdc.core.errors import UnsupportedType
from airflow_cdc.sources.mysql.charsets import decode, python_codec
from airflow_cdc.sources.mysql.schema import ColumnDef
from airflow_cdc.sources.mysql.spatial import GEOMETRY_TYPE, POINT_TYPE, SPATIAL, geometry, point
from airflow_cdc.sources.postgres.types_base import connect_metadata

DBZ, KAFKA, DATA = "io.debezium.time.", "org.apache.kafka.connect.data.", "io.debezium.data."
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
META_MYSQL_TYPE = b"mysql.type"

try:
    from airflow_cdc.sources.mysql._binlogrows import datetime_epoch as _datetime_epoch
except ImportError:  # not built: Python conversion
    _datetime_epoch = None


@dataclass(frozen=True)
class Modes:
    decimal: str = "precise"
    time_precision: str = "adaptive_time_microseconds"
    bigint_unsigned: str = "long"
    binary: str = "bytes"
    tinyint_one_boolean: bool = False
    include_unknown: bool = False
    time_adjuster: bool = True


class MySqlCodec:
    """Converts one column's neutral values; ``field`` carries the Connect schema metadata."""

    __slots__ = ("field", "placeholder", "convert_values")

    def __init__(self, field: pa.Field, convert_values: Callable[[list], pa.Array]) -> None:
        self.field, self.placeholder, self.convert_values = field, None, convert_values

    def convert(self, values: pa.Array) -> pa.Array:
        return self.convert_values(values.to_pylist())


@lru_cache(maxsize=65536)
def epoch_days(ymd: int) -> int | None:
    """Days since the epoch of a packed ``year*512 + month*32 + day``; None for zero/invalid dates."""
    try:
        return dt.date(ymd >> 9, ymd >> 5 & 15, ymd & 31).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        return None


def datetime_micros(v: int) -> int | None:
    """Epoch microseconds of a neutral DATETIME (``YYYYMMDDhhmmss * 10**6 + micros``)."""
    stamp, micros = divmod(v, 1_000_000)
    ymd, hms = divmod(stamp, 1_000_000)
    days = epoch_days((ymd // 10000) << 9 | (ymd // 100 % 100) << 5 | ymd % 100)
    if days is None:
        return None
    return (days * 86400 + hms // 10000 * 3600 + hms // 100 % 100 * 60 + hms % 100) * 1_000_000 + micros


def _datetimes(divisor: int, zero: int | None) -> Callable[[list], pa.Array]:
    """Neutral DATETIME values -> epoch micros (``divisor`` 1) or millis (1000); ``zero`` for zero
    and invalid dates.  The compiled twin of :func:`datetime_micros` converts whole columns; values
    it does not take (negative, huge: damaged input) go through the Python function."""

    def python(values: list) -> pa.Array:
        return pa.array(
            [
                None if v is None else m // divisor if (m := datetime_micros(v)) is not None else zero
                for v in values
            ],
            type=pa.int64(),
        )

    if _datetime_epoch is None:
        return python

    def convert(values: list) -> pa.Array:
        out = _datetime_epoch(values, divisor, zero)
        if out is None:
            return python(values)
        data, valid = out
        buffers = [None if valid is None else pa.py_buffer(valid), pa.py_buffer(data)]
        return pa.Array.from_buffers(pa.int64(), len(values), buffers)

    return convert


_DT_YEAR = 10**16  # the year's unit in a neutral DATETIME (YYYYMMDDhhmmss * 10**6 + micros)


def _two_digit_year(year: int) -> int:
    """Debezium's ``enable.time.adjuster`` (MySqlValueConverters.adjustTemporal): years 0-69 are
    2000-2069, 70-99 are 1970-1999."""
    return 2000 if year < 70 else 1900


def adjust_date(v: int) -> int:
    """A neutral DATE with a year below 100 moved by :func:`_two_digit_year` (zero dates stay)."""
    year = v >> 9
    return v + (_two_digit_year(year) << 9) if year < 100 and v & 511 else v


def adjust_datetimes(values: list) -> list:
    """Neutral DATETIMEs with a year below 100 moved by :func:`_two_digit_year` (zero dates stay)."""
    if not any(v is not None and 0 < v < 100 * _DT_YEAR for v in values):
        return values
    return [
        v + _two_digit_year(v // _DT_YEAR) * _DT_YEAR
        if v is not None and 0 < v < 100 * _DT_YEAR and v // 10**12 % 10**4
        else v
        for v in values
    ]


def _zero(col: ColumnDef, epoch_value: Any) -> Any:
    return None if col.nullable else epoch_value


def columnar(convert: Callable[[list], pa.Array], *spec: Any) -> Callable[[list], pa.Array]:
    """Tag a converter with the column buffers of the compiled hand-over it is equivalent to
    (:mod:`airflow_cdc.sources.mysql.columnar`): ``("int",)``, ``("bool",)``, ``("float",)``,
    ``("decimal",)``, ``("text",)`` or ``("datetime", divisor, zero, adjust)``."""
    convert.columnar = spec  # type: ignore[attr-defined]
    return convert


def _ints(arrow_type: pa.DataType, fn: Callable[[Any], Any] | None = None) -> Callable[[list], pa.Array]:
    if fn is None:
        return lambda values: pa.array(values, type=arrow_type)
    return lambda values: pa.array([None if v is None else fn(v) for v in values], type=arrow_type)


def _text(charset: str | None) -> Callable[[list], pa.Array]:
    py = python_codec(charset)

    def convert(values: list) -> pa.Array:
        if py == "utf-8":
            try:
                return pa.array(values, type=pa.binary()).cast(pa.string())
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                pass
        return pa.array(
            [decode(v, charset) if isinstance(v, bytes) else v for v in values],
            type=pa.string(),
        )

    return columnar(convert, "text") if py == "utf-8" else convert


_BINARY_ENCODERS: dict[str, Callable[[bytes], str]] = {
    "base64": lambda b: base64.b64encode(b).decode(),
    "hex": lambda b: b.hex(),
    "base64-url-safe": lambda b: base64.urlsafe_b64encode(b).decode(),
}


def _binary(mode: str, pad: int | None) -> tuple[pa.DataType, str, Callable[[list], pa.Array]]:
    def fix(v: Any) -> bytes:
        b = v.encode() if isinstance(v, str) else bytes(v)
        return b.ljust(pad, b"\0") if pad else b

    if mode == "bytes":
        return (
            pa.binary(),
            "bytes",
            lambda values: pa.array([None if v is None else fix(v) for v in values], type=pa.binary()),
        )
    enc = _BINARY_ENCODERS[mode]
    return (
        pa.string(),
        "string",
        lambda values: pa.array([None if v is None else enc(fix(v)) for v in values], type=pa.string()),
    )


def label_of(labels: list[str], is_set: bool) -> Callable[[int], str]:
    """An ENUM's 1-based index (0: the invalid value '') or a SET's bit mask -> its label(s)."""
    if not is_set:
        return lambda i: labels[i - 1] if 0 < i <= len(labels) else ""
    return lambda mask: ",".join(label for k, label in enumerate(labels) if mask >> k & 1)


def _timestamp_text(col: ColumnDef) -> Callable[[list], pa.Array]:
    """ZonedTimestamp text with exactly the column's fractional digits: Debezium formats a
    TIMESTAMP(n) with ``appendFraction(NANO_OF_SECOND, n, n, true)`` (ZonedTimestamp.toIsoString's
    ``fractionalWidth``), so TIMESTAMP(1) prints ``...:00.1Z`` and TIMESTAMP(6) ``...:00.100000Z``."""
    fsp = min(col.fsp or 0, 6)
    # the zero timestamp of a NOT NULL column: JdbcValueConverters' fallbackTimestampWithTimeZone,
    # formatted without a fractional width
    epoch = _zero(col, "1970-01-01T00:00:00Z")

    def convert(values: list) -> pa.Array:
        micros = pa.array([None if not v else v for v in values], type=pa.int64())
        stamps = micros.cast(pa.timestamp("us")).cast(pa.timestamp("s"), safe=False)
        text = pc.strftime(stamps, format="%Y-%m-%dT%H:%M:%S")
        if fsp:
            frac = pc.utf8_slice_codeunits(
                pc.cast(pc.add(pc.remainder(micros, 1_000_000), 1_000_000), pa.string()), 1, 1 + fsp
            )
            text = pc.binary_join_element_wise(text, frac, ".")
        text = pc.binary_join_element_wise(text, "Z", "")
        zero = pc.and_(pc.is_null(micros), pc.is_valid(pa.array(values, type=pa.int64())))
        return pc.if_else(zero, pa.scalar(epoch, pa.string()), text)

    return convert


def _temporal(
    col: ColumnDef, modes: Modes
) -> tuple[pa.DataType, str, str | None, Callable[[list], pa.Array]]:
    mode, fsp, t = modes.time_precision, col.fsp or 0, col.data_type
    if t == "date":
        name = KAFKA + "Date" if mode == "connect" else DBZ + "Date"
        zero, adjust = _zero(col, 0), adjust_date if modes.time_adjuster else int
        return (
            pa.int32(),
            "int32",
            name,
            _ints(pa.int32(), lambda v: d if (d := epoch_days(adjust(v))) is not None else zero),
        )
    if t == "datetime":
        zero = _zero(col, 0)
        divisor, name = 1, DBZ + "MicroTimestamp"
        if mode == "connect" or fsp <= 3:
            divisor, name = 1000, KAFKA + "Timestamp" if mode == "connect" else DBZ + "Timestamp"
        convert = _datetimes(divisor, zero)
        spec = ("datetime", divisor, zero, modes.time_adjuster)
        if modes.time_adjuster:
            return (
                pa.int64(),
                "int64",
                name,
                columnar(lambda values: convert(adjust_datetimes(values)), *spec),
            )
        return pa.int64(), "int64", name, columnar(convert, *spec)
    if t == "timestamp":
        return pa.string(), "string", DBZ + "ZonedTimestamp", _timestamp_text(col)
    if t == "time":
        if mode == "connect" or (mode == "adaptive" and fsp <= 3):
            name = KAFKA + "Time" if mode == "connect" else DBZ + "Time"
            # millisecond Time is an int32: MySQL's +-838 h range does not fit it; such values become NULL
            return (
                pa.int32(),
                "int32",
                name,
                _ints(pa.int32(), lambda v: m if -(2**31) <= (m := v // 1000) < 2**31 else None),
            )
        return pa.int64(), "int64", DBZ + "MicroTime", _ints(pa.int64())
    return pa.int32(), "int32", DBZ + "Year", _ints(pa.int32())  # year


def _decimal(col: ColumnDef, mode: str) -> tuple[pa.DataType, str, str | None, dict | None, Callable]:
    if mode == "double":
        return pa.float64(), "float64", None, None, lambda v: pa.array(v, pa.string()).cast(pa.float64())
    if mode == "string":
        return pa.string(), "string", None, None, lambda v: pa.array(v, pa.string())
    p, s = col.precision or 10, col.scale or 0
    params = {"scale": str(s), "connect.decimal.precision": str(p)}
    if p > 38:
        # Parquet readers such as Spark stop at 38 digits: keep Debezium's own encoding, the
        # unscaled value as big-endian two's complement bytes (scale in the parameters)
        return pa.binary(), "bytes", KAFKA + "Decimal", params, _ints(pa.binary(), _unscaled_bytes(s))
    arrow = pa.decimal128(p, s)
    return (
        arrow,
        "bytes",
        KAFKA + "Decimal",
        params,
        columnar(lambda v: pa.array(v, pa.string()).cast(arrow), "decimal"),
    )


def _unscaled_bytes(scale: int) -> Callable[[str], bytes]:
    return lambda text: java_bigint_bytes(decimal_unscaled(Decimal(text), scale))


_INTEGER = {
    "tinyint": (pa.int16(), pa.int16()),
    "smallint": (pa.int16(), pa.int32()),
    "mediumint": (pa.int32(), pa.int32()),
    "int": (pa.int32(), pa.int64()),
    "bigint": (pa.int64(), pa.int64()),
}


def _int_bools(arrow_type: pa.DataType) -> Callable[[list], pa.Array]:
    return lambda values: pc.not_equal(pa.array(values, arrow_type), 0)


def _wrap64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def encoding(
    col: ColumnDef, modes: Modes, labels: list[str] | None = None
) -> tuple[pa.DataType, str, str | None, dict | None, Callable[[list], pa.Array]]:
    """(Arrow type, Connect type, semantic name, parameters, converter) of one column.

    :raises UnsupportedType: naming the type when Debezium has no mapping for it.
    """
    t = col.data_type
    if t in _INTEGER:
        one = t == "tinyint" and col.column_type.startswith("tinyint(1)")
        # a column declared BOOLEAN in a DDL Debezium parsed (JDBC BOOLEAN), or the converter
        if one and (col.boolean or modes.tinyint_one_boolean):
            return pa.bool_(), "boolean", None, None, columnar(_int_bools(pa.int16()), "bool")
        arrow = _INTEGER[t][1 if col.unsigned else 0]
        if t == "bigint" and col.unsigned:
            if modes.bigint_unsigned == "precise":
                return (
                    pa.decimal128(20, 0),
                    "bytes",
                    KAFKA + "Decimal",
                    {"scale": "0", "connect.decimal.precision": "20"},
                    lambda v: pa.array([None if x is None else str(x) for x in v]).cast(pa.decimal128(20, 0)),
                )
            return arrow, "int64", None, None, columnar(_ints(pa.int64(), _wrap64), "int")
        return arrow, str(arrow).replace("int", "int"), None, None, columnar(_ints(arrow), "int")
    if t in ("float", "double", "real"):
        # FLOAT(M,D) is FLOAT64 in Debezium's MySQL type mapping; FLOAT and FLOAT(p<=24) FLOAT32
        single = t == "float" and "," not in col.column_type
        arrow = pa.float32() if single else pa.float64()
        return arrow, "float32" if single else "float64", None, None, columnar(_ints(arrow), "float")
    if t == "decimal":
        return _decimal(col, modes.decimal)
    if t in ("date", "datetime", "timestamp", "time", "year"):
        arrow, ctype, name, conv = _temporal(col, modes)
        return arrow, ctype, name, None, conv
    if t == "bit":
        n = col.precision or 1
        if n == 1:
            return pa.bool_(), "boolean", None, None, columnar(_int_bools(pa.int64()), "bool")
        size = (n + 7) // 8
        return (
            pa.binary(),
            "bytes",
            DATA + "Bits",
            {"length": str(n)},
            _ints(pa.binary(), lambda x: x.to_bytes(size, "little")),
        )
    if t in ("enum", "set"):
        values = labels if labels is not None else col.values
        name = DATA + ("Enum" if t == "enum" else "EnumSet")
        fn = label_of(values, t == "set")
        return (
            pa.string(),
            "string",
            name,
            {"allowed": ",".join(values)},
            _ints(pa.string(), lambda v: v if isinstance(v, str) else fn(v)),
        )
    if t == "json":
        return pa.string(), "string", DATA + "Json", None, _text("utf8mb4")
    if t in ("char", "varchar") or t.endswith("text"):
        return pa.string(), "string", None, None, _text(col.charset)
    if t in ("binary", "varbinary") or t.endswith("blob"):
        arrow, ctype, conv = _binary(modes.binary, col.length if t == "binary" else None)
        return arrow, ctype, None, None, conv
    if t == "point":
        return POINT_TYPE, "struct", DATA + "geometry.Point", None, point
    if t in SPATIAL:
        return GEOMETRY_TYPE, "struct", DATA + "geometry.Geometry", None, geometry
    if modes.include_unknown:
        arrow, ctype, conv = _binary(modes.binary, None)
        return arrow, ctype, None, None, conv
    raise UnsupportedType(f"column {col.name!r} has unsupported type {col.column_type!r}")


def column_codec(col: ColumnDef, modes: Modes, labels: list[str] | None = None) -> MySqlCodec:
    """The codec of one column (``labels``: ENUM/SET values from the table map, if known)."""
    arrow, ctype, name, params, conv = encoding(col, modes, labels)
    meta = connect_metadata(ctype, name, params)
    meta[META_MYSQL_TYPE] = col.column_type.encode()
    return MySqlCodec(pa.field(col.name, arrow, nullable=True, metadata=meta), conv)


def key_text(value: Any) -> str | None:
    """The text form of a key value, identical for binlog and snapshot values (tracker keys)."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        # valid UTF-8 reads as the text the snapshot reads for utf8 columns; other bytes (binary
        # keys) as NUL + hex, which no decoded text starting without NUL can equal
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and not text.startswith("\0"):
            return text
        return "\0" + bytes(value).hex()
    return str(value)

"""Debezium semantic types (carried as Arrow field metadata in staged Parquet) to natural Spark types.

Bronze keeps the Debezium encoding (epoch days, micros, ``VariableScaleDecimal`` structs ...);
silver holds what a Spark user expects: ``DATE``, ``TIMESTAMP_NTZ`` for local timestamps,
``TIMESTAMP`` for zoned ones, ``DECIMAL(p,s)``, ``BINARY``, ``STRING`` for JSON/UUID/XML/enums.
Delta cannot store ``TIME`` or ``INTERVAL`` columns: times become ``[-]HH:mm:ss.SSSSSS`` strings
(hours beyond 23 kept: MySQL ``TIME`` spans +-838 h, PostgreSQL has ``24:00:00``) and durations
stay ``BIGINT`` micros (their Debezium encoding).  Decimals wider than Spark's 38 digits (MySQL
``DECIMAL(65, s)``, staged as Debezium's unscaled bytes) become exact strings, and MySQL
``BIGINT UNSIGNED`` staged as a wrapped ``int64`` (``bigint.unsigned.handling.mode=long``) is
unwrapped to ``DECIMAL(20,0)``, the type ``precise`` mode gives.  Every conversion is a Spark column
expression, so nothing round-trips through Python except the rare wide decimal.

The conversions assume the session time zone is UTC (the job and :func:`session.build` set it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

DBZ_TIME = "io.debezium.time."
KAFKA = "org.apache.kafka.connect.data."
META_NAME = b"connect.name"
META_PARAMS = b"connect.parameters"
MYSQL_TYPE = b"mysql.type"  # the column's MySQL type, next to the Connect metadata (MySQL sources)

Convert = Callable[[Column], Column]


@dataclass(frozen=True)
class Natural:
    """The silver type of one column and the expression that converts its bronze value."""

    spark_type: T.DataType
    convert: Convert
    semantic: str = ""


def _same(c: Column) -> Column:
    return c


def _strip_z(c: Column) -> Column:
    return F.regexp_replace(c, "Z$", "")


def _micros_to_ntz(c: Column) -> Column:
    return F.timestamp_micros(c).cast(T.TimestampNTZType())


def _floor_div(c: Column, n: int) -> Column:
    return ((c - F.pmod(c, F.lit(n))) / F.lit(n)).cast("long")


def _time_text(micros: Column) -> Column:
    """``[-]HH:mm:ss.SSSSSS`` of a time of day or a MySQL ``TIME`` duration (any sign, > 24 h)."""
    a = F.abs(micros.cast("long"))
    text = F.format_string(
        "%s%02d:%02d:%02d.%06d",
        F.when(micros < 0, F.lit("-")).otherwise(F.lit("")),
        F.floor(a / 3_600_000_000),
        F.floor(a / 60_000_000) % 60,
        F.floor(a / 1_000_000) % 60,
        a % 1_000_000,
    )
    return F.when(micros.isNotNull(), text)  # format_string writes "null" for NULL arguments


def _variable_scale_decimal(value: Column, scale: Column) -> Column:
    """A VariableScaleDecimal's text, by a Python UDF made at first use (a UDF made at import time
    belongs to whichever kind of session -- classic or Connect -- the process had then).  Its
    function is nested, so it is pickled by value: the executors' Python needs nothing of this
    package (a Spark Connect server's workers do not have it)."""

    def text(value: bytes | None, scale: int | None) -> str | None:
        from decimal import Decimal

        if value is None or scale is None:
            return None
        unscaled = int.from_bytes(value, "big", signed=True)
        # built from text: exact at any precision (scaleb would round to the context's 28 digits);
        # formatted without exponent notation (0E-10)
        return format(Decimal(f"{unscaled}E{-scale}"), "f")

    return F.udf(text, returnType=T.StringType())(value, scale)


def _unwrap_u64(c: Column) -> Column:
    """A ``BIGINT UNSIGNED`` value that Debezium's ``long`` mode wrapped into a signed int64."""
    u20 = T.DecimalType(20, 0)
    wide = c.cast(u20)
    return F.when(c < 0, wide + F.lit(str(1 << 64)).cast(u20)).otherwise(wide).cast(u20)


_BY_NAME: dict[str, tuple[T.DataType, Convert]] = {
    DBZ_TIME + "Date": (T.DateType(), lambda c: F.date_from_unix_date(c)),
    KAFKA + "Date": (T.DateType(), lambda c: F.date_from_unix_date(c)),
    DBZ_TIME + "IsoDate": (T.DateType(), lambda c: F.to_date(_strip_z(c))),
    DBZ_TIME + "Timestamp": (T.TimestampNTZType(), lambda c: _micros_to_ntz(c * 1000)),
    KAFKA + "Timestamp": (T.TimestampNTZType(), lambda c: _micros_to_ntz(c * 1000)),
    DBZ_TIME + "MicroTimestamp": (T.TimestampNTZType(), _micros_to_ntz),
    DBZ_TIME + "NanoTimestamp": (T.TimestampNTZType(), lambda c: _micros_to_ntz(_floor_div(c, 1000))),
    DBZ_TIME + "IsoTimestamp": (T.TimestampNTZType(), lambda c: F.to_timestamp_ntz(_strip_z(c))),
    DBZ_TIME + "ZonedTimestamp": (T.TimestampType(), lambda c: c.cast(T.TimestampType())),
    DBZ_TIME + "Time": (T.StringType(), lambda c: _time_text(c.cast("long") * 1000)),
    KAFKA + "Time": (T.StringType(), lambda c: _time_text(c.cast("long") * 1000)),
    DBZ_TIME + "MicroTime": (T.StringType(), _time_text),
    DBZ_TIME + "NanoTime": (T.StringType(), lambda c: _time_text(_floor_div(c, 1000))),
    DBZ_TIME + "IsoTime": (T.StringType(), _strip_z),
    "io.debezium.data.VariableScaleDecimal": (
        T.StringType(),
        lambda c: F.when(c.isNotNull(), _variable_scale_decimal(c["value"], c["scale"])),
    ),
}


def semantic_name(field: pa.Field) -> str:
    meta = field.metadata or {}
    return meta.get(META_NAME, b"").decode()


def _bytes_decimal(field: pa.Field) -> Natural:
    """Connect ``Decimal`` staged as its unscaled bytes (precision above Spark's 38): exact text."""
    params = json.loads((field.metadata or {}).get(META_PARAMS, b"{}"))
    scale = int(params.get("scale", 0))
    return Natural(
        T.StringType(),
        lambda c: F.when(c.isNotNull(), _variable_scale_decimal(c, F.lit(scale))),
        KAFKA + "Decimal",
    )


def _mysql_unsigned_bigint(field: pa.Field) -> bool:
    mysql_type = (field.metadata or {}).get(MYSQL_TYPE, b"").lower().split()
    return bool(mysql_type) and mysql_type[0].startswith(b"bigint") and b"unsigned" in mysql_type


def natural(field: pa.Field) -> Natural:
    """The silver type and conversion for one staged column (recursing into lists)."""
    name = semantic_name(field)
    arrow = field.type
    if name == KAFKA + "Decimal" and pa.types.is_binary(arrow):
        return _bytes_decimal(field)
    if name in _BY_NAME:
        spark_type, convert = _BY_NAME[name]
        return Natural(spark_type, convert, name)
    if pa.types.is_int64(arrow) and _mysql_unsigned_bigint(field):
        return Natural(T.DecimalType(20, 0), _unwrap_u64, name)
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        element = natural(arrow.value_field)
        if element.convert is _same:
            return Natural(T.ArrayType(element.spark_type, True), _same, name)
        return Natural(T.ArrayType(element.spark_type, True), lambda c: F.transform(c, element.convert), name)
    return Natural(arrow_to_spark(arrow), _same, name)


def arrow_to_spark(arrow: pa.DataType) -> T.DataType:
    """The Spark type Spark's Parquet reader gives an Arrow type (no semantic conversion)."""
    simple: dict[pa.DataType, T.DataType] = {
        pa.bool_(): T.BooleanType(),
        pa.int8(): T.ByteType(),
        pa.int16(): T.ShortType(),
        pa.int32(): T.IntegerType(),
        pa.int64(): T.LongType(),
        pa.float32(): T.FloatType(),
        pa.float64(): T.DoubleType(),
        pa.string(): T.StringType(),
        pa.large_string(): T.StringType(),
        pa.binary(): T.BinaryType(),
        pa.large_binary(): T.BinaryType(),
        pa.date32(): T.DateType(),
        pa.uint8(): T.ShortType(),
        pa.uint16(): T.IntegerType(),
        pa.uint32(): T.LongType(),
    }
    if arrow in simple:
        return simple[arrow]
    if pa.types.is_decimal(arrow):
        return T.DecimalType(arrow.precision, arrow.scale)
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        return T.ArrayType(arrow_to_spark(arrow.value_type), True)
    if pa.types.is_map(arrow):
        return T.MapType(arrow_to_spark(arrow.key_type), arrow_to_spark(arrow.item_type), True)
    if pa.types.is_struct(arrow):
        return T.StructType([T.StructField(f.name, arrow_to_spark(f.type), True) for f in arrow])
    if pa.types.is_timestamp(arrow):
        return T.TimestampNTZType() if arrow.tz is None else T.TimestampType()
    if pa.types.is_uint64(arrow):
        return T.DecimalType(20, 0)
    raise TypeError(f"no Spark type for Arrow type {arrow}")


#: Type changes Delta's type widening applies in place; anything else between two versions of
#: a column is refused before any table is written.
_WIDENS = {
    ("byte", "short"),
    ("byte", "integer"),
    ("byte", "long"),
    ("short", "integer"),
    ("short", "long"),
    ("integer", "long"),
    ("float", "double"),
    ("byte", "double"),
    ("short", "double"),
    ("integer", "double"),
    ("date", "timestamp_ntz"),
}


def widening(old: T.DataType, new: T.DataType) -> str:
    """Classify a column type change: ``same``, ``widen`` or ``incompatible``."""
    if old == new:
        return "same"
    if isinstance(old, T.DecimalType) and isinstance(new, T.DecimalType):
        if new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale:
            return "widen"
        return "incompatible"
    if isinstance(old, T.ArrayType) and isinstance(new, T.ArrayType):
        return widening(old.elementType, new.elementType)
    if isinstance(old, T.StructType) and isinstance(new, T.StructType):
        olds = {f.name: f.dataType for f in old.fields}
        kinds = {widening(olds[f.name], f.dataType) for f in new.fields if f.name in olds}
        return "incompatible" if "incompatible" in kinds else ("widen" if kinds - {"same"} else "same")
    if (old.typeName(), new.typeName()) in _WIDENS:
        return "widen"
    return "incompatible"


def refused(stored: T.DataType, incoming: T.DataType) -> bool:
    """A change Delta cannot take: not the same, not a widening, and not an older, narrower
    version of the column (which is cast up on write)."""
    return widening(stored, incoming) == "incompatible" and widening(incoming, stored) != "widen"


def wider(a: T.DataType, b: T.DataType) -> T.DataType:
    """The type both ``a`` and ``b`` widen to (``b`` when it is the newer, incompatible one)."""
    if widening(a, b) in ("same", "widen"):
        return b
    if widening(b, a) == "widen":
        return a
    return b

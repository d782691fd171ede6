"""PostgreSQL column values -> Debezium-encoded Arrow arrays.

Captured values arrive as the server's text output (``COPY ... (FORMAT csv)`` and pgoutput
text tuples, with ``DateStyle=ISO``, ``IntervalStyle=postgres``, ``extra_float_digits=1``,
``TimeZone=UTC``, ``bytea_output=hex``).  :func:`column_codec` picks, once per column, the
representation Debezium's PostgreSQL connector (3.3, the version of our reference document)
gives the type -- its Kafka Connect literal type, semantic name and parameters -- and returns a
:class:`ColumnCodec` that converts whole text columns at once.

Representation choices that differ from Kafka Connect's wire form, for Parquet:
``Decimal`` values are Arrow ``decimal128(p, s)`` (the metadata still says ``bytes`` +
``org.apache.kafka.connect.data.Decimal``); :mod:`airflow_cdc.core.connect_json` renders the
Connect JSON from the metadata.  Per-type details live in the ``types_*`` modules.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from airflow_cdc.core.errors import ConfigError, ProtocolError, UnsupportedType
from airflow_cdc.sources.postgres import types_misc as misc
from airflow_cdc.sources.postgres.types_array import array_encoding
from airflow_cdc.sources.postgres.types_base import Convert, Encoding
from airflow_cdc.sources.postgres.types_numeric import money_encoding, numeric_encoding
from airflow_cdc.sources.postgres.types_numeric import simple_numeric_encoding as number_encoding
from airflow_cdc.sources.postgres.types_temporal import temporal_encoding

__all__ = ["ColumnCodec", "HandlingModes", "PgTypeInfo", "column_codec"]


@dataclass(frozen=True)
class PgTypeInfo:
    """A ``pg_type`` row, resolved by the caller (arrays' elements and domains' bases included)."""

    oid: int
    name: str
    kind: str = "b"
    element: PgTypeInfo | None = None
    base: PgTypeInfo | None = None
    base_typmod: int = -1
    enum_labels: tuple[str, ...] = ()


_CHOICES = {
    "decimal": ("decimal.handling.mode", ("precise", "double", "string")),
    "time_precision": (
        "time.precision.mode",
        ("adaptive", "adaptive_time_microseconds", "connect", "isostring", "microseconds", "nanoseconds"),
    ),
    "binary": ("binary.handling.mode", ("bytes", "base64", "base64-url-safe", "hex")),
    "interval": ("interval.handling.mode", ("numeric", "string")),
    "hstore": ("hstore.handling.mode", ("json", "map")),
}


@dataclass(frozen=True)
class HandlingModes:
    """Debezium's value handling properties (defaults are Debezium's).

    Values are matched case-insensitively and stored lower-case.

    :raises ConfigError: naming the property whose value is not allowed.
    """

    decimal: str = "precise"  # decimal.handling.mode
    time_precision: str = "adaptive"  # time.precision.mode
    binary: str = "bytes"  # binary.handling.mode
    interval: str = "numeric"  # interval.handling.mode
    hstore: str = "json"  # hstore.handling.mode
    money_fraction_digits: int = 2  # money.fraction.digits
    include_unknown_datatypes: bool = False  # include.unknown.datatypes
    unavailable_value_placeholder: str = "__debezium_unavailable_value"  # unavailable.value.placeholder

    def __post_init__(self) -> None:
        for attr, (prop, allowed) in _CHOICES.items():
            given = getattr(self, attr)
            value = str(given).strip().lower()
            if value not in allowed:
                raise ConfigError(f"property {prop!r}: {given!r} is not one of {', '.join(allowed)}")
            object.__setattr__(self, attr, value)
        digits = self.money_fraction_digits
        if not isinstance(digits, int) or not 0 <= digits <= 18:
            raise ConfigError(f"property 'money.fraction.digits': {digits!r} is not an integer in 0..18")

    def placeholder_bytes(self) -> bytes:
        """Return ``unavailable.value.placeholder`` as bytes (``hex:`` prefix = hex-encoded bytes)."""
        text = self.unavailable_value_placeholder
        return bytes.fromhex(text[4:]) if text.startswith("hex:") else text.encode()


class ColumnCodec:
    """Converts one column's text output into its Debezium encoding.

    ``field`` is the Arrow field (nullable) whose metadata holds the Connect schema
    (``connect.type``, ``connect.name``, ``connect.version``, ``connect.parameters``) and the
    PostgreSQL type (``pg.type``).  ``placeholder`` is the value of ``field.type`` that stands
    for an unchanged TOAST value, or ``None`` when the type cannot hold one.
    """

    __slots__ = ("_convert", "field", "placeholder")

    def __init__(self, field: pa.Field, placeholder: pa.Scalar | None, convert: Convert) -> None:
        self.field = field
        self.placeholder = placeholder
        self._convert = convert

    def __repr__(self) -> str:
        return f"ColumnCodec({self.field.name!r}, {self.field.type})"

    def convert(self, text: pa.Array | pa.ChunkedArray) -> pa.Array:
        """Convert a column of text values (nulls are SQL NULLs) into ``field.type``.

        Repeatable and side-effect free; the result has the same length as ``text``.

        :raises ProtocolError: a value is not valid text output of the column's type.
        """
        if isinstance(text, pa.ChunkedArray):
            # one chunk (a snapshot chunk's column): that array as it is -- ``combine_chunks``
            # copies even a single chunk, all the bytes of a pass-through text column
            text = text.chunk(0) if text.num_chunks == 1 else text.combine_chunks()
        if not pa.types.is_string(text.type):
            text = text.cast(pa.string())
        try:
            out = self._convert(text)
        except (ValueError, IndexError, ArithmeticError, pa.ArrowException) as e:
            pg_type = self.field.metadata[b"pg.type"].decode()
            raise ProtocolError(f"column {self.field.name!r} ({pg_type}): cannot convert value: {e}") from e
        return out if out.type == self.field.type else out.cast(self.field.type)


def _type_text(info: PgTypeInfo, typmod: int) -> str:
    """Return the type as written in DDL-ish form: ``numeric(10,2)``, ``varchar(20)``, ``_int4``."""
    name = info.name
    core = info.element.name if info.element is not None else name
    if typmod < 0:
        return name
    if core == "numeric" and typmod >= 4:
        raw = typmod - 4
        return f"{name}({(raw >> 16) & 0xFFFF},{((raw & 0x7FF) ^ 1024) - 1024})"
    if core in ("varchar", "bpchar") and typmod >= 4:
        return f"{name}({typmod - 4})"
    if core in ("bit", "varbit", "time", "timetz", "timestamp", "timestamptz"):
        return f"{name}({typmod})"
    if core == "interval" and typmod & 0xFFFF != 0xFFFF:
        return f"{name}({typmod & 0xFFFF})"
    return name


def _base_encoding(name: str, typmod: int, modes: HandlingModes) -> Encoding | None:
    """Encoding of a base (or builtin range) type by ``typname``, or ``None`` if unsupported."""
    found = (
        misc.string_encoding(name)
        or number_encoding(name)
        or temporal_encoding(name, typmod, modes.time_precision, modes.interval)
        or misc.vector_encoding(name)
    )
    if found is not None:
        return found
    if name == "bool":
        return misc.boolean_encoding()
    if name in ("bit", "varbit"):
        return misc.bits_encoding(name, typmod)
    if name == "numeric":
        return numeric_encoding(typmod, modes.decimal)
    if name == "money":
        return money_encoding(modes.decimal, modes.money_fraction_digits)
    if name == "bytea":
        return misc.bytea_encoding(modes.binary)
    if name == "hstore":
        return misc.hstore_encoding(modes.hstore)
    if name == "point":
        return misc.point_encoding()
    return None


def resolve_encoding(info: PgTypeInfo, typmod: int, modes: HandlingModes, depth: int = 0) -> Encoding | None:
    """Return the encoding of a type, or ``None`` when Debezium does not support it.

    Domains resolve to their base type with the domain's own typmod when it has one; arrays
    wrap their element's encoding.

    :param info: the column type.
    :param typmod: the column's ``atttypmod`` (for arrays and domains: applies to the element/base).
    :param modes: handling modes.
    :param depth: recursion guard for domain chains.
    """
    if depth > 32:
        return None
    if info.kind == "d" and info.base is not None:
        base_typmod = info.base_typmod if info.base_typmod >= 0 else typmod
        return resolve_encoding(info.base, base_typmod, modes, depth + 1)
    if info.kind == "e":
        return misc.enum_encoding(info.enum_labels)
    if info.element is not None:
        element = resolve_encoding(info.element, typmod, modes, depth + 1)
        if element is None or element.connect_type == "array":
            return None
        return array_encoding(element, _root_name(info.element))
    if info.kind not in ("b", "r"):
        return None  # composite, pseudo, multirange: not mapped by Debezium
    return _base_encoding(info.name, typmod, modes)


def _root_name(info: PgTypeInfo) -> str:
    while info.kind == "d" and info.base is not None:
        info = info.base
    return info.name


def _placeholder(enc: Encoding, modes: HandlingModes) -> pa.Scalar | None:
    raw = modes.placeholder_bytes()
    text = raw.decode("utf-8", errors="replace")
    if enc.placeholder is not None:
        value = enc.placeholder(text, raw)
    elif pa.types.is_string(enc.arrow_type):
        value = text
    elif pa.types.is_binary(enc.arrow_type):
        value = raw
    else:
        return None
    return None if value is None else pa.scalar(value, type=enc.arrow_type)


def column_codec(name: str, type_info: PgTypeInfo, typmod: int, modes: HandlingModes) -> ColumnCodec:
    """Return the codec for one column.

    :param name: column name (the Arrow field name).
    :param type_info: the column's type from ``pg_type``.
    :param typmod: the column's ``atttypmod`` (-1 when none).
    :param modes: handling modes.
    :raises UnsupportedType: Debezium has no mapping for the type and
        ``include.unknown.datatypes`` is false.  With it true, such columns carry the text
        output's UTF-8 bytes (encoded per ``binary.handling.mode``) without a semantic name.
    """
    enc = resolve_encoding(type_info, typmod, modes)
    if enc is None:
        if not modes.include_unknown_datatypes:
            raise UnsupportedType(
                f"column {name!r} has unsupported type {_type_text(type_info, typmod)!r} "
                f"(oid {type_info.oid}, typtype {type_info.kind!r})"
            )
        enc = misc.unknown_encoding(modes.binary)
    metadata = enc.metadata(_type_text(type_info, typmod))
    field = pa.field(name, enc.arrow_type, nullable=True, metadata=metadata)
    return ColumnCodec(field, _placeholder(enc, modes), enc.convert)

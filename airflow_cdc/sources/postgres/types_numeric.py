"""Integer, floating-point, ``NUMERIC`` and ``MONEY`` codecs, per ``decimal.handling.mode``.

``precise`` mode declares Kafka Connect ``Decimal`` (BYTES) as Debezium does; we hold the
values as Arrow ``decimal128(p, s)`` so Parquet gets a real DECIMAL.  Unconstrained
``NUMERIC`` (and ``NUMERIC(p, s)`` with ``p > 38``, which ``decimal128`` cannot hold) becomes
``io.debezium.data.VariableScaleDecimal``: ``struct{scale, value}`` with the unscaled value as
big-endian two's complement bytes, trailing zeros stripped as Debezium does.

``NaN`` and ``±Infinity`` have no ``Decimal`` representation.  Debezium stops the connector on
them in ``precise`` mode; we write ``null`` instead so one special value cannot wedge capture
forever (``double`` mode gives IEEE NaN/±inf, ``string`` mode ``NAN``/``POSITIVE_INFINITY``/
``NEGATIVE_INFINITY`` as Debezium does).
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import pyarrow as pa
import pyarrow.compute as pc

from airflow_cdc.core.connect_json import java_bigint_bytes
from airflow_cdc.sources.postgres.types_base import (
    NULL_STRING,
    Convert,
    Encoding,
    connect_field,
    rowwise,
)

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
PRECISION_KEY = "connect.decimal.precision"
SPECIALS = {"NaN": "NAN", "Infinity": "POSITIVE_INFINITY", "-Infinity": "NEGATIVE_INFINITY"}
_SPECIAL_SET = pa.array(list(SPECIALS))

VSD_DOC = "Variable scaled decimal"
VSD_TYPE = pa.struct(
    [
        connect_field("scale", pa.int32(), "int32", nullable=False),
        connect_field("value", pa.binary(), "bytes", nullable=False),
    ]
)


def _cast(arrow_type: pa.DataType) -> Convert:
    return lambda text: pc.cast(text, arrow_type)


INTEGERS = {
    "int2": (pa.int16(), "int16"),
    "int4": (pa.int32(), "int32"),
    "int8": (pa.int64(), "int64"),
    "oid": (pa.int64(), "int64"),
}


def simple_numeric_encoding(name: str) -> Encoding | None:
    """Return the encoding of an integer or floating-point type name, else ``None``."""
    if name in INTEGERS:
        arrow_type, connect_type = INTEGERS[name]
        return Encoding(arrow_type, connect_type, _cast(arrow_type))
    if name == "float4":
        return Encoding(pa.float32(), "float32", _cast(pa.float32()))
    if name == "float8":
        return Encoding(pa.float64(), "float64", _cast(pa.float64()))
    return None


def numeric_typmod(typmod: int) -> tuple[int, int] | None:
    """Decode ``numeric(p, s)``'s typmod, or ``None`` when unconstrained.

    PostgreSQL 15 stores the scale as 11-bit two's complement (it may be negative or exceed p).
    """
    if typmod < 4:
        return None
    raw = typmod - 4
    return (raw >> 16) & 0xFFFF, ((raw & 0x7FF) ^ 1024) - 1024


def _without_specials(text: pa.Array) -> pa.Array:
    special = pc.is_in(text, value_set=_SPECIAL_SET)
    return pc.if_else(special, NULL_STRING, text)


def _decimal(arrow_type: pa.DataType) -> Convert:
    def convert(text: pa.Array) -> pa.Array:
        try:
            return pc.cast(text, arrow_type)
        except pa.ArrowInvalid:
            return pc.cast(_without_specials(text), arrow_type)

    return convert


def vsd_parts(text: str) -> tuple[int, bytes] | None:
    """Return VariableScaleDecimal's (scale, unscaled bytes) of a numeric text, ``None`` for NaN/Inf.

    Like ``BigDecimal.stripTrailingZeros()`` followed by ``setScale(0)`` when the scale
    turns negative: ``1.10`` -> (1, 11); ``100`` -> (0, 100); ``0.000`` -> (0, 0).
    """
    if text in SPECIALS:
        return None
    whole, _, frac = text.lstrip("-").partition(".")
    frac = frac.rstrip("0")
    unscaled = int(whole + frac)
    return len(frac), java_bigint_bytes(-unscaled if text.startswith("-") else unscaled)


def _variable_scale(text: pa.Array) -> pa.Array:
    parts = [None if t is None else vsd_parts(t) for t in text.to_pylist()]
    scales = pa.array([p[0] if p else 0 for p in parts], pa.int32())
    values = pa.array([p[1] if p else b"" for p in parts], pa.binary())
    mask = pa.array([p is None for p in parts], pa.bool_())
    return pa.StructArray.from_arrays([scales, values], fields=list(VSD_TYPE), mask=mask)


def _special_names(text: pa.Array) -> pa.Array:
    for special, name in SPECIALS.items():
        text = pc.if_else(pc.equal(text, special), name, text)
    return text


def numeric_encoding(typmod: int, mode: str) -> Encoding:
    """Return the ``NUMERIC[(p[, s])]`` encoding for a ``decimal.handling.mode``."""
    if mode == "double":
        return Encoding(pa.float64(), "float64", _cast(pa.float64()))
    if mode == "string":
        return Encoding(pa.string(), "string", _special_names)
    precision, scale = numeric_typmod(typmod) or (0, 0)
    # Arrow/Parquet decimals need 0 <= scale <= precision: widen to hold PostgreSQL 15's
    # negative scales (integers) and scales above the precision.
    arrow_precision = max(precision + max(-scale, 0), scale)
    if precision < 1 or arrow_precision > 38:
        return Encoding(VSD_TYPE, "struct", _variable_scale, VARIABLE_SCALE_DECIMAL, doc=VSD_DOC)
    arrow_type = pa.decimal128(arrow_precision, max(scale, 0))
    params = {"scale": str(scale), PRECISION_KEY: str(precision)}
    return Encoding(arrow_type, "bytes", _decimal(arrow_type), DECIMAL, params)


def parse_money(text: str) -> Decimal:
    """Parse ``money`` output (``$1,234.56``, ``-$1,234.56``, ``($1,234.56)``) in a '.'-decimal locale."""
    negative = text.startswith("-") or text.startswith("(")
    digits = "".join(ch for ch in text if ch.isdigit() or ch == ".")
    value = Decimal(digits)
    return -value if negative else value


def money_encoding(mode: str, fraction_digits: int) -> Encoding:
    """Return the ``MONEY`` encoding; ``precise`` uses ``money.fraction.digits`` as the scale."""
    if mode == "double":
        return Encoding(pa.float64(), "float64", rowwise(pa.float64(), lambda v: float(parse_money(v))))
    if mode == "string":
        return Encoding(pa.string(), "string", rowwise(pa.string(), lambda v: f"{parse_money(v):f}"))
    arrow_type = pa.decimal128(min(38, 19 + fraction_digits), fraction_digits)
    quantum = Decimal(1).scaleb(-fraction_digits)

    convert = rowwise(arrow_type, lambda v: parse_money(v).quantize(quantum, ROUND_HALF_UP))
    return Encoding(arrow_type, "bytes", convert, DECIMAL, {"scale": str(fraction_digits)})

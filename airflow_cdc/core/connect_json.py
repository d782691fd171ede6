"""Render Arrow-held change-event values the way Kafka Connect's ``JsonConverter`` would.

Source codecs store each column as an Arrow field whose metadata carries the Kafka Connect
schema Debezium declares (``connect.type``, ``connect.name``, ``connect.version``,
``connect.doc``, ``connect.parameters``).  This module turns such a field into the Connect
JSON schema fragment and a converted Python value into the JSON payload value, with the
converter's defaults (``decimal.format=BASE64``, ``schemas.enable=true``):

* ``Decimal`` -> base64 of the unscaled value's big-endian two's complement bytes;
* BYTES -> base64; FLOAT32 -> the number Java's ``Float.toString`` prints; NaN/Infinity ->
  the strings Jackson writes for them;
* MAP with STRING keys -> JSON object, other keys -> array of ``[key, value]`` pairs;
* STRUCT -> object in schema field order; ARRAY -> list.

The result is plain JSON-compatible Python (``json.dumps`` it as is).
"""

from __future__ import annotations

import base64
import json
import math
from decimal import Decimal
from typing import Any

import pyarrow as pa

from airflow_cdc.core.java_numbers import java_float_value

DECIMAL = "org.apache.kafka.connect.data.Decimal"

#: Connect literal type -> the name its JSON schema uses.
JSON_TYPE_NAMES = {"float32": "float", "float64": "double"}

_ARROW_CONNECT_TYPES = [
    (pa.types.is_int8, "int8"),
    (pa.types.is_int16, "int16"),
    (pa.types.is_int32, "int32"),
    (pa.types.is_int64, "int64"),
    (pa.types.is_float32, "float32"),
    (pa.types.is_float64, "float64"),
    (pa.types.is_boolean, "boolean"),
    (pa.types.is_string, "string"),
    (pa.types.is_large_string, "string"),
    (pa.types.is_binary, "bytes"),
    (pa.types.is_large_binary, "bytes"),
    (pa.types.is_decimal, "bytes"),
    (pa.types.is_list, "array"),
    (pa.types.is_large_list, "array"),
    (pa.types.is_map, "map"),
    (pa.types.is_struct, "struct"),
]


def java_bigint_bytes(value: int) -> bytes:
    """Return ``BigInteger.toByteArray()``: minimal big-endian two's complement (0 -> ``00``)."""
    length = ((value if value >= 0 else ~value).bit_length() + 8) // 8
    return value.to_bytes(length, "big", signed=True)


def _meta(field: pa.Field, key: bytes) -> str | None:
    raw = (field.metadata or {}).get(key)
    return raw.decode() if raw is not None else None


def connect_type(field: pa.Field) -> str:
    """Return the field's Connect literal type (from metadata, else inferred from the Arrow type).

    :raises ValueError: the Arrow type has no Connect counterpart.
    """
    declared = _meta(field, b"connect.type")
    if declared:
        return declared
    for test, name in _ARROW_CONNECT_TYPES:
        if test(field.type):
            return name
    raise ValueError(f"field {field.name!r}: Arrow type {field.type} has no Kafka Connect type")


def _parameters(field: pa.Field) -> dict[str, str] | None:
    raw = _meta(field, b"connect.parameters")
    return json.loads(raw) if raw else None


def connect_schema(field: pa.Field, *, include_name: bool = True) -> dict[str, Any]:
    """Return the Connect JSON schema fragment of a field, keys in ``JsonConverter`` order.

    e.g. ``{"type": "int32", "optional": true, "name": "io.debezium.time.Date", "version": 1,
    "field": "d"}``.

    :param field: Arrow field with Connect metadata (nested fields may carry their own).
    :param include_name: add ``"field": <name>`` (as a struct member's schema has).
    """
    ctype = connect_type(field)
    schema: dict[str, Any] = {"type": JSON_TYPE_NAMES.get(ctype, ctype)}
    arrow_type = field.type
    if ctype == "array":
        schema["items"] = connect_schema(arrow_type.value_field, include_name=False)
    elif ctype == "map":
        schema["keys"] = connect_schema(arrow_type.key_field, include_name=False)
        schema["values"] = connect_schema(arrow_type.item_field, include_name=False)
    elif ctype == "struct":
        schema["fields"] = [connect_schema(child) for child in arrow_type]
    schema["optional"] = field.nullable
    for key in ("name", "version", "doc"):
        value = _meta(field, b"connect." + key.encode())
        if value is not None:
            schema[key] = int(value) if key == "version" else value
    params = _parameters(field)
    if params:
        schema["parameters"] = params
    if include_name:
        schema["field"] = field.name
    return schema


def decimal_unscaled(value: Decimal, scale: int) -> int:
    """Return the unscaled integer of ``value`` at ``scale`` (exact; no context rounding)."""
    sign, digits, exponent = value.as_tuple()
    unscaled = int("".join(map(str, digits)) or "0")
    shift = int(exponent) + scale
    unscaled = unscaled * 10**shift if shift >= 0 else unscaled // 10**-shift
    return -unscaled if sign else unscaled


def _render_float(value: float, ctype: str) -> float | str:
    # JsonConverter writes FLOAT32 through Jackson as Java's Float.toString text (see
    # core.java_numbers); returning that decimal as a Python float gives a JSON reader the
    # same number.  Jackson quotes the non-finite values (WRITE_NAN_AS_STRINGS, on by default).
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return java_float_value(value) if ctype == "float32" else value


def _render_map(value: Any, field: pa.Field) -> Any:
    pairs = value.items() if isinstance(value, dict) else value
    key_field, item_field = field.type.key_field, field.type.item_field
    if connect_type(key_field) == "string":
        return {k: to_connect_json(v, item_field) for k, v in pairs}
    return [[to_connect_json(k, key_field), to_connect_json(v, item_field)] for k, v in pairs]


def to_connect_json(value: Any, field: pa.Field) -> Any:
    """Render one value (as from ``array.to_pylist()``) as ``JsonConverter`` puts it in a payload.

    :param value: the Python value of one row of a column converted by a source codec.
    :param field: that column's Arrow field with its Connect metadata.
    """
    if value is None:
        return None
    ctype = connect_type(field)
    if _meta(field, b"connect.name") == DECIMAL and not isinstance(value, bytes):
        scale = int((_parameters(field) or {}).get("scale", 0))
        return base64.b64encode(java_bigint_bytes(decimal_unscaled(value, scale))).decode()
    if ctype == "bytes":
        return base64.b64encode(value).decode()
    if ctype in ("float32", "float64"):
        return _render_float(value, ctype)
    if ctype == "array":
        item = field.type.value_field
        return [to_connect_json(v, item) for v in value]
    if ctype == "map":
        return _render_map(value, field)
    if ctype == "struct":
        return {child.name: to_connect_json(value.get(child.name), child) for child in field.type}
    return value

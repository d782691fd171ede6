"""Codecs for boolean, bit strings, ``bytea``, text-like types, ``hstore``, ``point``, pgvector
and unknown types.

Maps that Debezium builds as ``java.util.HashMap`` (hstore, sparse vectors) are emitted in that
map's iteration order, so JSON strings match Debezium's byte for byte.
"""

from __future__ import annotations

import base64
import re
import struct
from collections.abc import Callable, Sequence
from functools import lru_cache

import pyarrow as pa
import pyarrow.compute as pc

from airflow_cdc.sources.postgres.types_base import (
    Encoding,
    connect_field,
    identity,
    rowwise,
)

DATA = "io.debezium.data."

#: Types whose text output Debezium passes through as a STRING, with their semantic name.
STRING_TYPES: dict[str, str | None] = {
    "text": None,
    "varchar": None,
    "bpchar": None,
    "char": None,
    "name": None,
    "citext": None,
    "inet": None,
    "cidr": None,
    "macaddr": None,
    "macaddr8": None,
    "isbn": None,
    "int4range": None,
    "int8range": None,
    "numrange": None,
    "tsrange": None,
    "tstzrange": None,
    "daterange": None,
    "json": DATA + "Json",
    "jsonb": DATA + "Json",
    "xml": DATA + "Xml",
    "uuid": DATA + "Uuid",
    "ltree": DATA + "Ltree",
    "tsvector": DATA + "Tsvector",
}


def string_encoding(name: str) -> Encoding | None:
    """Return the pass-through STRING encoding of a text-like type name, else ``None``."""
    if name not in STRING_TYPES:
        return None
    return Encoding(pa.string(), "string", identity, STRING_TYPES[name])


def enum_encoding(labels: Sequence[str]) -> Encoding:
    """Return ``io.debezium.data.Enum`` with the labels in the ``allowed`` parameter."""
    return Encoding(pa.string(), "string", identity, DATA + "Enum", {"allowed": ",".join(labels)})


def boolean_encoding() -> Encoding:
    """Return the ``bool`` encoding (text ``t``/``f``)."""
    return Encoding(pa.bool_(), "boolean", lambda text: pc.equal(text, "t"))


# -- bit strings --------------------------------------------------------------------------------


def bits_bytes(text: str) -> bytes:
    """Return ``io.debezium.data.Bits`` bytes: ``BitSet.toByteArray()`` of the bit string.

    The rightmost bit is bit 0; bytes are little-endian and only as long as the highest set
    bit needs (``'00'`` -> empty, ``'101'`` -> ``05``, ``'1000000000'`` -> ``00 02``).
    """
    value = int(text, 2) if text else 0
    return value.to_bytes((value.bit_length() + 7) // 8, "little")


def bits_encoding(name: str, typmod: int) -> Encoding:
    """Return ``bit(n)``/``varbit(n)``: BOOLEAN for length 1, else Bits with a ``length`` parameter."""
    length = typmod if typmod >= 0 else (2**31 - 1 if name == "varbit" else 1)
    if length <= 1:
        return Encoding(pa.bool_(), "boolean", lambda text: pc.match_substring(text, "1"))
    return Encoding(
        pa.binary(), "bytes", rowwise(pa.binary(), bits_bytes), DATA + "Bits", {"length": str(length)}
    )


# -- binary ---------------------------------------------------------------------------------------

_ENCODERS: dict[str, Callable[[bytes], str]] = {
    "base64": lambda b: base64.b64encode(b).decode(),
    "base64-url-safe": lambda b: base64.urlsafe_b64encode(b).decode(),
    "hex": lambda b: b.hex(),
}


def _unhex(text: str) -> bytes:
    return bytes.fromhex(text[2:])  # bytea_output=hex: \x0a0b...


def bytea_encoding(mode: str) -> Encoding:
    """Return the ``bytea`` encoding (hex text output) for a ``binary.handling.mode``."""
    if mode == "bytes":
        return Encoding(pa.binary(), "bytes", rowwise(pa.binary(), _unhex))
    if mode == "hex":  # the server already prints lowercase hex after the \x
        return Encoding(pa.string(), "string", lambda t: pc.utf8_slice_codeunits(t, 2))
    encode = _ENCODERS[mode]
    return Encoding(pa.string(), "string", rowwise(pa.string(), lambda v: encode(_unhex(v))))


def unknown_encoding(mode: str) -> Encoding:
    """Return the ``include.unknown.datatypes`` encoding: the text's UTF-8 bytes, per binary mode."""
    if mode == "bytes":
        return Encoding(pa.binary(), "bytes", lambda t: pc.cast(t, pa.binary()))
    encode = _ENCODERS[mode]
    return Encoding(pa.string(), "string", rowwise(pa.string(), lambda v: encode(v.encode())))


# -- hstore ---------------------------------------------------------------------------------------

_HSTORE_PAIR = re.compile(r'"((?:[^"\\]|\\.)*)"\s*=>\s*(?:"((?:[^"\\]|\\.)*)"|(NULL))', re.S)
_UNESCAPE = re.compile(r"\\(.)", re.S)
_JSON_ESCAPES = {i: f"\\u{i:04X}" for i in range(32)}
_JSON_ESCAPES.update({8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r", 34: '\\"', 92: "\\\\"})


@lru_cache(maxsize=65536)
def java_string_hash(text: str) -> int:
    """Return ``String.hashCode()`` as an unsigned 32-bit int."""
    units = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    return h


def java_hashmap_order(hashes: Sequence[int], initial_capacity: int = 16) -> list[int]:
    """Return the iteration order of keys put into a ``java.util.HashMap`` in the given order.

    :param hashes: the keys' ``hashCode()`` values (unsigned 32-bit), in insertion order.
    :param initial_capacity: the map's constructor argument (16 for ``new HashMap<>()``).
    """
    capacity = 1
    while capacity < initial_capacity:
        capacity *= 2
    for size in range(1, len(hashes) + 1):
        if size > int(capacity * 0.75):
            capacity *= 2
    buckets = [(h ^ (h >> 16)) & (capacity - 1) for h in hashes]
    return sorted(range(len(hashes)), key=lambda i: (buckets[i], i))


def hstore_pairs(text: str) -> list[tuple[str, str | None]]:
    """Parse hstore output into (key, value) pairs in Debezium's HashMap order."""
    if "\\" in text:
        pairs = [
            (_UNESCAPE.sub(r"\1", k), None if null else _UNESCAPE.sub(r"\1", v))
            for k, v, null in _HSTORE_PAIR.findall(text)
        ]
    else:
        pairs = [(k, None if null else v) for k, v, null in _HSTORE_PAIR.findall(text)]
    if len(pairs) < 2:
        return pairs
    return [pairs[i] for i in java_hashmap_order([java_string_hash(k) for k, _ in pairs])]


def json_string(text: str) -> str:
    """Quote a string as Jackson does (control characters as upper-case ``\\uXXXX``)."""
    return '"' + text.translate(_JSON_ESCAPES) + '"'


def hstore_json(pairs: Sequence[tuple[str, str | None]]) -> str:
    """Render pairs as Debezium's compact JSON object (``{"k":"v","n":null}``)."""
    body = ",".join(f"{json_string(k)}:{'null' if v is None else json_string(v)}" for k, v in pairs)
    return "{" + body + "}"


HSTORE_MAP = pa.map_(pa.string(), pa.string())


def hstore_encoding(mode: str) -> Encoding:
    """Return the ``hstore`` encoding for an ``hstore.handling.mode``."""
    if mode == "map":
        return Encoding(
            HSTORE_MAP, "map", rowwise(HSTORE_MAP, hstore_pairs), placeholder=lambda text, _: [(text, text)]
        )
    return Encoding(
        pa.string(),
        "string",
        rowwise(pa.string(), lambda v: hstore_json(hstore_pairs(v))),
        DATA + "Json",
        placeholder=lambda text, _: hstore_json([(text, text)]),
    )


# -- geometric / vectors ------------------------------------------------------------------------

POINT_TYPE = pa.struct(
    [
        connect_field("x", pa.float64(), "float64", nullable=False),
        connect_field("y", pa.float64(), "float64", nullable=False),
        connect_field("wkb", pa.binary(), "bytes"),
        connect_field("srid", pa.int32(), "int32"),
    ]
)


def point_value(text: str) -> dict[str, object]:
    """Return ``io.debezium.data.geometry.Point`` of ``(x,y)``: coordinates plus 21-byte OGC WKB."""
    x_text, y_text = text.strip().strip("()").split(",")
    x, y = float(x_text), float(y_text)
    return {"x": x, "y": y, "wkb": struct.pack("<BIdd", 1, 1, x, y), "srid": None}


def point_encoding() -> Encoding:
    """Return the ``point`` encoding."""
    return Encoding(
        POINT_TYPE,
        "struct",
        rowwise(POINT_TYPE, point_value),
        "io.debezium.data.geometry.Point",
        doc="Geometry (POINT)",
    )


def vector_values(text: str) -> list[float]:
    """Return the elements of pgvector's ``[x,y,...]`` output."""
    return [float(x) for x in text.strip()[1:-1].split(",") if x.strip()]


SPARSE_MAP = pa.map_(pa.int16(), pa.field("value", pa.float64(), nullable=False))
SPARSE_TYPE = pa.struct(
    [
        connect_field("dimensions", pa.int16(), "int16", nullable=False),
        connect_field("vector", SPARSE_MAP, "map", nullable=False),
    ]
)


def sparse_vector_value(text: str) -> dict[str, object]:
    """Return ``io.debezium.data.SparseDoubleVector`` of ``{i:x,...}/dims`` (HashMap order)."""
    body, _, dims = text.strip().partition("/")
    entries = [e.split(":") for e in body.strip()[1:-1].split(",") if e.strip()]
    pairs = [(int(i), float(x)) for i, x in entries]
    order = java_hashmap_order([i & 0xFFFFFFFF for i, _ in pairs], max(len(pairs), 1))
    return {"dimensions": int(dims), "vector": [pairs[i] for i in order]}


def vector_encoding(name: str) -> Encoding | None:
    """Return the pgvector encodings (``vector``, ``halfvec``, ``sparsevec``), else ``None``."""
    if name == "vector":
        arrow_type = pa.list_(pa.field("item", pa.float64(), nullable=False))
        return Encoding(arrow_type, "array", rowwise(arrow_type, vector_values), DATA + "DoubleVector")
    if name == "halfvec":
        arrow_type = pa.list_(pa.field("item", pa.float32(), nullable=False))
        return Encoding(arrow_type, "array", rowwise(arrow_type, vector_values), DATA + "FloatVector")
    if name == "sparsevec":
        return Encoding(
            SPARSE_TYPE,
            "struct",
            rowwise(SPARSE_TYPE, sparse_vector_value),
            DATA + "SparseDoubleVector",
            doc="Sparse double vector",
        )
    return None

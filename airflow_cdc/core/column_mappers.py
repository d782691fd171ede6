"""Debezium's column mappers (truncate, mask, hash) as pure functions, byte for byte.

Reproduces ``io.debezium.relational.mapping`` (``TruncateColumn``, ``MaskStrings``):

* ``column.truncate.to.<n>.chars``: ``String.substring(0, n)``, i.e. ``n`` UTF-16 code units.  A cut
  through a surrogate pair drops the lone high surrogate (Debezium would emit it; UTF-8 Parquet
  cannot hold it).
* ``column.mask.with.<n>.chars``: every value, NULL included, becomes ``n`` asterisks
  (``MaskingValueConverter`` ignores its input).
* ``column.mask.hash.<alg>.with.salt.<salt>`` (v1): lowercase hex of ``digest(salt + bytes)`` where
  ``bytes`` is the value's Java serialization (``ObjectOutputStream.writeObject(String)``: stream
  header, ``TC_STRING``, length, modified UTF-8); ``.v2.`` hashes ``String.getBytes()`` (UTF-8).
  The hex is cut to the column's length when that is known (``column.length() > 0``).  NULL stays
  NULL (not ``Serializable``).

Only character columns are mapped; Debezium passes every other type through.
:mod:`airflow_cdc.core.column_mapping` applies them to the sources' column codecs.
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass, field

from airflow_cdc.core.errors import ConfigError

_STREAM_HEADER = b"\xac\xed\x00\x05"
_TC_STRING, _TC_LONGSTRING = b"\x74", b"\x7c"
_HASH = re.compile(r"column\.mask\.hash\.(v2\.)?([^.]+)\.with\.salt\.(.+)")
_TRUNCATE = re.compile(r"column\.truncate\.to\.(\d+)\.chars")
_MASK = re.compile(r"column\.mask\.with\.(\d+)\.chars")


def utf16_units(text: str) -> int:
    """Java's ``String.length()``: UTF-16 code units."""
    return len(text.encode("utf-16-be")) // 2


def truncate(value: str | None, max_length: int) -> str | None:
    """Return the first ``max_length`` UTF-16 code units of ``value`` (Debezium ``TruncateColumn``)."""
    if value is None or utf16_units(value) <= max_length:
        return value
    units = value.encode("utf-16-be")[: 2 * max_length]
    if units and 0xD8 <= units[-2] <= 0xDB:  # a high surrogate without its pair
        units = units[:-2]
    return units.decode("utf-16-be")


def mask(length: int) -> str:
    """The mask of ``column.mask.with.<length>.chars``."""
    return "*" * length


def modified_utf8(text: str) -> bytes:
    """Java's modified UTF-8 (``DataOutput.writeUTF`` body): per UTF-16 unit, NUL as two bytes."""
    data = text.encode("utf-16-be", "surrogatepass")
    out = bytearray()
    for (unit,) in struct.iter_unpack(">H", data):
        if 0x01 <= unit <= 0x7F:
            out.append(unit)
        elif unit <= 0x7FF:
            out += bytes((0xC0 | unit >> 6, 0x80 | unit & 0x3F))
        else:
            out += bytes((0xE0 | unit >> 12, 0x80 | unit >> 6 & 0x3F, 0x80 | unit & 0x3F))
    return bytes(out)


def java_serialized_string(text: str) -> bytes:
    """``ObjectOutputStream.writeObject(text)`` as a whole stream."""
    if "\x00" not in text and (text.isascii() or max(text) < "\U00010000"):
        body = text.encode("utf-8")  # no NUL, no surrogate pair: modified UTF-8 is UTF-8
    else:
        body = modified_utf8(text)
    if len(body) <= 0xFFFF:
        return _STREAM_HEADER + _TC_STRING + struct.pack(">H", len(body)) + body
    return _STREAM_HEADER + _TC_LONGSTRING + struct.pack(">Q", len(body)) + body


def _digest(algorithm: str) -> hashlib._Hash:
    name = algorithm.lower().replace("/", "_")  # SHA-512/256 -> sha512_256
    name = name.replace("sha3-", "sha3_") if name.startswith("sha3-") else name.replace("-", "")
    try:
        return hashlib.new(name)
    except ValueError as e:
        raise ConfigError(f"column.mask.hash: unknown hash algorithm {algorithm!r}") from e


def hash_value(value: str | None, algorithm: str, salt: str, v2: bool, column_length: int = -1) -> str | None:
    """Debezium's ``HashValueConverter`` (then ``TruncatingValueConverter`` for a sized column)."""
    if value is None:
        return None
    digest = _digest(algorithm)
    digest.update(salt.encode("utf-8"))
    digest.update(value.encode("utf-8") if v2 else java_serialized_string(value))
    text = digest.hexdigest()
    return text[:column_length] if column_length > 0 else text


def hash_values(
    values: list[str | None], algorithm: str, salt: str, v2: bool, column_length: int = -1
) -> list[str | None]:
    """:func:`hash_value` of each value (the salted digest state is computed once)."""
    salted = _digest(algorithm)
    salted.update(salt.encode("utf-8"))
    cut = column_length if column_length > 0 else None
    out: list[str | None] = []
    for value in values:
        if value is None:
            out.append(None)
            continue
        digest = salted.copy()
        digest.update(value.encode("utf-8") if v2 else java_serialized_string(value))
        out.append(digest.hexdigest()[:cut])
    return out


@dataclass(frozen=True)
class Mapper:
    """One configured mapper: ``kind`` truncate/mask/hash, the column regexes and its parameters."""

    kind: str
    columns: tuple[re.Pattern[str], ...]
    length: int = 0
    algorithm: str = ""
    salt: str = field(default="", repr=False)
    v2: bool = False
    prop: str = field(default="", repr=False)  # the property that defined it (holds the salt)

    def matches(self, qualified_column: str) -> bool:
        """Whether ``<schema>.<table>.<column>`` is one of this mapper's columns (anchored regex)."""
        return any(p.fullmatch(qualified_column) for p in self.columns)


#: the properties that add the source column type as schema parameters, and their mapper kinds:
#: matched against ``<table>.<column>`` and ``<table>.<type name>``
PROPAGATE = {
    "column.propagate.source.type": "propagate-column",
    "datatype.propagate.source.type": "propagate-type",
}


def shown_name(name: str) -> str:
    """The property name as errors show it: the salt of a hash property masked."""
    return re.sub(r"(\.with\.salt\.).*", r"\1***", name)


def parse_mapper(name: str, columns: tuple[str, ...]) -> Mapper | None:
    """The mapper a property defines, or ``None`` when ``name`` is no mapper property.

    :raises ConfigError: a bad regex, a length that is not a number or an unknown hash algorithm,
        naming the property.
    """
    try:
        patterns = tuple(re.compile(c, re.IGNORECASE) for c in columns)
    except re.error as e:
        raise ConfigError(f"property {shown_name(name)!r}: invalid column regex: {e}") from e
    if name in PROPAGATE:
        return Mapper(PROPAGATE[name], patterns, prop=name)
    if m := _TRUNCATE.fullmatch(name):
        return Mapper("truncate", patterns, length=int(m.group(1)), prop=name)
    if m := _MASK.fullmatch(name):
        return Mapper("mask", patterns, length=int(m.group(1)), prop=name)
    if m := _HASH.fullmatch(name):
        try:
            _digest(m.group(2))
        except ConfigError as e:
            raise ConfigError(
                f"property {shown_name(name)!r}: unknown hash algorithm "
                f"{m.group(2)!r} (a Java MessageDigest name: MD5, SHA-1, SHA-256, SHA-512, SHA3-256 ...)"
            ) from e
        return Mapper("hash", patterns, algorithm=m.group(2), salt=m.group(3), v2=bool(m.group(1)), prop=name)
    if name.startswith(("column.truncate.to.", "column.mask.with.")):
        raise ConfigError(
            f"property {name!r}: the length before '.chars' must be a non-negative integer "
            "(e.g. column.truncate.to.20.chars, column.mask.with.8.chars)"
        )
    if name.startswith("column.mask.hash."):
        raise ConfigError(
            f"property {name!r}: expected column.mask.hash.[v2.]<algorithm>.with.salt.<salt> "
            "(e.g. column.mask.hash.SHA-256.with.salt.CzQMA0cB5K)"
        )
    return None

"""Decode the row images of binlog ROWS events into Python values (the hot path).

For each table layout (column types and metadata from a TABLE_MAP event, signedness from the
table map's optional metadata or the schema history) :func:`row_reader` generates, once, a
small Python function that reads one row image: the NULL bitmap over the columns present in
the event, then each non-NULL value in its binary form (MySQL ``log_event.cc`` /
``Field::pack``).  Generated code avoids a per-column dispatch in the inner loop.

Values are "neutral" forms that :mod:`airflow_cdc.sources.mysql.types` turns into Debezium's
encodings column-wise:

=====================  ==========================================================
integers, YEAR, BIT    ``int`` (unsigned where the column is)
FLOAT, DOUBLE          ``float``
DECIMAL                ``str`` (``"-12.30"``)
DATE                   ``int`` packed ``year*512 + month*32 + day`` (0 = zero date)
DATETIME               ``int`` ``YYYYMMDDhhmmss * 10**6 + micros`` (0 = zero date)
TIMESTAMP              ``int`` microseconds since the epoch, UTC (0 = zero timestamp)
TIME                   ``int`` signed microseconds
ENUM / SET             ``int`` index (1-based) / bit mask
strings, blobs, JSON   ``bytes`` (MySQL binary JSON is converted to JSON text bytes)
GEOMETRY               ``bytes``: 4-byte little-endian SRID + WKB
=====================  ==========================================================

:func:`native_reader` returns the compiled twin of these readers (``_binlogrows.c``, built by
``pip install``), which yields the same values; it is used unless the extension is absent,
``AIRFLOW_CDC_MYSQL_ROWS=python`` is set or the layout has a column type it does not handle.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

from airflow_cdc.core.errors import ProtocolError

try:
    from airflow_cdc.sources.mysql._binlogrows import Layout as _Layout
except ImportError:  # not built (a source checkout without pip install): generated Python readers
    _Layout = None

ROWS_ENV = "AIRFLOW_CDC_MYSQL_ROWS"

# column types (include/mysql_com.h, enum_field_types)
T_DECIMAL, T_TINY, T_SHORT, T_LONG, T_FLOAT, T_DOUBLE, T_NULL, T_TIMESTAMP = 0, 1, 2, 3, 4, 5, 6, 7
T_LONGLONG, T_INT24, T_DATE, T_TIME, T_DATETIME, T_YEAR, T_NEWDATE, T_VARCHAR = 8, 9, 10, 11, 12, 13, 14, 15
T_BIT, T_TIMESTAMP2, T_DATETIME2, T_TIME2 = 16, 17, 18, 19
T_JSON, T_NEWDECIMAL, T_ENUM, T_SET = 245, 246, 247, 248
T_TINY_BLOB, T_MEDIUM_BLOB, T_LONG_BLOB, T_BLOB, T_VAR_STRING, T_STRING, T_GEOMETRY = (
    249,
    250,
    251,
    252,
    253,
    254,
    255,
)

NUMERIC_TYPES = frozenset(
    {T_TINY, T_SHORT, T_INT24, T_LONG, T_LONGLONG, T_FLOAT, T_DOUBLE, T_NEWDECIMAL, T_DECIMAL}
)
CHARACTER_TYPES = frozenset({T_STRING, T_VAR_STRING, T_VARCHAR, T_BLOB})
INT_TYPES = {T_TINY: 1, T_SHORT: 2, T_INT24: 3, T_LONG: 4, T_LONGLONG: 8}
_INT_FMT = {
    (1, False): "<b",
    (1, True): "<B",
    (2, False): "<h",
    (2, True): "<H",
    (4, False): "<i",
    (4, True): "<I",
    (8, False): "<q",
    (8, True): "<Q",
}
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def metadata_size(col_type: int) -> int:
    """Bytes of TABLE_MAP metadata a column of ``col_type`` has."""
    if col_type in (
        T_FLOAT,
        T_DOUBLE,
        T_BLOB,
        T_GEOMETRY,
        T_JSON,
        T_TIMESTAMP2,
        T_DATETIME2,
        T_TIME2,
        T_TINY_BLOB,
        T_MEDIUM_BLOB,
        T_LONG_BLOB,
    ):
        return 1
    if col_type in (T_VARCHAR, T_VAR_STRING, T_BIT, T_NEWDECIMAL, T_STRING, T_ENUM, T_SET):
        return 2
    return 0


def parse_metadata(col_type: int, raw: bytes) -> tuple[int, int]:
    """The real type and its metadata value for one column (STRING hides ENUM/SET and lengths).

    For STRING/ENUM/SET the metadata bytes are ``real_type, length`` (length's high bits folded
    into the first byte for CHAR longer than 255 bytes).
    """
    if col_type in (T_STRING, T_ENUM, T_SET) and len(raw) == 2:
        b0, b1 = raw[0], raw[1]
        if b0 in (T_ENUM, T_SET):
            return b0, b1
        if b0 == 0:
            return T_STRING, b1
        return b0 | 0x30, (((b0 & 0x30) ^ 0x30) << 4) | b1
    if col_type == T_BIT:
        return col_type, raw[1] * 8 + raw[0]
    if col_type == T_NEWDECIMAL:
        return col_type, raw[0] << 8 | raw[1]  # precision, scale
    if len(raw) == 2:
        return col_type, raw[0] | raw[1] << 8
    return col_type, raw[0] if raw else 0


def decimal_reader(precision: int, scale: int) -> tuple[Callable[[bytes, int], str], int]:
    """A reader of MySQL's binary DECIMAL(precision, scale) returning its text, and its size."""
    intg, frac = precision - scale, scale
    intg0, intg0x, frac0, frac0x = intg // 9, intg % 9, frac // 9, frac % 9
    size = intg0 * 4 + _DIG2BYTES[intg0x] + frac0 * 4 + _DIG2BYTES[frac0x]
    lead, tail = _DIG2BYTES[intg0x], _DIG2BYTES[frac0x]

    def read(d: bytes, o: int) -> str:
        b = bytearray(d[o : o + size])
        negative = not b[0] & 0x80
        b[0] ^= 0x80
        if negative:
            b = bytearray(x ^ 0xFF for x in b)
        p = 0
        ipart = int.from_bytes(b[:lead], "big") if lead else 0
        p = lead
        for _ in range(intg0):
            ipart = ipart * 1_000_000_000 + int.from_bytes(b[p : p + 4], "big")
            p += 4
        digits = []
        for _ in range(frac0):
            digits.append(f"{int.from_bytes(b[p : p + 4], 'big'):09d}")
            p += 4
        if tail:
            digits.append(f"{int.from_bytes(b[p : p + tail], 'big'):0{frac0x}d}")
        text = f"{ipart}.{''.join(digits)}" if frac else str(ipart)
        return "-" + text if negative else text

    return read, size


def _frac_reader(fsp: int) -> tuple[int, int]:
    """(bytes, multiplier to microseconds) of the fractional part for ``fsp`` digits."""
    n = (fsp + 1) // 2
    return n, (10_000, 100, 1)[n - 1] if n else 1


def datetime2_reader(fsp: int) -> tuple[Callable[[bytes, int], int], int]:
    nfrac, mult = _frac_reader(fsp)

    def read(d: bytes, o: int) -> int:
        packed = int.from_bytes(d[o : o + 5], "big") - 0x8000000000
        ymd, hms = packed >> 17, packed & 0x1FFFF
        ym = ymd >> 5
        frac = int.from_bytes(d[o + 5 : o + 5 + nfrac], "big") * mult if nfrac else 0
        stamp = (
            (((ym // 13) * 100 + ym % 13) * 100 + (ymd & 31)) * 1_000_000
            + ((hms >> 12) * 100 + (hms >> 6 & 63)) * 100
            + (hms & 63)
        )
        return stamp * 1_000_000 + frac

    return read, 5 + nfrac


def timestamp2_reader(fsp: int) -> tuple[Callable[[bytes, int], int], int]:
    nfrac, mult = _frac_reader(fsp)

    def read(d: bytes, o: int) -> int:
        frac = int.from_bytes(d[o + 4 : o + 4 + nfrac], "big") * mult if nfrac else 0
        return int.from_bytes(d[o : o + 4], "big") * 1_000_000 + frac

    return read, 4 + nfrac


def time2_reader(fsp: int) -> tuple[Callable[[bytes, int], int], int]:
    nfrac = (fsp + 1) // 2

    def read(d: bytes, o: int) -> int:
        if nfrac == 3:
            packed = int.from_bytes(d[o : o + 6], "big") - 0x800000000000
        else:
            intpart = int.from_bytes(d[o : o + 3], "big") - 0x800000
            frac = int.from_bytes(d[o + 3 : o + 3 + nfrac], "big") if nfrac else 0
            if intpart < 0 and frac:
                intpart += 1
                frac -= 0x100 if nfrac == 1 else 0x10000
            packed = (intpart << 24) + frac * (10_000 if nfrac == 1 else 100 if nfrac == 2 else 1)
        negative = packed < 0
        packed = -packed if negative else packed
        hms, frac = packed >> 24, packed & 0xFFFFFF
        micros = (((hms >> 12 & 0x3FF) * 60 + (hms >> 6 & 63)) * 60 + (hms & 63)) * 1_000_000 + frac
        return -micros if negative else micros

    return read, 3 + nfrac


def _old_time(d: bytes, o: int) -> int:
    v = int.from_bytes(d[o : o + 3], "little", signed=True)
    sign, v = (-1 if v < 0 else 1), abs(v)
    return sign * ((v // 10000 * 60 + v // 100 % 100) * 60 + v % 100) * 1_000_000


class ColumnLayout:
    """One column of a TABLE_MAP layout: binary type, metadata and signedness."""

    __slots__ = ("type", "meta", "unsigned", "json")

    def __init__(self, col_type: int, meta: int, unsigned: bool = False, json: Any = None) -> None:
        self.type, self.meta, self.unsigned, self.json = col_type, meta, unsigned, json


def _column_code(i: int, col: ColumnLayout, env: dict[str, Any]) -> list[str]:
    """Python statements reading column ``i`` at ``o`` into ``c{i}`` (non-NULL case)."""
    t, m = col.type, col.meta
    if t in INT_TYPES:
        size = INT_TYPES[t]
        if size == 3:
            return [f"c{i} = int.from_bytes(d[o:o + 3], 'little', signed={not col.unsigned}); o += 3"]
        env[f"u{i}"] = struct.Struct(_INT_FMT[(size, col.unsigned)]).unpack_from
        return [f"c{i} = u{i}(d, o)[0]; o += {size}"]
    if t in (T_FLOAT, T_DOUBLE):
        size = 4 if t == T_FLOAT else 8
        env[f"u{i}"] = struct.Struct("<f" if size == 4 else "<d").unpack_from
        return [f"c{i} = u{i}(d, o)[0]; o += {size}"]
    if t in (T_VARCHAR, T_VAR_STRING, T_STRING):
        if m < 256:
            return [f"n = d[o]; c{i} = d[o + 1:o + 1 + n]; o += 1 + n"]
        return [f"n = d[o] | d[o + 1] << 8; c{i} = d[o + 2:o + 2 + n]; o += 2 + n"]
    if t in (T_BLOB, T_GEOMETRY, T_JSON, T_TINY_BLOB, T_MEDIUM_BLOB, T_LONG_BLOB):
        size = m or 4
        lines = [
            f"n = int.from_bytes(d[o:o + {size}], 'little'); c{i} = d[o + {size}:o + {size} + n]; "
            f"o += {size} + n"
        ]
        if t == T_JSON and col.json is not None:
            env[f"j{i}"] = col.json
            lines.append(f"c{i} = j{i}(c{i})")
        return lines
    readers: dict[int, Callable[[], tuple[Callable[[bytes, int], Any], int]]] = {
        T_NEWDECIMAL: lambda: decimal_reader(m >> 8, m & 0xFF),
        T_DATETIME2: lambda: datetime2_reader(m),
        T_TIMESTAMP2: lambda: timestamp2_reader(m),
        T_TIME2: lambda: time2_reader(m),
        T_TIME: lambda: (_old_time, 3),
    }
    if t in readers:
        env[f"r{i}"], size = readers[t]()
        return [f"c{i} = r{i}(d, o); o += {size}"]
    simple = {
        T_YEAR: ("(lambda y: 1900 + y if y else 0)(d[o])", 1),
        T_DATE: ("int.from_bytes(d[o:o + 3], 'little')", 3),
        T_TIMESTAMP: ("int.from_bytes(d[o:o + 4], 'little') * 1000000", 4),
        T_DATETIME: ("int.from_bytes(d[o:o + 8], 'little') * 1000000", 8),
        T_ENUM: (f"int.from_bytes(d[o:o + {m}], 'little')", m),
        T_SET: (f"int.from_bytes(d[o:o + {m}], 'little')", m),
        T_BIT: (f"int.from_bytes(d[o:o + {(m + 7) // 8}], 'big')", (m + 7) // 8),
    }
    if t in simple:
        expr, size = simple[t]
        return [f"c{i} = {expr}; o += {size}"]
    raise ProtocolError(f"binlog column type {t} is not supported")


def row_reader(columns: list[ColumnLayout], present: list[bool]) -> Callable[[bytes, int], tuple[tuple, int]]:
    """Generate ``read(data, offset) -> (row, next_offset)`` for one row image.

    Columns not present in the image (a session with ``binlog_row_image`` other than FULL) are
    returned as ``None``; callers reject such images where it matters.

    :raises ProtocolError: a column type the decoder does not know.
    """
    env: dict[str, Any] = {}
    idx = [i for i, p in enumerate(present) if p]
    nbytes = (len(idx) + 7) // 8
    body = [f"nulls = int.from_bytes(d[o:o + {nbytes}], 'little'); o += {nbytes}"]
    for bit, i in enumerate(idx):
        body.append(f"if nulls >> {bit} & 1:\n        c{i} = None\n    else:")
        body += [f"    {line}" for line in _column_code(i, columns[i], env)]
    values = ", ".join(f"c{i}" if present[i] else "None" for i in range(len(columns)))
    src = "def read(d, o):\n" + "".join(f"    {line}\n" for line in body)
    src += f"    return ({values}{',' if len(columns) == 1 else ''}), o\n"
    exec(compile(src, "<binlog row reader>", "exec"), env)  # noqa: S102 - code built from column types only
    return env["read"]  # type: ignore[no-any-return]


def native_available() -> bool:
    """Whether the compiled row decoder is built and not disabled through ``AIRFLOW_CDC_MYSQL_ROWS``."""
    return _Layout is not None and os.environ.get(ROWS_ENV, "").lower() != "python"


def native_reader(columns: list[ColumnLayout], present: list[bool]) -> Any:
    """The compiled reader of one row image layout, or None (see the module docstring).

    It is called like :func:`row_reader`'s function and has ``decode(body, offset, op,
    after=None)``, which reads all row images of a rows event into ``(before, after)`` pairs
    (``after``: the reader of an UPDATE's after images); a row image running past the end of the
    event raises ``ValueError``.
    """
    if not native_available():
        return None
    try:
        return _Layout([(c.type, c.meta, bool(c.unsigned), c.json) for c in columns], present)
    except NotImplementedError:
        return None

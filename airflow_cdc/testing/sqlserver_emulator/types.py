"""SQL Server column types for the emulator: parsing, PostgreSQL storage, TDS encoding of values.

The emulator keeps user tables in PostgreSQL but must present SQL Server's types on the wire, so
each column carries its SQL Server type (:class:`SqlType`).  Storage is the closest exact
PostgreSQL type; where PostgreSQL cannot hold the value exactly (100 ns precision of
``time(7)``/``datetime2(7)``, the offset of ``datetimeoffset``) the value is stored as fixed-width
canonical text, which also sorts correctly for ``time``/``datetime2``.

Encodings follow [MS-TDS] 2.2.5.4 (TYPE_INFO) and 2.2.5.5 (data) for TDS 7.3+.
"""

from __future__ import annotations

import datetime as dt
import re
import struct
import uuid
from dataclasses import dataclass
from decimal import Context, Decimal
from typing import Any

# TDS type tokens ([MS-TDS] 2.2.5.4.1-3).
INTN, BITN, DECIMALN, NUMERICN, FLTN, MONEYN, DATETIMN = 0x26, 0x68, 0x6A, 0x6C, 0x6D, 0x6E, 0x6F
GUIDTYPE, DATEN, TIMEN, DATETIME2N, DATETIMEOFFSETN = 0x24, 0x28, 0x29, 0x2A, 0x2B
BIGVARBIN, BIGVARCHR, BIGBINARY, BIGCHAR, NVARCHAR, NCHAR = 0xA5, 0xA7, 0xAD, 0xAF, 0xE7, 0xEF
NTEXT, TEXT = 0x63, 0x23
IMAGE = 0x22  # [MS-TDS] 2.2.5.4.3 IMAGETYPE: LONGLEN TYPE_INFO, no collation
SSVARIANT, UDTTYPE, XMLTYPE = 0x62, 0xF0, 0xF1  # [MS-TDS] 2.2.5.4.3 (sql_variant), 2.2.5.4.3 (UDT, XML)

#: SQL_Latin1_General_CP1_CI_AS: LCID 0x0409, CI/AS flags, sort id 52 ([MS-TDS] 2.2.5.1.2).
COLLATION = bytes.fromhex("0904d00034")
VARCHAR_CODEC = "cp1252"
PLP_NULL = 0xFFFFFFFFFFFFFFFF
MAX = -1  # max_length of the (max) types

_FIXED_INT = {"tinyint": 1, "smallint": 2, "int": 4, "bigint": 8}
_STRINGS = {"char": BIGCHAR, "varchar": BIGVARCHR, "nchar": NCHAR, "nvarchar": NVARCHAR}
_BINARIES = {"binary": BIGBINARY, "varbinary": BIGVARBIN}
#: Types sent as PLP whatever their size: XMLTYPE and the CLR types' UDTTYPE ([MS-TDS] 2.2.5.2.3).
_ALWAYS_PLP = frozenset({"xml", "hierarchyid", "geometry", "geography"})
#: Types whose values live in :mod:`.special_types` (the table's storage is given there).
SPECIAL = frozenset({"xml", "sql_variant", "timestamp", "hierarchyid", "geometry", "geography"})
#: Types that take no length/precision argument.
_UNSIZED = frozenset({
    *SPECIAL, *_FIXED_INT, "bit", "real", "money", "smallmoney", "date", "datetime", "smalldatetime",
    "uniqueidentifier", "ntext", "text", "image",
})  # fmt: skip
#: Names :meth:`SqlType.parse` reads as system types (anything else may name an alias type).
_SYSTEM_NAMES = _UNSIZED | {*_STRINGS, *_BINARIES, "rowversion", "float", "decimal", "numeric", "time",
                            "datetime2", "datetimeoffset"}  # fmt: skip
_NAME = re.compile(r"^\s*(\w+)\s*(?:\(\s*(max|\d+)\s*(?:,\s*(\d+)\s*)?\))?\s*$", re.IGNORECASE)
_EPOCH_DATE = dt.date(1, 1, 1)
_WIDE = Context(prec=80)  # decimal(38, s) needs more than the default 28 digits
_DATETIME_EPOCH = dt.datetime(1900, 1, 1)


class TypeSpecError(ValueError):
    """A column type the emulator does not know, or bad length/precision."""


@dataclass(frozen=True, slots=True)
class SqlType:
    """A SQL Server column type; ``length`` in characters/bytes (``MAX`` for (max)).

    ``alias``: the ``schema.name`` of an alias type (``CREATE TYPE dbo.Phone FROM nvarchar(20)``)
    whose base type this is; the base type is what the server sends on the wire.
    """

    name: str
    length: int = 0
    precision: int = 0
    scale: int = 0
    alias: str = ""

    @classmethod
    def parse(cls, spec: str) -> SqlType:
        """Parse ``int``, ``nvarchar(50)``, ``varbinary(max)``, ``decimal(10,2)``, ``datetime2(3)``,
        or the name of an alias type made by :func:`.catalog.create_alias_type` (``dbo.Phone``)."""
        from airflow_cdc.testing.sqlserver_emulator.special_types import lookup_alias

        m = _NAME.match(spec)
        if not m or (m.group(1).lower() not in _SYSTEM_NAMES and not m.group(2)):
            alias = lookup_alias(spec)  # system type names win: SQL Server resolves them first
            if alias is not None:
                return alias
            if not m:
                raise TypeSpecError(f"cannot parse SQL Server type {spec!r}")
        name, arg1, arg2 = m.group(1).lower(), m.group(2), m.group(3)
        size = MAX if arg1 and arg1.lower() == "max" else int(arg1) if arg1 else None
        if name in _STRINGS or name in _BINARIES:
            return cls(name, 1 if size is None else size)
        if name in ("decimal", "numeric"):
            prec = 18 if size is None else size
            if not 1 <= prec <= 38 or int(arg2 or 0) > prec:
                raise TypeSpecError(f"bad precision/scale in {spec!r}")
            return cls(name, precision=prec, scale=int(arg2 or 0))
        if name in ("time", "datetime2", "datetimeoffset"):
            scale = 7 if size is None else size
            if not 0 <= scale <= 7:
                raise TypeSpecError(f"bad fractional precision in {spec!r}")
            return cls(name, scale=scale)
        if name == "float":
            return cls("real" if size is not None and size <= 24 else "float")
        if name == "rowversion" and size is None:
            return cls("timestamp")  # a synonym: sys.types and sys.columns say timestamp
        if name not in _UNSIZED or size is not None:
            raise TypeSpecError(f"unsupported SQL Server type {spec!r}")
        return cls(name)

    def __str__(self) -> str:
        if self.alias:
            return self.alias
        if self.name in _STRINGS or self.name in _BINARIES:
            return f"{self.name}({'max' if self.length == MAX else self.length})"
        if self.name in ("decimal", "numeric"):
            return f"{self.name}({self.precision},{self.scale})"
        if self.name in ("time", "datetime2", "datetimeoffset"):
            return f"{self.name}({self.scale})"
        return self.name

    # -- catalog values (sys.columns) ---------------------------------------------------------
    @property
    def max_length(self) -> int:
        """``sys.columns.max_length``: bytes, -1 for (max), 16 for ntext/text pointers."""
        if self.name in _STRINGS or self.name in _BINARIES:
            if self.length == MAX:
                return -1
            return self.length * (2 if self.name.startswith("n") else 1)
        fixed = {
            "bit": 1,
            "real": 4,
            "float": 8,
            "money": 8,
            "smallmoney": 4,
            "date": 3,
            "datetime": 8,
            "smalldatetime": 4,
            "uniqueidentifier": 16,
            "ntext": 16,
            "text": 16,
            "image": 16,
        }
        if self.name in _FIXED_INT:
            return _FIXED_INT[self.name]
        if self.name in SPECIAL:
            return {"xml": -1, "sql_variant": 8016, "timestamp": 8, "hierarchyid": 892}.get(self.name, -1)
        if self.name in ("decimal", "numeric"):
            return _decimal_size(self.precision)
        if self.name in ("time", "datetime2", "datetimeoffset"):
            base = _time_size(self.scale)
            return base + {"time": 0, "datetime2": 3, "datetimeoffset": 5}[self.name]
        return fixed[self.name]

    @property
    def pg_storage(self) -> str:
        """The PostgreSQL column type that stores this type's values exactly."""
        n = self.name
        if self.alias:  # the alias's domain (catalog.create_alias_type), over the base's storage
            schema, _, name = self.alias.partition(".")
            return f'"{schema}"."alias:{name}"'
        if n in SPECIAL:
            return {"xml": "xml", "sql_variant": "text"}.get(n, "bytea")
        if n == "bit":
            return "boolean"
        if n in ("tinyint", "smallint"):
            return "smallint"
        if n in ("int", "bigint"):
            return {"int": "integer", "bigint": "bigint"}[n]
        if n in ("decimal", "numeric"):
            return f"numeric({self.precision},{self.scale})"
        if n in ("money", "smallmoney"):
            return "numeric(19,4)" if n == "money" else "numeric(10,4)"
        if n in ("float", "real"):
            return "double precision" if n == "float" else "real"
        if n in _STRINGS:
            return "text"
        if n in _BINARIES:
            return "bytea"
        if n in ("ntext", "text"):
            return "text"
        if n == "image":
            return "bytea"
        if n == "uniqueidentifier":
            return "uuid"
        if n == "date":
            return "date"
        if n == "datetime":
            return "timestamp(3)"
        if n == "smalldatetime":
            return "timestamp(0)"
        if n in ("time", "datetime2") and self.scale <= 6:
            return f"{'time' if n == 'time' else 'timestamp'}({self.scale})"
        return "text"  # time(7), datetime2(7), datetimeoffset: canonical text

    # -- TDS ------------------------------------------------------------------------------------
    def type_info(self) -> bytes:
        """TYPE_INFO for COLMETADATA (nullable variants throughout)."""
        n = self.name
        if n in SPECIAL:
            from airflow_cdc.testing.sqlserver_emulator.special_types import type_info

            return type_info(self)
        if n in _FIXED_INT:
            return bytes((INTN, _FIXED_INT[n]))
        if n == "bit":
            return bytes((BITN, 1))
        if n in ("decimal", "numeric"):
            # the size of this precision's values (5/9/13/17), as tedious's TYPE_INFO and sys.columns say
            size = _decimal_size(self.precision)
            return bytes((DECIMALN if n == "decimal" else NUMERICN, size, self.precision, self.scale))
        if n in ("float", "real"):
            return bytes((FLTN, 8 if n == "float" else 4))
        if n in ("money", "smallmoney"):
            return bytes((MONEYN, 8 if n == "money" else 4))
        if n in ("datetime", "smalldatetime"):
            return bytes((DATETIMN, 8 if n == "datetime" else 4))
        if n == "uniqueidentifier":
            return bytes((GUIDTYPE, 16))
        if n == "date":
            return bytes((DATEN,))
        if n in ("time", "datetime2", "datetimeoffset"):
            return bytes(
                ({"time": TIMEN, "datetime2": DATETIME2N, "datetimeoffset": DATETIMEOFFSETN}[n], self.scale)
            )
        if n in _BINARIES:
            return bytes((_BINARIES[n],)) + struct.pack("<H", 0xFFFF if self.length == MAX else self.length)
        if n in _STRINGS:
            size = 0xFFFF if self.length == MAX else self.max_length
            return bytes((_STRINGS[n],)) + struct.pack("<H", size) + COLLATION
        if n in ("ntext", "text"):
            return bytes((NTEXT if n == "ntext" else TEXT,)) + struct.pack("<I", 0x7FFFFFFF) + COLLATION
        if n == "image":
            return bytes((IMAGE,)) + struct.pack("<I", 0x7FFFFFFF)
        raise TypeSpecError(f"no TDS encoding for {self}")

    @property
    def is_plp(self) -> bool:
        sized = self.name in _STRINGS or self.name in _BINARIES
        return self.name in _ALWAYS_PLP or (self.length == MAX and sized)

    def encode(self, value: Any) -> bytes:
        """Encode one value (as stored in PostgreSQL, or a Python value) for a ROW token."""
        if self.name in SPECIAL:
            from airflow_cdc.testing.sqlserver_emulator.special_types import encode

            return encode(self, value)
        if self.is_plp:
            return _plp(None if value is None else self._payload(value))
        if self.name in _STRINGS or self.name in _BINARIES:
            return b"\xff\xff" if value is None else _len2(self._payload(value))
        if self.name in ("ntext", "text", "image"):
            if value is None:
                return b"\x00"
            data = bytes(value) if self.name == "image" else self._payload(value)
            return b"\x10" + b"\x00" * 16 + b"\x00" * 8 + struct.pack("<I", len(data)) + data
        if value is None:
            return b"\x00"
        body = _encode_fixed(self, value)
        return bytes((len(body),)) + body

    def _payload(self, value: Any) -> bytes:
        if self.name in _BINARIES:
            data = bytes(value)
            if self.name == "binary" and len(data) < self.length:
                data += b"\x00" * (self.length - len(data))  # binary(n) is zero padded
            return data
        text = str(value)
        if self.name == "char" and len(text) < self.length:
            text = text.ljust(self.length)
        if self.name == "nchar" and len(text) < self.length:
            text = text.ljust(self.length)
        if self.name.startswith("n"):
            return text.encode("utf-16-le")
        return text.encode(VARCHAR_CODEC)


def _len2(data: bytes) -> bytes:
    return struct.pack("<H", len(data)) + data


def _plp(data: bytes | None, chunk: int = 8000) -> bytes:
    if data is None:
        return struct.pack("<Q", PLP_NULL)
    parts = [struct.pack("<Q", len(data))]
    for start in range(0, len(data), chunk):
        piece = data[start : start + chunk]
        parts.append(struct.pack("<I", len(piece)) + piece)
    parts.append(b"\x00\x00\x00\x00")
    return b"".join(parts)


def _decimal_size(precision: int) -> int:
    return 5 if precision <= 9 else 9 if precision <= 19 else 13 if precision <= 28 else 17


def _time_size(scale: int) -> int:
    return 3 if scale <= 2 else 4 if scale <= 4 else 5


def _encode_fixed(t: SqlType, value: Any) -> bytes:
    n = t.name
    if n in _FIXED_INT:
        return int(value).to_bytes(_FIXED_INT[n], "little", signed=n != "tinyint")
    if n == "bit":
        return b"\x01" if value else b"\x00"
    if n in ("decimal", "numeric"):
        return _decimal_bytes(Decimal(value), t.precision, t.scale)
    if n == "float":
        return struct.pack("<d", float(value))
    if n == "real":
        return struct.pack("<f", float(value))
    if n == "money":
        units = _units(value, 4)
        return struct.pack("<iI", units >> 32, units & 0xFFFFFFFF)
    if n == "smallmoney":
        return struct.pack("<i", _units(value, 4))
    if n == "uniqueidentifier":
        return (value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))).bytes_le
    if n == "date":
        return _date_bytes(value)
    if n == "datetime":
        return _datetime_bytes(value)
    if n == "smalldatetime":
        days = (value.date() - _DATETIME_EPOCH.date()).days
        return struct.pack("<HH", days, value.hour * 60 + value.minute)
    return _encode_clock(t, value)


def _decimal_bytes(value: Decimal, precision: int, scale: int) -> bytes:
    units = _units(value, scale)
    size = _decimal_size(precision) - 1
    return bytes((0 if units < 0 else 1,)) + abs(units).to_bytes(size, "little")


def _units(value: Any, scale: int) -> int:
    """``value * 10**scale`` as an exact integer (money and decimal on the wire)."""
    return int(Decimal(value).scaleb(scale, context=_WIDE).to_integral_value(context=_WIDE))


def _date_bytes(value: dt.date) -> bytes:
    return (value - _EPOCH_DATE).days.to_bytes(3, "little")


def _datetime_bytes(value: dt.datetime) -> bytes:
    days = (value.date() - _DATETIME_EPOCH.date()).days
    ms = ((value.hour * 60 + value.minute) * 60 + value.second) * 1000 + value.microsecond // 1000
    ticks = (ms * 3 + 5) // 10  # 1/300 s ticks; SQL Server rounds to .000/.003/.007
    if ticks == 300 * 86400:  # 23:59:59.999 rounds to the next midnight (tedious carries it too)
        days, ticks = days + 1, 0
    return struct.pack("<iI", days, ticks)


def _encode_clock(t: SqlType, value: Any) -> bytes:
    """time / datetime2 / datetimeoffset: 10**-scale second units, then date, then offset."""
    parsed = parse_clock(t, value)
    ticks = parsed.ticks7 // 10 ** (7 - t.scale)
    body = ticks.to_bytes(_time_size(t.scale), "little")
    if t.name == "time":
        return body
    body += parsed.days.to_bytes(3, "little")
    if t.name == "datetimeoffset":
        body += struct.pack("<h", parsed.offset_min)
    return body


@dataclass(frozen=True, slots=True)
class Clock:
    """A parsed time value: days since 0001-01-01 and 100 ns ticks since midnight (UTC for
    datetimeoffset), plus the offset in minutes."""

    days: int
    ticks7: int
    offset_min: int = 0


_CLOCK_TEXT = re.compile(
    r"^(?:(\d{4})-(\d{2})-(\d{2})[ T])?(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,7}))?(?:\s*([+-])(\d{2}):(\d{2}))?$"
)


def parse_clock(t: SqlType, value: Any) -> Clock:
    """Read a time-like value stored natively (date/time/datetime) or as canonical text."""
    if isinstance(value, dt.datetime):
        ticks = ((value.hour * 60 + value.minute) * 60 + value.second) * 10**7 + value.microsecond * 10
        return Clock((value.date() - _EPOCH_DATE).days, ticks)
    if isinstance(value, dt.time):
        return Clock(
            0, ((value.hour * 60 + value.minute) * 60 + value.second) * 10**7 + value.microsecond * 10
        )
    m = _CLOCK_TEXT.match(str(value).strip())
    if not m:
        raise TypeSpecError(f"bad {t} value {value!r}")
    y, mo, d, hh, mi, ss, frac, sign, oh, om = m.groups()
    ticks = ((int(hh) * 60 + int(mi)) * 60 + int(ss)) * 10**7 + int((frac or "0").ljust(7, "0"))
    days = (dt.date(int(y), int(mo), int(d)) - _EPOCH_DATE).days if y else 0
    offset = (int(oh) * 60 + int(om)) * (-1 if sign == "-" else 1) if sign else 0
    if t.name == "datetimeoffset":  # on the wire the date/time part is UTC
        total = days * 864 * 10**9 + ticks - offset * 60 * 10**7
        days, ticks = divmod(total, 864 * 10**9)
    return Clock(days, ticks, offset)


def canonical_clock(t: SqlType, value: Any) -> str:
    """The fixed-width text a text-stored time/datetime2/datetimeoffset value is kept as."""
    if isinstance(value, str):
        parse_clock(t, value)  # validate
        return value
    if isinstance(value, dt.datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
        if t.name == "datetimeoffset":
            off = value.utcoffset() or dt.timedelta(0)
            minutes = int(off.total_seconds()) // 60
            sign = "-" if minutes < 0 else "+"
            text += f" {sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
        return text
    if isinstance(value, dt.time):
        return value.strftime("%H:%M:%S.%f") + "0"
    raise TypeSpecError(f"bad {t} value {value!r}")

"""The emulator's xml, sql_variant, timestamp (rowversion), CLR and alias types.

What a real SQL Server sends for them ([MS-TDS] 2.2.5.6 TYPE_INFO, 2.2.5.5 values):

* ``xml``: XMLTYPE (0xF1) with XML_INFO ``SCHEMA_PRESENT = 0``; values are PLP, UTF-16LE without a
  byte-order mark ([MS-TDS] 2.2.5.5.3 XML Values; msodbcsql *adds* a BOM for ``SQL_C_BINARY``).  The
  server keeps xml parsed, so it returns it re-serialised (:func:`xml_text`).
* ``sql_variant``: SSVARIANTTYPE (0x62) with a LONGLEN maximum of 8009; a value is a four-byte length
  (0: NULL), then VARIANT_BASETYPE (the base type's token, fixed-length tokens for fixed types),
  VARIANT_PROPBYTES, the properties and the data ([MS-TDS] 2.2.5.5.4 SQL_VARIANT Values).
* ``timestamp``/``rowversion``: BIGBINARY(8) (COLMETADATA's UserType is 0x50 for it, [MS-TDS]
  2.2.7.4); change tables define the column ``binary(8)`` (Microsoft: "Timestamp columns are
  defined as binary(8)" in ``cdc.<capture_instance>_CT``), see :func:`.catalog.ct_columns`.
* CLR types (``hierarchyid``, ``geometry``, ``geography``: ``system_type_id`` 240,
  ``is_assembly_type`` 1): UDTTYPE (0xF0) with UDT_INFO -- MAX_BYTE_SIZE (0xFFFF above 8000 bytes),
  DB_NAME, SCHEMA_NAME, TYPE_NAME (B_VARCHAR) and ASSEMBLY_QUALIFIED_NAME (US_VARCHAR); values are
  PLP of the CLR serialisation ([MS-TDS] 2.2.5.5.2 CLR Instances).  Writers store that
  serialisation (``bytea``), as a client inserting a ``0x...`` literal would.
* alias types (``CREATE TYPE dbo.Phone FROM nvarchar(20)``): on the wire exactly their base type.

Storage: xml in PostgreSQL ``xml`` (well-formedness checked on insert, as SQL Server does); a
sql_variant as the text ``<base type>:<value>`` (:func:`variant_literal`); timestamp and CLR values
as ``bytea``; an alias in a domain over its base type's storage.
"""

from __future__ import annotations

import datetime as dt
import re
import struct
import threading
from decimal import Decimal
from typing import Any
from xml.dom import minidom
from xml.sax.saxutils import escape

from airflow_cdc.testing.sqlserver_emulator import types as T

_VARIANT_MAX = 8009
#: Fixed-length base-type tokens of a sql_variant ([MS-TDS] 2.2.5.4.1 and 2.2.5.5.4).
_VARIANT_FIXED = {
    "tinyint": 0x30, "bit": 0x32, "smallint": 0x34, "int": 0x38, "smalldatetime": 0x3A, "real": 0x3B,
    "money": 0x3C, "datetime": 0x3D, "float": 0x3E, "smallmoney": 0x7A, "bigint": 0x7F,
    "uniqueidentifier": T.GUIDTYPE, "date": T.DATEN,
}  # fmt: skip
_VARIANT_SCALED = {"time": T.TIMEN, "datetime2": T.DATETIME2N, "datetimeoffset": T.DATETIMEOFFSETN}
_VARIANT_DECIMAL = {"decimal": T.DECIMALN, "numeric": T.NUMERICN}
#: CLR system types: MAX_BYTE_SIZE and .NET class (Microsoft.SqlServer.Types).
_CLR = {"hierarchyid": (892, "SqlHierarchyId"), "geometry": (0xFFFF, "SqlGeometry"),
        "geography": (0xFFFF, "SqlGeography")}  # fmt: skip
_ASSEMBLY = "Microsoft.SqlServer.Types, Version=11.0.0.0, Culture=neutral, PublicKeyToken=89845dcd8080cc91"
_DECLARATION = re.compile(r"^\s*<\?xml\s[^?]*\?>", re.IGNORECASE)


def type_info(t: T.SqlType) -> bytes:
    """TYPE_INFO of a special type (see the module docstring)."""
    if t.name == "xml":
        return bytes((T.XMLTYPE, 0))
    if t.name == "sql_variant":
        return bytes((T.SSVARIANT,)) + struct.pack("<I", _VARIANT_MAX)
    if t.name == "timestamp":
        return bytes((T.BIGBINARY,)) + struct.pack("<H", 8)
    size, cls = _CLR[t.name]
    # DB_NAME is the column's database on a real server; no client we know reads it
    return (
        bytes((T.UDTTYPE,)) + struct.pack("<H", size) + _b_varchar("") + _b_varchar("sys")
        + _b_varchar(t.name) + _us_varchar(f"Microsoft.SqlServer.Types.{cls}, {_ASSEMBLY}")
    )  # fmt: skip


def encode(t: T.SqlType, value: Any) -> bytes:
    """One value of a special type for a ROW token."""
    if t.name == "xml":
        return T._plp(None if value is None else xml_text(value).encode("utf-16-le"))
    if t.name == "sql_variant":
        if value is None:
            return b"\x00\x00\x00\x00"
        body = variant_body(str(value))
        return struct.pack("<I", len(body)) + body
    if t.name == "timestamp":
        return b"\xff\xff" if value is None else T._len2(bytes(value))
    return T._plp(None if value is None else bytes(value))


# -- xml ---------------------------------------------------------------------------------------
def xml_text(value: Any) -> str:
    """The xml as SQL Server returns it: the declaration dropped, whitespace-only text dropped,
    character references resolved, attribute values double-quoted, empty elements ``<a />``,
    ``&``/``<``/``>`` escaped in text; comments and processing instructions kept.  (SQL Server
    stores xml parsed and serialises it again on every read.)"""
    text = _DECLARATION.sub("", str(value))
    doc = minidom.parseString(f"<emulator-fragment>{text}</emulator-fragment>")
    return "".join(_node(n) for n in doc.documentElement.childNodes)  # type: ignore[union-attr]


def _node(node: Any) -> str:
    if node.nodeType in (node.TEXT_NODE, node.CDATA_SECTION_NODE):
        return "" if not node.data.strip() else escape(node.data)
    if node.nodeType == node.COMMENT_NODE:
        return f"<!--{node.data}-->"
    if node.nodeType == node.PROCESSING_INSTRUCTION_NODE:
        return f"<?{node.target} {node.data}?>"
    attrs = "".join(f' {name}="{escape(val, {chr(34): "&quot;"})}"' for name, val in node.attributes.items())
    inner = "".join(_node(n) for n in node.childNodes)
    return f"<{node.tagName}{attrs}>{inner}</{node.tagName}>" if inner else f"<{node.tagName}{attrs} />"


# -- sql_variant -------------------------------------------------------------------------------
def variant_literal(spec: str, value: Any) -> str:
    """How a sql_variant holding ``value`` as base type ``spec`` (``int``, ``nvarchar(10)``,
    ``decimal(9,2)``, ``datetime2(7)``, ``varbinary(8)`` ...) is stored: ``<spec>:<value text>``
    (binary values as ``0x`` hex, times as SQL Server's literal text).

    :raises TypeSpecError: a type sql_variant cannot hold ((max) types, xml, timestamp, CLR ...).
    """
    base = _variant_base(spec)
    if isinstance(value, bytes | bytearray):
        text = "0x" + bytes(value).hex()
    elif isinstance(value, dt.datetime | dt.date | dt.time) and base.name in _VARIANT_SCALED:
        text = T.canonical_clock(base, value)
    else:
        text = str(value)
    return f"{base}:{text}"


def variant_body(stored: str) -> bytes:
    """VARIANT_BASETYPE, VARIANT_PROPBYTES, properties and data of a stored sql_variant."""
    spec, _, text = stored.partition(":")
    base = _variant_base(spec)
    n = base.name
    if n in _VARIANT_FIXED:
        token, props = _VARIANT_FIXED[n], b""
        data = T._encode_fixed(base, _fixed_value(n, text))
    elif n in _VARIANT_SCALED:
        token, props, data = _VARIANT_SCALED[n], bytes((base.scale,)), T._encode_clock(base, text)
    elif n in _VARIANT_DECIMAL:
        token, props = _VARIANT_DECIMAL[n], bytes((base.precision, base.scale))
        data = T._decimal_bytes(Decimal(text), base.precision, base.scale)
    elif n in T._BINARIES:
        token, props = T._BINARIES[n], struct.pack("<H", base.length)
        data = base._payload(bytes.fromhex(text[2:] if text.startswith("0x") else text))
    else:  # character types: collation, then the maximum length in bytes
        token, props = T._STRINGS[n], T.COLLATION + struct.pack("<H", base.max_length)
        data = base._payload(text)
    return bytes((token, len(props))) + props + data


def _variant_base(spec: str) -> T.SqlType:
    base = T.SqlType.parse(spec)
    holdable = (*_VARIANT_FIXED, *_VARIANT_SCALED, *_VARIANT_DECIMAL, *T._BINARIES, *T._STRINGS)
    if base.name not in holdable or base.length == T.MAX:
        raise T.TypeSpecError(f"a sql_variant cannot hold {spec!r}")
    return base


def _fixed_value(name: str, text: str) -> Any:
    if name in ("tinyint", "smallint", "int", "bigint"):
        return int(text)
    if name == "bit":
        return text.strip().lower() in ("1", "true")
    if name in ("real", "float"):
        return float(text)
    if name in ("money", "smallmoney"):
        return Decimal(text)
    if name == "date":
        return dt.date.fromisoformat(text.strip())
    if name in ("datetime", "smalldatetime"):
        return dt.datetime.fromisoformat(text.strip())
    return text  # uniqueidentifier


# -- alias types -------------------------------------------------------------------------------
_ALIASES: dict[str, T.SqlType] = {}
_LOCK = threading.Lock()


def register_alias(qualified: str, base: T.SqlType) -> T.SqlType:
    """Make ``schema.name`` parse as an alias of ``base`` (the latest ``CREATE TYPE`` of a name
    wins: the registry is per process, not per emulated database)."""
    schema, _, name = qualified.rpartition(".")
    alias = T.SqlType(base.name, base.length, base.precision, base.scale, f"{schema or 'dbo'}.{name}")
    with _LOCK:
        _ALIASES[alias.alias.lower()] = alias
        _ALIASES[name.lower()] = alias
    return alias


def lookup_alias(spec: str) -> T.SqlType | None:
    """The alias type ``spec`` names (``Phone``, ``dbo.Phone``, ``[dbo].[Phone]``), if any."""
    key = spec.strip().replace("[", "").replace("]", "").lower()
    with _LOCK:
        return _ALIASES.get(key)


def _b_varchar(text: str) -> bytes:
    data = text.encode("utf-16-le")
    return bytes((len(data) // 2,)) + data


def _us_varchar(text: str) -> bytes:
    data = text.encode("utf-16-le")
    return struct.pack("<H", len(data) // 2) + data

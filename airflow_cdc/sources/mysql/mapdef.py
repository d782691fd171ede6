"""Table structures stated by TABLE_MAP events, and whether a history structure is their binary form.

A TABLE_MAP event always carries each column's binlog type and metadata (DECIMAL precision and
scale, fractional seconds, byte lengths, BLOB size class, BIT width) and nullability; with
``binlog_row_metadata=MINIMAL`` also signedness and collations, with ``FULL`` names, ENUM/SET
labels and the primary key as well.  :func:`image_of_map` and :func:`image_of_def` reduce a map
column and a history column to the same comparable tuple, ``None`` standing for what the map
does not state, so a history structure is only used where the binlog itself agrees with it.
"""

from __future__ import annotations

from typing import Any

from airflow_cdc.sources.mysql import client
from airflow_cdc.sources.mysql import protocol as p
from airflow_cdc.sources.mysql import rowcodec as rc
from airflow_cdc.sources.mysql.charsets import decode
from airflow_cdc.sources.mysql.schema import ColumnDef, TableDef

BINARY_COLLATION = 63
_BY_TYPE = {
    rc.T_TINY: "tinyint",
    rc.T_SHORT: "smallint",
    rc.T_INT24: "mediumint",
    rc.T_LONG: "int",
    rc.T_LONGLONG: "bigint",
    rc.T_FLOAT: "float",
    rc.T_DOUBLE: "double",
    rc.T_NEWDECIMAL: "decimal",
    rc.T_DATE: "date",
    rc.T_NEWDATE: "date",
    rc.T_DATETIME: "datetime",
    rc.T_DATETIME2: "datetime",
    rc.T_TIMESTAMP: "timestamp",
    rc.T_TIMESTAMP2: "timestamp",
    rc.T_TIME: "time",
    rc.T_TIME2: "time",
    rc.T_YEAR: "year",
    rc.T_BIT: "bit",
    rc.T_ENUM: "enum",
    rc.T_SET: "set",
    rc.T_JSON: "json",
    rc.T_STRING: "string",
    rc.T_VARCHAR: "varstring",
    rc.T_VAR_STRING: "varstring",
    rc.T_BLOB: "lob",
    rc.T_GEOMETRY: "geometry",
}
_FAMILY = {"real": "double", "char": "string", "binary": "string", "varchar": "varstring"}
_FAMILY["varbinary"] = "varstring"
_LOB_SIZE = {"tiny": 1, "": 2, "medium": 3, "long": 4}
_LOB_PREFIX = {v: k for k, v in _LOB_SIZE.items()}
_SPATIAL = frozenset(
    {"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon"}
) | {"geometrycollection", "geomcollection"}
_NUMERIC = ("tinyint", "smallint", "mediumint", "int", "bigint", "float", "double", "decimal")


class Charsets:
    """Collation id -> character set name, and each character set's bytes per character (read once)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._by_id: dict[int, str] | None = None
        self._maxlen: dict[str, int] = {}

    def _load(self) -> dict[int, str]:
        if self._by_id is None:
            rows = client.query(self.conn, "SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATIONS")
            self._by_id = {int(i): str(c) for i, c in rows if i is not None}
            sets = client.query(
                self.conn, "SELECT CHARACTER_SET_NAME, MAXLEN FROM information_schema.CHARACTER_SETS"
            )
            self._maxlen = {str(c): int(n) for c, n in sets}
        return self._by_id

    def name(self, collation: int | None) -> str | None:
        if collation is None:
            return None
        return "binary" if collation == BINARY_COLLATION else self._load().get(collation)

    def maxlen(self, charset: str | None) -> int:
        self._load()
        return self._maxlen.get(charset or "utf8mb4", 4) if charset != "binary" else 1


def _set_pack_length(labels: int) -> int:
    n = (labels + 7) // 8
    return 8 if n > 4 else n


def map_labels(tm: p.TableMap, i: int, charsets: Charsets, fallback: str | None = None) -> list[str] | None:
    """The ENUM/SET labels of column ``i`` as the map logs them, decoded in the column's character
    set (the map's ENUM_AND_SET charset metadata, else ``fallback``); None when not logged.

    The labels are bytes in the column's character set: a latin1 ``'€'`` is ``0x80``, which read
    as UTF-8 would be garbled (the snapshot reads them from information_schema, already decoded).
    """
    t = tm.types[i]
    k = sum(1 for j in range(i) if tm.types[j] == t)
    raw = tm.enums_raw if t == rc.T_ENUM else tm.sets_raw
    if k >= len(raw):
        decoded = tm.enums if t == rc.T_ENUM else tm.sets
        return list(decoded[k]) if k < len(decoded) else None
    ordinal = sum(1 for j in range(i) if p.enum_or_set(tm, j))
    known = tm.enum_charsets is not None and ordinal < len(tm.enum_charsets)
    collation = tm.enum_charsets[ordinal] if known else None  # type: ignore[index]
    charset = charsets.name(collation) if collation is not None else fallback
    return [decode(v, charset) for v in raw[k]]


def image_of_map(tm: p.TableMap, i: int, charsets: Charsets) -> tuple:
    """What the binlog states about column ``i``: (family, size/precision details, signedness, charset)."""
    t, meta = tm.types[i], tm.metas[i]
    family = _BY_TYPE.get(t, f"type{t}")
    unsigned = bool(tm.unsigned[i]) if tm.unsigned is not None and family in _NUMERIC else None
    charset = charsets.name(tm.charsets[i]) if tm.charsets is not None else None
    if family in ("string", "varstring", "lob"):
        return (family, meta, charset)
    if family in ("enum", "set"):
        labels = map_labels(tm, i, charsets)
        return (family, meta, None if labels is None else tuple(labels))
    if family in ("datetime", "timestamp", "time"):
        return (family, meta if t in (rc.T_DATETIME2, rc.T_TIMESTAMP2, rc.T_TIME2) else None)
    if family in ("decimal", "bit"):
        return (family, meta, unsigned)
    return (family, unsigned)


def image_of_def(col: ColumnDef, charsets: Charsets) -> tuple:
    """The binary form a history column has in the binlog, in :func:`image_of_map`'s terms."""
    t = col.data_type
    if t in _SPATIAL:
        return ("geometry", None)
    if t.endswith(("text", "blob")):
        size = _LOB_SIZE.get(t[:-4], 0)
        return ("lob", size, "binary" if t.endswith("blob") else col.charset)
    family = _FAMILY.get(t, t)
    if family in ("string", "varstring"):
        charset = "binary" if t in ("binary", "varbinary") else col.charset
        return (family, (col.length or 0) * charsets.maxlen(charset), charset)
    if family in ("enum", "set"):
        n = len(col.values)
        pack = (1 if n < 256 else 2) if family == "enum" else _set_pack_length(n)
        return (family, pack, tuple(col.values))
    if family in ("datetime", "timestamp", "time"):
        return (family, col.fsp or 0)
    if family == "decimal":
        return (family, (col.precision or 10) << 8 | (col.scale or 0), col.unsigned)
    if family == "bit":
        return (family, col.precision or 1, None)
    return (family, col.unsigned if family in _NUMERIC else None)


def images_match(history: tuple, binlog: tuple) -> bool:
    """Equal wherever the binlog states a value (``None`` in ``binlog``: not stated)."""
    return len(history) == len(binlog) and all(
        b is None or h == b for h, b in zip(history, binlog, strict=True)
    )


def layout_matches(tdef: TableDef, tm: p.TableMap, charsets: Charsets) -> bool:
    """Whether the map's columns are, position by position, the binary form of ``tdef``'s."""
    if len(tdef.columns) != len(tm.types):
        return False
    if tm.names is not None and [c.name for c in tdef.columns] != tm.names:
        return False
    return all(
        images_match(image_of_def(c, charsets), image_of_map(tm, i, charsets))
        for i, c in enumerate(tdef.columns)
    )


def column_from_map(tm: p.TableMap, i: int, charsets: Charsets) -> ColumnDef:
    """Column ``i`` exactly as the (full-metadata) map states it; declared-only details stay default."""
    image = image_of_map(tm, i, charsets)
    family, meta = image[0], tm.metas[i]
    name = tm.names[i] if tm.names else f"col{i}"
    charset = image[2] if family in ("string", "varstring", "lob") else None
    binary = charset == "binary"
    unsigned = " unsigned" if tm.unsigned and tm.unsigned[i] and family in _NUMERIC else ""
    col = ColumnDef(name, family, family + unsigned, tm.nullable[i], None if binary else charset)
    if family in ("string", "varstring"):
        base = (
            ("binary" if binary else "char") if family == "string" else ("varbinary" if binary else "varchar")
        )
        col.length = meta // charsets.maxlen(charset)
        col.data_type, col.column_type = base, f"{base}({col.length})"
    elif family == "lob":
        col.data_type = _LOB_PREFIX.get(meta, "long") + ("blob" if binary else "text")
        col.column_type = col.data_type
    elif family in ("enum", "set"):
        labels = image[2] or ()
        col.column_type = family + "(" + ",".join("'" + v.replace("'", "''") + "'" for v in labels) + ")"
    elif family in ("datetime", "timestamp", "time"):
        col.fsp = image[1] or 0
        col.column_type = f"{family}({col.fsp})" if col.fsp else family
    elif family == "decimal":
        col.precision, col.scale = meta >> 8, meta & 0xFF
        col.column_type = f"decimal({col.precision},{col.scale}){unsigned}"
    elif family == "bit":
        col.precision, col.column_type = meta, f"bit({meta})"
    elif family == "geometry":
        # GEOMETRY_TYPE metadata (one per spatial column; 1 = POINT): Debezium's Point has x and y
        k = sum(1 for j in range(i) if tm.types[j] == rc.T_GEOMETRY)
        if k < len(tm.geometry_types) and tm.geometry_types[k] == 1:
            col.data_type = col.column_type = "point"
    return col

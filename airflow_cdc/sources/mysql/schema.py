"""Table structures and the schema history (every DDL with its binlog position).

A :class:`TableDef` is what information_schema says about a table; the history keeps, per
table, the structure versions with the binlog coordinate from which each applies, plus the
DDL statements themselves (Debezium's schema change events: ``ddl``, ``tableChanges``).  It is
stored in the connector state, so after a restart an event is decoded with the structure that
applied when it was written.  information_schema is read when the DDL is captured, not when it
ran, so each version also keeps the binlog head at that read: :mod:`proof` checks that no later
DDL on the table lies in between before a row is trusted to the version.  With
``binlog_row_metadata=FULL`` the TABLE_MAP events state the structure themselves (:mod:`mapdef`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_cdc.sources.mysql import client
from airflow_cdc.sources.mysql import sql as q

SYSTEM_DATABASES = ("mysql", "information_schema", "performance_schema", "sys")
HISTORY_DDL_KEPT = 200


def enum_labels(column_type: str) -> list[str]:
    """The labels of an ``enum('a','b')`` / ``set(...)`` column type, in declaration order (``''``
    inside a label is a quote)."""
    inner = column_type[column_type.find("(") + 1 : column_type.rfind(")")]
    return [m.replace("''", "'") for m in re.findall(r"'((?:[^']|'')*)'", inner)]


@dataclass
class ColumnDef:
    """One column: ``data_type`` is information_schema's DATA_TYPE, ``column_type`` the full
    declared type (``int(10) unsigned``, ``enum('a','b')``)."""

    name: str
    data_type: str
    column_type: str
    nullable: bool = True
    charset: str | None = None
    length: int | None = None
    precision: int | None = None
    scale: int | None = None
    fsp: int | None = None
    auto_increment: bool = False
    #: declared BOOLEAN/BOOL in a DDL the connector read from the binlog (information_schema only
    #: says ``tinyint(1)``): Debezium's DDL parser makes such a column a JDBC BOOLEAN
    boolean: bool = False

    @property
    def unsigned(self) -> bool:
        return "unsigned" in self.column_type

    @property
    def values(self) -> list[str]:
        """ENUM / SET labels in declaration order."""
        return enum_labels(self.column_type)


@dataclass
class TableDef:
    db: str
    table: str
    columns: list[ColumnDef]
    key: list[str] = field(default_factory=list)
    charset: str | None = None

    @property
    def name(self) -> str:
        return f"{self.db}.{self.table}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TableDef:
        cols = [ColumnDef(**c) for c in data["columns"]]
        return cls(data["db"], data["table"], cols, list(data.get("key") or []), data.get("charset"))

    def table_change(self, kind: str) -> dict[str, Any]:
        """Debezium's ``tableChanges`` entry for this structure."""
        return {
            "type": kind,
            "id": f'"{self.db}"."{self.table}"',
            "table": {
                "defaultCharsetName": self.charset,
                "primaryKeyColumnNames": list(self.key),
                "columns": [
                    {
                        "name": c.name,
                        "typeName": c.data_type.upper(),
                        "typeExpression": c.column_type,
                        "charsetName": c.charset,
                        "length": c.length or c.precision,
                        "scale": c.scale,
                        "position": i + 1,
                        "optional": c.nullable,
                        "autoIncremented": c.auto_increment,
                        "generated": c.auto_increment,
                    }
                    for i, c in enumerate(self.columns)
                ],
                "attributes": [],
            },
        }


def as_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _column(row: tuple) -> ColumnDef:
    name, dtype, ctype, nullable, charset, length, precision, scale, fsp, extra = row
    dtype = str(dtype).lower()
    return ColumnDef(
        str(name),
        dtype,
        # ENUM / SET labels keep their case: they are the values
        str(ctype) if dtype in ("enum", "set") else str(ctype).lower(),
        str(nullable) == "YES",
        charset and str(charset),
        as_int(length),
        as_int(precision),
        as_int(scale),
        as_int(fsp),
        "auto_increment" in str(extra or "").lower(),
    )


def load_tables(
    conn: Any, db_filter: Any = None, names: list[tuple[str, str]] | None = None
) -> dict[str, TableDef]:
    """Structures of base tables from information_schema, keyed ``db.table``.

    :param names: only these (db, table) pairs; else every non-system table.
    """
    if names is not None and not names:
        return {}
    where, args = q.tables_where(names, SYSTEM_DATABASES)
    tables: dict[str, TableDef] = {}
    for db, table, charset in client.query(conn, q.TABLES + where + " ORDER BY 1, 2", args):
        tables[f"{db}.{table}"] = TableDef(
            str(db), str(table), [], [], charset and str(charset).split("_")[0]
        )
    if not tables:
        return tables
    for row in client.query(
        conn, q.COLUMNS + where.replace("t.", "c.") + " ORDER BY 1, 2, c.ORDINAL_POSITION", args
    ):
        td = tables.get(f"{row[0]}.{row[1]}")
        if td is not None:
            td.columns.append(_column(row[2:]))
    for db, table, column in client.query(
        conn, q.PRIMARY_KEYS + where.replace("t.", "k.") + " ORDER BY 1, 2, k.ORDINAL_POSITION", args
    ):
        td = tables.get(f"{db}.{table}")
        if td is not None:
            td.key.append(str(column))
    return tables


_IDENT = r"(?:`(?:[^`]|``)+`|[\w$]+)"
_NAME = rf"({_IDENT}(?:\s*\.\s*{_IDENT})?)"
_DDL_PATTERNS = [
    re.compile(p, re.IGNORECASE | re.DOTALL)
    for p in (
        rf"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMPORARY\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?{_NAME}",
        rf"^\s*ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\s+(?:IF\s+EXISTS\s+)?{_NAME}",
        rf"^\s*TRUNCATE\s+(?:TABLE\s+)?{_NAME}",
        rf"^\s*(?:CREATE|DROP)\s+(?:UNIQUE\s+|FULLTEXT\s+|SPATIAL\s+)?INDEX\s+.*?\s+ON\s+{_NAME}",
    )
]
_DROP = re.compile(
    r"^\s*DROP\s+(?:TEMPORARY\s+)?TABLES?\s+(?:IF\s+EXISTS\s+)?(.*?)(?:\s+(?:RESTRICT|CASCADE))?"
    r"\s*(?:/\*.*)?$",
    re.IGNORECASE | re.DOTALL,
)
_RENAME = re.compile(r"^\s*RENAME\s+TABLES?\s+(.*)$", re.IGNORECASE | re.DOTALL)
_COMMENT = re.compile(r"^\s*(?:/\*.*?\*/\s*|#[^\n]*\n\s*|--[^\n]*\n\s*)+", re.DOTALL)


def _split_name(text: str, default_db: str) -> tuple[str, str]:
    parts = re.findall(_IDENT, text)
    parts = [p[1:-1].replace("``", "`") if p.startswith("`") else p for p in parts]
    return (default_db, parts[0]) if len(parts) == 1 else (parts[0], parts[1])


def ddl_tables(ddl: str, default_db: str) -> tuple[str, list[tuple[str, str]]]:
    """(kind, tables) a DDL statement touches: kind is CREATE, ALTER, DROP, TRUNCATE, RENAME or ''."""
    text = _COMMENT.sub("", ddl, count=1)
    kinds = ("CREATE", "ALTER", "TRUNCATE", "ALTER")
    for kind, pattern in zip(kinds, _DDL_PATTERNS, strict=True):
        match = pattern.match(text)
        if match:
            return kind, [_split_name(match[1], default_db)]
    match = _DROP.match(text)
    if match:
        return "DROP", [_split_name(n, default_db) for n in re.findall(_NAME, match[1])]
    match = _RENAME.match(text)
    if match:
        names = re.findall(_NAME, match[1])
        pairs = [n for n in names if n.upper() != "TO"]
        return "RENAME", [_split_name(n, default_db) for n in pairs]
    return "", []


_DECLARED = re.compile(
    rf"(?:^|[(,](?!\s*(?:ADD|MODIFY|CHANGE|ALTER|DROP|RENAME)\b)|\bADD(?:\s+COLUMN)?(?:\s+IF\s+NOT\s+EXISTS)?|\bMODIFY(?:\s+COLUMN)?(?:\s+IF\s+EXISTS)?"
    rf"|\bCHANGE(?:\s+COLUMN)?(?:\s+IF\s+EXISTS)?\s+{_IDENT})\s*({_IDENT})\s+([A-Za-z]\w*)",
    re.IGNORECASE,
)
_RENAME_COLUMN = re.compile(
    rf"\bRENAME\s+COLUMN\s+(?:IF\s+EXISTS\s+)?({_IDENT})\s+TO\s+({_IDENT})", re.IGNORECASE
)


def _unquote(name: str) -> str:
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


def declare_booleans(ddl: str, tdef: TableDef, previous: TableDef | None) -> None:
    """Mark the ``tinyint(1)`` columns of ``tdef`` (read after ``ddl``) that are declared BOOLEAN.

    Debezium parses each DDL: a column a statement declares ``BOOL``/``BOOLEAN`` is a JDBC
    BOOLEAN (true/false) until a statement declares it again; information_schema only says
    ``tinyint(1)``.  Columns the statement does not declare keep the mark of ``previous`` (the
    structure before, followed through ``RENAME COLUMN``).  The scan is lexical: anything that
    looks like ``name type`` after ``(``, ``,``, ``ADD``, ``MODIFY`` or ``CHANGE old`` counts.
    """
    text = _COMMENT.sub("", ddl, count=1)
    declared = {_unquote(m[1]).lower(): m[2].lower() in ("bool", "boolean") for m in _DECLARED.finditer(text)}
    renamed = {_unquote(m[2]).lower(): _unquote(m[1]).lower() for m in _RENAME_COLUMN.finditer(text)}
    before = {c.name.lower(): c for c in previous.columns} if previous else {}
    for col in tdef.columns:
        if not col.column_type.startswith("tinyint(1)"):
            continue
        name = col.name.lower()
        if name in declared:
            col.boolean = declared[name]
        else:
            old = before.get(renamed.get(name, name))
            col.boolean = bool(old and old.boolean and old.column_type == col.column_type)


#: (coordinate from which it applies, structure or None when dropped, binlog head when read)
Version = tuple[int, TableDef | None, int]


class SchemaHistory:
    """Structure versions per table (``(coordinate, TableDef | None, read_at)``, ascending) and recent DDLs.

    ``read_at`` is the binlog head read just after information_schema was: the structure is the
    one at ``coordinate`` only if no DDL on the table lies between the two (:mod:`proof` checks).
    JSON shape in the state: ``{"tables": {"db.t": [[coord, def|null, read_at], ...]}, "ddl": [...]}``;
    versions stored before ``read_at`` existed count as read at their own coordinate.
    """

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        data = data or {}
        self.versions: dict[str, list[Version]] = {
            name: [
                (int(v[0]), TableDef.from_json(v[1]) if v[1] else None, int(v[2] if len(v) > 2 else v[0]))
                for v in vs
            ]
            for name, vs in (data.get("tables") or {}).items()
        }
        self.ddl: list[dict[str, Any]] = list(data.get("ddl") or [])

    def to_json(self) -> dict[str, Any]:
        return {
            "tables": {
                n: [[c, d.to_json() if d else None, r] for c, d, r in vs] for n, vs in self.versions.items()
            },
            "ddl": self.ddl[-HISTORY_DDL_KEPT:],
        }

    def version_at(self, name: str, coord: int) -> Version | None:
        """The version of ``name`` that applied at binlog coordinate ``coord``."""
        found = None
        for v in self.versions.get(name, ()):
            if v[0] > coord:
                break
            found = v
        return found

    def at(self, name: str, coord: int) -> TableDef | None:
        """The structure of ``name`` that applied at binlog coordinate ``coord``."""
        v = self.version_at(name, coord)
        return None if v is None else v[1]

    def latest(self, name: str) -> TableDef | None:
        vs = self.versions.get(name)
        return vs[-1][1] if vs else None

    def record(self, name: str, coord: int, tdef: TableDef | None, read_at: int | None = None) -> None:
        """Add a version from ``coord`` on (replacing versions at or after it: a re-read window).

        :param read_at: binlog head read after ``tdef`` was read from information_schema.
        """
        vs = [v for v in self.versions.get(name, []) if v[0] < coord]
        vs.append((coord, tdef, coord if read_at is None else max(read_at, coord)))
        self.versions[name] = vs

    def prune(self, before: int) -> None:
        """Drop versions superseded before ``before`` (the committed offset), keeping one per table."""
        for name, vs in list(self.versions.items()):
            keep = [v for v in vs if v[0] >= before]
            older = [v for v in vs if v[0] < before]
            if older and older[-1][1] is not None:
                keep.insert(0, older[-1])
            if keep:
                self.versions[name] = keep
            else:
                del self.versions[name]

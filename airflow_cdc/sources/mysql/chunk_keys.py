"""Snapshot chunk cursors that the server compares exactly, for every key type MySQL allows.

The chunk cursor (``TableSnapshot.last_key`` / ``max_key``, JSON in the connector state) is the
server's own text of each key column, read with fixed session settings, and bound back with an
expression that makes the server compare it as the column's own type and collation:

=====================  ======================  =============================================
type                   cursor text             bound back as
=====================  ======================  =============================================
integers, YEAR         the value               an integer
ENUM, SET, BIT         ``col + 0`` (index)     an integer (ORDER BY and ``>`` use the index)
DECIMAL                the value               ``CAST(%s AS DECIMAL(p, s))`` (a string would
                                               compare as DOUBLE)
FLOAT, DOUBLE          ``col + 0e0``           a double (shortest round-trip text)
DATE, DATETIME, TIME   the value               ``CAST(%s AS DATE / DATETIME(6) / TIME(6))``
TIMESTAMP              the value in UTC        ``CAST(%s AS DATETIME(6))`` (UTC has no DST, so
                                               no two instants share a text)
character types        ``HEX(col)``            ``CONVERT(UNHEX(%s) USING cs) COLLATE coll``
binary types           ``HEX(col)``            ``UNHEX(%s)``
=====================  ======================  =============================================

This is separate from the tracker's key text (the binlog decoder's neutral form), which the
chunk rows keep in their key columns.  Types without such an order (spatial types, MySQL's
native JSON) are refused at start, naming table and column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_cdc.core import key_bounds
from airflow_cdc.core.errors import UnsupportedType
from airflow_cdc.sources.mysql import sql as q
from airflow_cdc.sources.mysql.schema import ColumnDef, TableDef

#: Version of the cursor form kept in ``TableSnapshot.cursor_format``; a snapshot stored with
#: another form (before 2: the binlog decoder's neutral values) restarts its table.
CURSOR_FORMAT = 2
#: Fixed session settings for cursor texts (TIMESTAMP text in UTC).
SESSION_SQL = "SET time_zone = '+00:00'"

_INTS = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint", "year"})
_BY_INDEX = frozenset({"enum", "set", "bit"})
_CASTS = {"date": "DATE", "datetime": "DATETIME(6)", "timestamp": "DATETIME(6)", "time": "TIME(6)"}
CHARS = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext"})
_BINARY = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
COLLATIONS = (
    "SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
)


@dataclass(frozen=True)
class KeyColumn:
    """One chunking column: ``cursor`` selects its cursor text, ``bind`` reads one back (``%s``)."""

    name: str
    cursor: str
    bind: str
    integer: bool
    nullable: bool

    def param(self, text: str | None) -> Any:
        if text is None:
            return None
        return int(text) if self.integer else text


def key_column(table: str, col: ColumnDef, collation: str | None) -> KeyColumn:
    """How ``col`` is chunked.

    :raises UnsupportedType: the type has no order the server can compare exactly.
    """
    name, t = q.ident(col.name), col.data_type
    if t in _INTS:
        return KeyColumn(col.name, name, "%s", True, col.nullable)
    if t in _BY_INDEX:
        return KeyColumn(col.name, f"{name} + 0", "%s", True, col.nullable)
    if t == "decimal":
        bind = f"CAST(%s AS DECIMAL({int(col.precision or 10)}, {int(col.scale or 0)}))"
        return KeyColumn(col.name, name, bind, False, col.nullable)
    if t in ("float", "double", "real"):
        return KeyColumn(col.name, f"{name} + 0e0", "CAST(%s AS DOUBLE)", False, col.nullable)
    if t in _CASTS:
        return KeyColumn(col.name, name, f"CAST(%s AS {_CASTS[t]})", False, col.nullable)
    if t in _BINARY or (t in CHARS and col.charset == "binary"):
        return KeyColumn(col.name, f"HEX({name})", "UNHEX(%s)", False, col.nullable)
    if t in CHARS and col.charset:
        if collation is None:  # information_schema names one for every character column
            raise UnsupportedType(f"table {table}: no collation known for key column {col.name!r}")
        bind = f"CONVERT(UNHEX(%s) USING {_word(col.charset)}) COLLATE {_word(collation)}"
        return KeyColumn(col.name, f"HEX({name})", bind, False, col.nullable)
    raise UnsupportedType(
        f"table {table}: key column {col.name!r} has type {col.column_type!r}, which has no order "
        "the snapshot can chunk by exactly",
        hint="choose other key columns with message.key.columns (or another surrogate-key)",
    )


def _word(name: str) -> str:
    """A charset or collation name (from information_schema) as a bare SQL word."""
    if not name.replace("_", "").isalnum():
        raise UnsupportedType(f"unexpected character set or collation name {name!r}")
    return name


def check_key(tdef: TableDef, names: Sequence[str]) -> None:
    """Refuse, at start, key columns the snapshot cannot chunk by exactly.

    :raises UnsupportedType: naming table and column.
    """
    key_columns(tdef, names, {n: "binary" for n in names})


def needs_collations(tdef: TableDef, names: Sequence[str]) -> bool:
    cols = {c.name: c for c in tdef.columns}
    return any(cols[n].data_type in CHARS for n in names if n in cols)


def key_columns(tdef: TableDef, names: Sequence[str], collations: dict[str, str]) -> list[KeyColumn]:
    """The chunking columns ``names`` of ``tdef``.

    :raises UnsupportedType: a column cannot be chunked exactly, or does not exist.
    """
    cols = {c.name: c for c in tdef.columns}
    missing = [n for n in names if n not in cols]
    if missing:
        raise UnsupportedType(f"table {tdef.name}: snapshot key column(s) {missing} do not exist")
    return [key_column(tdef.name, cols[n], collations.get(n)) for n in names]


def read_collations(cur: Any, tdef: TableDef) -> dict[str, str]:
    cur.execute(COLLATIONS, (tdef.db, tdef.table))
    return {str(n): str(c) for n, c in cur.fetchall() if c is not None}


def _render(keys: Sequence[KeyColumn], dnf: key_bounds.Dnf, values: Sequence[str | None]) -> tuple[str, list]:
    ors, args = [], []
    for conj in dnf:
        ands = []
        for i, op in conj:
            name = q.ident(keys[i].name)
            if op in ("null", "not null"):
                ands.append(f"{name} IS {op.upper()}")
            else:
                ands.append(f"{name} {op} {keys[i].bind}")
                args.append(keys[i].param(values[i]))
        ors.append("(" + (" AND ".join(ands) or "TRUE") + ")")
    return "(" + (" OR ".join(ors) or "FALSE") + ")", args


def bound(keys: Sequence[KeyColumn], values: Sequence[str | None], op: str) -> tuple[str, list]:
    """``keys op values`` (``op``: ``>`` or ``<=``) in the order of ``ORDER BY keys`` (NULLs first).

    A plain row comparison when no NULL can take part (it lets the server range-scan the key
    index); otherwise written out with explicit NULL tests.
    """
    nullable = [k.nullable for k in keys]
    if not key_bounds.needs_expansion(values, nullable):
        cols = ", ".join(q.ident(k.name) for k in keys)
        binds = ", ".join(k.bind for k in keys)
        return f"({cols}) {op} ({binds})", [k.param(v) for k, v in zip(keys, values, strict=True)]
    dnf = key_bounds.after if op == ">" else key_bounds.upto
    return _render(keys, dnf(values, nullable, True), values)

"""SQL text: identifiers quoted with backticks (doubled inside), values always bound parameters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_cdc.core.conditions import Piece, pieces_to_text

TABLES = (
    "SELECT t.TABLE_SCHEMA, t.TABLE_NAME, t.TABLE_COLLATION FROM information_schema.TABLES t "
    "WHERE t.TABLE_TYPE = 'BASE TABLE' AND "
)
COLUMNS = (
    "SELECT c.TABLE_SCHEMA, c.TABLE_NAME, c.COLUMN_NAME, c.DATA_TYPE, c.COLUMN_TYPE, c.IS_NULLABLE, "
    "c.CHARACTER_SET_NAME, c.CHARACTER_MAXIMUM_LENGTH, c.NUMERIC_PRECISION, c.NUMERIC_SCALE, "
    "c.DATETIME_PRECISION, c.EXTRA FROM information_schema.COLUMNS c WHERE "
)
PRIMARY_KEYS = (
    "SELECT k.TABLE_SCHEMA, k.TABLE_NAME, k.COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE k "
    "WHERE k.CONSTRAINT_NAME = 'PRIMARY' AND "
)


def tables_where(names: Sequence[tuple[str, str]] | None, system: Sequence[str]) -> tuple[str, list[str]]:
    """WHERE clause (alias ``t.``) selecting the given tables, or all outside system databases."""
    if names is None:
        clause = "t.TABLE_SCHEMA NOT IN (" + ", ".join(["%s"] * len(system)) + ")"
        args = list(system)
    else:
        clause = "(" + " OR ".join(["(t.TABLE_SCHEMA = %s AND t.TABLE_NAME = %s)"] * len(names)) + ")"
        args = [x for pair in names for x in pair]
    return clause, args


def ident(name: str) -> str:
    """Quote one identifier for MySQL."""
    return "`" + name.replace("`", "``") + "`"


def qualified(db: str, table: str) -> str:
    return f"{ident(db)}.{ident(table)}"


def _percent(text: str) -> str:
    """Text of a query with parameters: pymysql %-formats it, so a literal ``%`` is doubled."""
    return text.replace("%", "%%")


def condition_sql(pieces: Sequence[Piece]) -> tuple[str, list[Any]]:
    """An ad hoc snapshot's additional condition, parenthesised, and its parameters: columns
    quoted by :func:`ident`, literals bound (``%s``), a raw-SQL condition (opted in) as written.
    ``%`` is doubled: the text goes into a query executed with parameters."""
    text, args = pieces_to_text(pieces, ident, "%s", escape=_percent)
    return f"({text})", args


def max_key(
    db: str,
    table: str,
    cursors: Sequence[str],
    order: Sequence[str],
    condition: Sequence[Piece] | None,
    relation: str | None = None,
) -> tuple[str, list[Any] | None]:
    """The cursor texts of the greatest key (``ORDER BY ... DESC``: NULLs last, as ascending
    order puts them first), and the parameters of the query (None: it takes none).
    ``relation``: what is read instead of the table (:func:`override_relation`)."""
    desc = ", ".join(f"{ident(c)} DESC" for c in order)
    source = qualified(db, table) if relation is None else relation
    # identifiers quoted by ident(); literals of the condition are parameters
    query = f"SELECT {', '.join(cursors)} FROM {source}"  # noqa: S608
    if not condition:
        return f"{query} ORDER BY {desc} LIMIT 1", None
    where, args = condition_sql(condition)
    return f"{_percent(query)} WHERE {where} ORDER BY {_percent(desc)} LIMIT 1", args


def chunk(
    db: str,
    table: str,
    select: Sequence[str],
    order: Sequence[str],
    where: Sequence[str],
    limit: int | None,
    relation: str | None = None,
) -> str:
    """A key-ordered chunk: rows matching the predicates ``where`` (the bounds of
    :func:`airflow_cdc.sources.mysql.chunk_keys.bound`, then any :func:`condition_sql`), ``limit``
    rows at most (None: all).  Executed with parameters: ``relation`` (what is read instead of the
    table, :func:`override_relation`) has its ``%`` doubled."""
    tail = f" LIMIT {int(limit)}" if limit is not None else ""
    source = qualified(db, table) if relation is None else _percent(relation)
    return (
        f"SELECT {', '.join(select)} FROM {source} WHERE {' AND '.join(where)} "  # noqa: S608
        f"ORDER BY {', '.join(ident(c) for c in order)}{tail}"
    )


def override_relation(statement: str, columns: Sequence[str], present: set[str]) -> str:
    """A ``snapshot.select.statement.overrides`` statement as the derived table snapshot chunks read
    (:mod:`airflow_cdc.core.snapshot_overrides`): every column of the table, NULL for those the
    statement leaves out.  The statement is the operator's own SQL, on lines of its own."""
    inner = f"(\n{statement}\n) AS `snapshot_override`"
    if set(columns) <= present:
        return inner
    cols = ", ".join(ident(c) if c in present else f"NULL AS {ident(c)}" for c in columns)
    return f"(SELECT {cols} FROM {inner}) AS `snapshot_rows`"  # noqa: S608


def describe_statement(statement: str) -> str:
    """An override statement as chunks wrap it, reading no row (LIMIT 0): its result columns.
    Executed without parameters."""
    return f"SELECT * FROM (\n{statement}\n) AS `snapshot_override` LIMIT 0"  # noqa: S608

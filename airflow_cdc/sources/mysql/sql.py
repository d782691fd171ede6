"""SQL text: identifiers quoted with backticks (doubled inside), values always bound parameters."""

from __future__ import annotations

from collections.abc import Sequence

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


def max_key(db: str, table: str, cursors: Sequence[str], order: Sequence[str], condition: str | None) -> str:
    """The cursor texts of the greatest key (``ORDER BY ... DESC``: NULLs last, as ascending
    order puts them first)."""
    where = f" WHERE {condition}" if condition else ""
    desc = ", ".join(f"{ident(c)} DESC" for c in order)
    # identifiers quoted by ident(); the condition is the operator's own additional-conditions SQL
    return f"SELECT {', '.join(cursors)} FROM {qualified(db, table)}{where} ORDER BY {desc} LIMIT 1"  # noqa: S608


def chunk(
    db: str,
    table: str,
    select: Sequence[str],
    order: Sequence[str],
    where: Sequence[str],
    condition: str | None,
    limit: int | None,
) -> str:
    """A key-ordered chunk: rows matching the bound predicates ``where`` (see
    :func:`airflow_cdc.sources.mysql.chunk_keys.bound`), ``limit`` rows at most (None: all)."""
    clauses = list(where)
    if condition:
        clauses.append(f"({condition})")  # additional-conditions: the operator's own SQL filter
    tail = f" LIMIT {int(limit)}" if limit is not None else ""
    return (
        f"SELECT {', '.join(select)} FROM {qualified(db, table)} WHERE {' AND '.join(clauses)} "  # noqa: S608
        f"ORDER BY {', '.join(ident(c) for c in order)}{tail}"
    )

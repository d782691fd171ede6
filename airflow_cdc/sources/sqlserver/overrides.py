"""SQL Server's part of ``snapshot.select.statement.overrides`` (rules in
:mod:`airflow_cdc.core.snapshot_overrides`): describe a statement on the server, build its relation.

A table is listed as ``<schemaName>.<tableName>`` (the seed's form) or ``<databaseName>.<schemaName>.
<tableName>`` (Debezium's multi-database form).  Its columns are the capture instance's: a statement
may return more (``SELECT *`` of a table whose capture instance captures some columns), which are not
read.  SQL Server refuses an ``ORDER BY`` in a derived table without ``TOP``: a trailing one is
dropped before wrapping, like on every source.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow_cdc.core import snapshot_overrides as so
from airflow_cdc.sources.sqlserver import sql
from airflow_cdc.sources.sqlserver.schema import CaptureInstance


def names(ci: CaptureInstance) -> list[str]:
    """The names the capture instance's table may be listed under, its full name first."""
    return [ci.table_id, f"{ci.schema}.{ci.table}"]


def check_all(
    overrides: so.Overrides,
    current: Mapping[str, Any],
    snapshot_relation: Callable[[str], Any],
    database: str,
) -> None:
    """Check the statement of every captured table (``current``: table id -> its state, whose
    ``instance`` is its current capture instance) at start-up (:meth:`so.Overrides.check_all`).

    :raises ConfigError: a statement breaks chunking.
    """
    overrides.check_all(current, snapshot_relation, lambda table: names(current[table].instance), database)


def relation(overrides: so.Overrides, conn: Any, ci: CaptureInstance) -> str | None:
    """The derived table snapshot chunks of the capture instance's table read instead of it (None: no
    override).

    :raises ConfigError: the table's statement is refused (named with the table and the property).
    """
    columns = [c.name for c in ci.columns]
    return overrides.relation(
        ci.table_id,
        names(ci),
        columns,
        list(ci.key),
        lambda statement, table, prop: describe(conn, statement, table, prop),
        lambda statement, present: sql.override_relation(statement, columns, present),
    )


def describe(conn: Any, statement: str, table: str, prop: str) -> list[str]:
    """The statement's result column names, from ``TOP (0)`` on it as chunks wrap it (no row read).

    :raises ConfigError: the server refuses it (programming and data errors; a lost connection
        propagates as it is).
    """
    import pyodbc

    cur = conn.cursor()
    try:
        cur.execute(sql.describe_statement(statement))
        names = [str(d[0]) for d in cur.description or ()]
        cur.fetchall()  # FreeTDS has no MARS: no result may stay open
    except (pyodbc.ProgrammingError, pyodbc.DataError, pyodbc.IntegrityError, pyodbc.NotSupportedError) as e:
        raise so.statement_failed(table, prop, str(e.args[1] if len(e.args) > 1 else e)) from e
    finally:
        cur.close()
    return names

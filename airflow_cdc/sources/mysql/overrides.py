"""MySQL / MariaDB's part of ``snapshot.select.statement.overrides`` (rules in
:mod:`airflow_cdc.core.snapshot_overrides`): describe a statement on the server, build its relation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pymysql

from airflow_cdc.core import snapshot_overrides as so
from airflow_cdc.sources.mysql import sql as q
from airflow_cdc.sources.mysql.schema import TableDef


def relation(
    overrides: so.Overrides, conn: Any, table: str, tdef: TableDef, key: Sequence[str]
) -> str | None:
    """The derived table snapshot chunks of ``table`` read instead of it (None: no override).

    :raises ConfigError: the table's statement is refused (named with the table and the property).
    """
    columns = [c.name for c in tdef.columns]
    return overrides.relation(
        table,
        [table],
        columns,
        key,
        lambda statement, name, prop: describe(conn, statement, name, prop),
        lambda statement, present: q.override_relation(statement, columns, present),
    )


def describe(conn: Any, statement: str, table: str, prop: str) -> list[str]:
    """The statement's result column names, from ``LIMIT 0`` on it as chunks wrap it (MySQL returns
    the columns without reading a row), in a read-only transaction that is rolled back.

    :raises ConfigError: the server refuses it (a server error; client errors, such as a lost
        connection, propagate as they are).
    """
    with conn.cursor() as cur:
        try:
            cur.execute("START TRANSACTION READ ONLY")
            try:
                cur.execute(q.describe_statement(statement))
                names = [str(d[0]) for d in cur.description or ()]
                cur.fetchall()
            finally:
                cur.execute("ROLLBACK")
        except pymysql.err.MySQLError as e:
            code = e.args[0] if e.args and isinstance(e.args[0], int) else 0
            if not 1000 <= code < 2000:  # 2000 and up: client errors (connection lost ...)
                raise
            raise so.statement_failed(table, prop, f"({code}) {e.args[1] if len(e.args) > 1 else e}") from e
    return names

"""PostgreSQL's part of ``snapshot.select.statement.overrides`` (rules in
:mod:`airflow_cdc.core.snapshot_overrides`): describe a statement on the server, build its relation."""

from __future__ import annotations

from typing import Any

import psycopg

from airflow_cdc.core import snapshot_overrides as so
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.sources.postgres import sql as q
from airflow_cdc.sources.postgres.client import Catalog, TableMeta


def relation(overrides: so.Overrides, conn: psycopg.Connection, catalog: Catalog, meta: TableMeta) -> Any:
    """The relation snapshot chunks of the table read instead of it (None: no override).

    :raises ConfigError: the table's statement is refused (named with the table and the property).
    """
    columns = [c.name for c in meta.columns]
    return overrides.relation(
        str(meta.id),
        [str(meta.id)],
        columns,
        meta.key,
        lambda statement, table, prop: describe(conn, catalog, meta, statement, table, prop),
        lambda statement, present: q.override_relation(statement, columns, present),
    )


def describe(
    conn: psycopg.Connection, catalog: Catalog, meta: TableMeta, statement: str, table: str, prop: str
) -> list[str]:
    """The statement's result column names, planned as chunks wrap it in a read-only transaction
    (no row is read; a data-modifying statement fails there as it would in every chunk).

    :raises ConfigError: the server refuses it, or it returns a key column with another type than
        the table's (chunk bounds and the log's keys would not compare alike).
    """
    try:
        with conn.transaction():
            conn.execute("SET TRANSACTION READ ONLY")
            description = conn.execute(q.describe_statement(statement)).description or []
    except psycopg.OperationalError:
        raise
    except psycopg.Error as e:
        raise so.statement_failed(table, prop, e.diag.message_primary or str(e)) from e
    types = {d.name: d.type_code for d in description}
    for col in meta.columns:
        if col.name in meta.key and col.name in types and types[col.name] not in _oids(catalog, col.type_oid):
            raise ConfigError(
                f"property {prop!r} (snapshot of {table}): the statement returns key column "
                f"{col.name!r} with another type than the table's ({col.type_sql}); return it unchanged"
            )
    return [d.name for d in description]


def _oids(catalog: Catalog, oid: int) -> set[int]:
    """The type and, for a domain, its base types: result descriptions carry a domain's base type."""
    out, info = {oid}, catalog.type_info(oid)
    while info.base is not None:
        info = info.base
        out.add(info.oid)
    return out

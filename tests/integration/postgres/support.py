"""Helpers for PostgreSQL integration tests: pipeline configs, source reads, batch replay."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from airflow_cdc.core.pipeline import build_config
from airflow_cdc.sources.postgres import sql as q
from airflow_cdc.sources.postgres.copyread import parse_csv as _parse_csv
from airflow_cdc.sources.postgres.source import PostgresSource
from airflow_cdc.testing.servers import PG_MATRIX
from tests.support.oracle import ReferenceApplier
from tests.support.pipeline import assert_rows_equal, replay, run_capture

__all__ = [
    "assert_converged",
    "every_version",
    "pipeline",
    "replay",
    "run_capture",
    "source_multiset",
    "source_rows",
]

#: Run a test on every PostgreSQL major (its ``pg_db`` on that major's server; README: tested versions).
every_version = pytest.mark.parametrize("pg_version", sorted(PG_MATRIX), ids=lambda v: f"pg{v}")


def execute(dsn: str, *statements: str) -> list[Any]:
    """Run ``statements`` in autocommit mode on ``dsn``; returns the last one's rows."""
    rows: list[Any] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            cur = conn.execute(statement)
            rows = cur.fetchall() if cur.description else []
    return rows


def pipeline(db: Any, staging: Path, **props: Any) -> dict[str, Any]:
    """A pipeline config for the test database ``db`` (the ``pg_db`` fixture)."""
    server = db.server
    base = {"name": f"test_{db.name}", "connector": "postgresql", "database.hostname": server.host,
            "database.port": server.port, "database.user": server.superuser,
            "database.password": server.password, "database.dbname": db.name,
            "staging.path": str(staging), "slot.name": f"slot_{db.name}", "publication.name": f"pub_{db.name}"}
    base.update({k.replace("__", "."): v for k, v in props.items()})
    return base


def source_rows(config: dict[str, Any], table: str) -> dict[tuple, dict[str, Any]]:
    """The live table, encoded exactly like captured events, keyed by the table's key."""
    keys, rows = _live_rows(config, table)
    return {tuple(row[k] for k in keys): row for row in rows}


def source_multiset(config: dict[str, Any], table: str) -> list[dict[str, Any]]:
    """Every row of the live table (a table without key: duplicates included), encoded exactly
    like captured events."""
    return _live_rows(config, table)[1]


def _live_rows(config: dict[str, Any], table: str) -> tuple[list[str], list[dict[str, Any]]]:
    """The table's key columns and its rows, encoded exactly like captured events."""
    source = PostgresSource(build_config(config))
    source.open()
    try:
        state = source.table_state(table)
        tid = state.tid
        cols = [c.name for c in source.catalog.table_meta(tid, source._tables[table][1], source.filters).columns]
        buf = io.BytesIO()
        query = psycopg.sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT (FORMAT csv)").format(
            psycopg.sql.SQL(", ").join(psycopg.sql.Identifier(c) for c in cols), q.qualified(tid.schema, tid.table))
        assert source.conn is not None
        with source.conn.cursor().copy(query) as copy:
            for block in copy:
                buf.write(block)
        data = _parse_csv(buf.getvalue(), len(cols))
        arrays = [codec.convert(data.column(i)) for codec, i in zip(state.codecs, state.select, strict=True)]
        struct = pa.StructArray.from_arrays(arrays, fields=[c.field for c in state.codecs])
        return list(state.key_columns), struct.to_pylist()
    finally:
        source.close()


def assert_converged(config: dict[str, Any], tables: list[str]) -> ReferenceApplier:
    oracle = replay(config)
    for table in tables:
        expected = source_rows(config, table)
        assert_rows_equal(table, expected, oracle.rows(table))
    return oracle

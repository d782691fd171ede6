"""Helpers for MySQL/MariaDB integration tests: pipeline configs, source reads, convergence checks."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from airflow_cdc.core.pipeline import build_config, build_store
from airflow_cdc.sources.mysql.source import MySqlSource
from tests.support.oracle import ReferenceApplier
from tests.support.pipeline import assert_rows_equal, replay, run_capture

__all__ = [
    "assert_converged",
    "execute",
    "pipeline",
    "purge_binlogs",
    "replay",
    "run_capture",
    "source_multiset",
    "source_rows",
    "state",
]


def pipeline(db: Any, staging: Path, **props: Any) -> dict[str, Any]:
    """A pipeline config capturing the test database ``db`` (the ``mariadb_db`` fixture)."""
    server = db.server
    base = {
        "name": f"test_{db.name}",
        "connector": "mariadb",
        "database.hostname": server.host,
        "database.port": server.port,
        "database.user": server.superuser,
        "database.password": server.password,
        "database.include.list": db.name,
        "staging.path": str(staging),
    }
    base.update({k.replace("__", "."): v for k, v in props.items()})
    return base


def execute(db: Any, *statements: str) -> None:
    conn = db.connect(autocommit=True)
    try:
        with conn.cursor() as cur:
            for s in statements:
                cur.execute(s)
    finally:
        conn.close()


def purge_binlogs(db: Any) -> list[str]:
    """Rotate the binlog and purge every file before the new one; returns the files left."""
    server = db.server
    server.execute("FLUSH BINARY LOGS")
    head = server.execute("SHOW MASTER STATUS")[0][0]
    deadline = time.monotonic() + 30
    while (files := [r[0] for r in server.execute("SHOW BINARY LOGS")])[0] != head:
        assert time.monotonic() < deadline, "the server kept the old binlog files"
        server.execute(f"PURGE BINARY LOGS TO '{head}'")  # waits for MariaDB's binlog checkpoint
        time.sleep(0.2)
    return files


def state(config: dict[str, Any]) -> Any:
    return build_store(build_config(config)).load(config["name"])


def source_rows(config: dict[str, Any], table: str) -> dict[tuple, dict[str, Any]]:
    """The live table, encoded exactly like captured events, keyed by the table's key."""
    source = MySqlSource(build_config(config))
    source.open()
    try:
        keys = source.table_state(table).key_columns
        return {
            tuple(row[k] for k in keys): row
            for chunk in source.encoded_chunks(table, 50_000)
            for row in chunk.to_pylist()
        }
    finally:
        source.close()


def source_multiset(config: dict[str, Any], table: str) -> list[dict[str, Any]]:
    """Every row of the live table (a table without key: duplicates included), encoded exactly
    like captured events."""
    from airflow_cdc.sources.mysql import snapshot
    from airflow_cdc.sources.mysql.rows import encode_rows
    from airflow_cdc.sources.mysql.sql import qualified

    source = MySqlSource(build_config(config))
    source.open()
    try:
        tdef, state = source._tables[table], source.table_state(table)
        with source.conn.cursor() as cur:
            select = ", ".join(snapshot.select_expr(c) for c in tdef.columns)
            cur.execute(f"SELECT {select} FROM {qualified(tdef.db, tdef.table)}")
            rows = [tuple(snapshot.neutral(c, v) for c, v in zip(tdef.columns, r, strict=True)) for r in cur]
        schema = pa.schema([c.field for c in state.codecs])
        return pa.Table.from_arrays(encode_rows(state, rows), schema=schema).to_pylist() if rows else []
    finally:
        source.close()


def assert_converged(config: dict[str, Any], tables: list[str]) -> ReferenceApplier:
    """Replayed batches equal the source; columns added or dropped by DDL are compared leniently."""
    oracle = replay(config)
    for table in tables:
        assert_rows_equal(table, source_rows(config, table), oracle.rows(table), lenient_columns=True)
    return oracle

"""Helpers for MySQL/MariaDB integration tests: pipeline configs, source reads, convergence checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from airflow_cdc.core.pipeline import build_config, build_store
from airflow_cdc.sources.mysql import client, snapshot
from airflow_cdc.sources.mysql import sql as q
from airflow_cdc.sources.mysql.source import MySqlSource
from tests.support.oracle import ReferenceApplier
from tests.support.pipeline import assert_rows_equal, replay, run_capture

__all__ = ["assert_converged", "execute", "pipeline", "replay", "run_capture", "source_rows", "state"]


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


def state(config: dict[str, Any]) -> Any:
    return build_store(build_config(config)).load(config["name"])


def source_rows(config: dict[str, Any], table: str) -> dict[tuple, dict[str, Any]]:
    """The live table, encoded exactly like captured events, keyed by the table's key."""
    source = MySqlSource(build_config(config))
    source.open()
    try:
        tdef = source._tables[table]
        st = source.table_state(table)
        exprs = ", ".join(snapshot.select_expr(c) for c in tdef.columns)
        rows = client.query(source.conn, f"SELECT {exprs} FROM {q.qualified(tdef.db, tdef.table)}")
        columns = list(
            zip(
                *[[snapshot.neutral(c, v) for c, v in zip(tdef.columns, r, strict=True)] for r in rows],
                strict=True,
            )
        ) or [() for _ in tdef.columns]
        arrays = [
            codec.convert_values(list(columns[i])) for codec, i in zip(st.codecs, st.select, strict=True)
        ]
        struct = pa.StructArray.from_arrays(arrays, fields=[c.field for c in st.codecs]) if rows else None
        out = {}
        for row in struct.to_pylist() if struct is not None else []:
            out[tuple(row[k] for k in st.key_columns)] = row
        return out
    finally:
        source.close()


def assert_converged(config: dict[str, Any], tables: list[str]) -> ReferenceApplier:
    """Replayed batches equal the source; columns added or dropped by DDL are compared leniently."""
    oracle = replay(config)
    for table in tables:
        assert_rows_equal(table, source_rows(config, table), oracle.rows(table), lenient_columns=True)
    return oracle

"""``encoded_chunks`` (what ``airflow-cdc verify`` reads): the live table in key order, encoded
exactly like captured rows, without storing or writing anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.pipeline import build_store
from airflow_cdc.sources.sqlserver.source import SqlServerSource
from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator
from tests.integration.sqlserver.test_source_capture import COLUMNS, capture, make_config, orders  # noqa: F401
from tests.support.pipeline import replay


def test_encoded_chunks_equal_the_captured_rows(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str,
                                                orders: str, tmp_path: Path) -> None:  # noqa: F811
    config = make_config(sqlserver_emulator, mssql_db, tmp_path)
    while capture(config).snapshot_rows:
        pass
    table = f"{mssql_db}.dbo.orders"
    stored = build_store(config).load(config["name"])
    source = SqlServerSource(config)
    source.open()
    try:
        chunks = list(source.encoded_chunks(table, 6))
        assert source.table_state(table).key_columns == ["id"]  # what verify joins silver on
        with pytest.raises(ConfigError, match="dbo.nope is not captured"):
            list(source.encoded_chunks(f"{mssql_db}.dbo.nope", 6))
    finally:
        source.close()
    assert len(chunks) == 7 and [f.name for f in chunks[0].schema] == [c for c, _ in COLUMNS]
    assert chunks[0].schema.field("ts").metadata[b"connect.name"] == b"io.debezium.time.NanoTimestamp"
    live = [row for c in chunks for row in c.to_pylist()]
    assert [r["id"] for r in live] == list(range(40))  # key order
    assert {(r["id"],): r for r in live} == replay(config).rows(table)
    assert build_store(config).load(config["name"]).version == stored.version  # nothing stored

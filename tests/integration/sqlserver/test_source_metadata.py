"""Transaction metadata (``provide.transaction.metadata``) and schema change events on a
capture-instance switch (``include.schema.changes``), as the seed describes them for SQL Server."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator
from tests.integration.sqlserver.test_source_capture import capture, make_config


def _events(staging: Path, name: str) -> list[tuple[str, dict]]:
    out = []
    for batch in list_batches(str(staging), name):
        for table in batch.tables():
            for part in batch.parts(table):
                out += [(table, row) for row in pq.read_table(part).to_pylist() if row["op"] != "r"]
    return out


@pytest.mark.parametrize("provide", [True, False])
def test_transaction_blocks_number_events_per_transaction_and_table(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Path, provide: bool) -> None:
    emu = sqlserver_emulator
    for t in ("dbo.a", "dbo.b"):
        emu.create_table(mssql_db, t, [("id", "int"), ("v", "nvarchar(10)")], primary_key=["id"])
        emu.enable_table(mssql_db, t)
    config = make_config(emu, mssql_db, tmp_path, **{"snapshot.mode": "no_data",
                                                      "provide.transaction.metadata": provide})
    capture(config)
    with emu.pg_connect(mssql_db) as pg:  # one transaction: a, b, a, a(update), b(delete)
        pg.execute("INSERT INTO dbo.a VALUES (1, 'x')")
        pg.execute("INSERT INTO dbo.b VALUES (1, 'y')")
        pg.execute("INSERT INTO dbo.a VALUES (2, 'x')")
        pg.execute("UPDATE dbo.a SET v = 'z' WHERE id = 1")
        pg.execute("DELETE FROM dbo.b WHERE id = 1")
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.b VALUES (7, 'second')")
    emu.run_capture_job(mssql_db)
    capture(config)
    events = sorted(_events(tmp_path, config["name"]), key=lambda e: e[1]["__position"])
    assert [(t.rsplit(".", 1)[-1], e["op"]) for t, e in events] == [
        ("a", "c"), ("b", "c"), ("a", "c"), ("a", "u"), ("b", "d"), ("b", "c")]
    blocks = [e["transaction"] for _, e in events]
    if not provide:
        assert blocks == [None] * 6
        return
    first, second = events[0][1]["source"]["commit_lsn"], events[5][1]["source"]["commit_lsn"]
    assert first != second and len(first) == 22 and first.count(":") == 2  # LSN text, Debezium-printed
    assert blocks == [
        {"id": first, "total_order": 1, "data_collection_order": 1},
        {"id": first, "total_order": 2, "data_collection_order": 1},
        {"id": first, "total_order": 3, "data_collection_order": 2},
        {"id": first, "total_order": 4, "data_collection_order": 3},
        {"id": first, "total_order": 5, "data_collection_order": 2},
        {"id": second, "total_order": 1, "data_collection_order": 1},
    ]


@pytest.mark.parametrize("include", [True, False])
def test_capture_instance_switch_is_a_schema_change_event(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Path, include: bool) -> None:
    emu = sqlserver_emulator
    emu.create_table(mssql_db, "dbo.s", [("id", "int"), ("v", "nvarchar(10)")], primary_key=["id"])
    emu.enable_table(mssql_db, "dbo.s")
    config = make_config(emu, mssql_db, tmp_path, **{"snapshot.mode": "no_data",
                                                      "include.schema.changes": include})
    capture(config)
    emu.add_column(mssql_db, "dbo.s", "price", "decimal(9,3)")
    emu.enable_table(mssql_db, "dbo.s", capture_instance="dbo_s_v2")
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.s VALUES (1, 'a', 1.5)")
    emu.run_capture_job(mssql_db)
    capture(config)
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.s VALUES (2, 'b', 2.5)")
    emu.run_capture_job(mssql_db)
    capture(config)
    changes = [c for b in list_batches(str(tmp_path), config["name"]) for c in b.manifest.get("schema_changes", [])]
    if not include:
        assert changes == []
        return
    assert len(changes) == 1, "one event per switch, not repeated by later windows"
    event = changes[0]
    with emu.pg_connect(mssql_db) as pg:
        start = pg.execute("SELECT start_lsn FROM cdc.change_tables WHERE capture_instance = 'dbo_s_v2'").fetchone()
    assert start is not None
    raw = bytes(start[0]).hex()  # Debezium prints LSNs in lower-case hex
    assert event["source"]["commit_lsn"] == f"{raw[:8]}:{raw[8:16]}:{raw[16:]}"
    assert (event["source"]["connector"], event["source"]["db"], event["source"]["table"]) == (
        "sqlserver", mssql_db, "s")
    assert (event["databaseName"], event["schemaName"], event["ddl"]) == (mssql_db, "dbo", None)
    (change,) = event["tableChanges"]
    assert change["type"] == "ALTER" and change["id"] == f'"{mssql_db}"."dbo"."s"'
    assert change["table"]["primaryKeyColumnNames"] == ["id"]
    columns = [(c["name"], c["typeName"], c["jdbcType"], c["length"], c["scale"], c["position"], c["optional"])
               for c in change["table"]["columns"]]
    assert columns == [("id", "int", 4, 10, None, 1, False), ("v", "nvarchar", -9, 10, None, 2, True),
                       ("price", "decimal", 3, 9, 3, 3, True)]

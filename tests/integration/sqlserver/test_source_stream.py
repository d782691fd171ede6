"""The SQL Server source's client, capture-instance discovery and window reader against the emulator."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from airflow_cdc.core.errors import AuthenticationFailed, ConfigError, ConnectionFailed
from airflow_cdc.sources.sqlserver import client, sql
from airflow_cdc.sources.sqlserver.config import sqlserver_config
from airflow_cdc.sources.sqlserver.offsets import SqlServerLsn
from airflow_cdc.sources.sqlserver.schema import load_capture_instances, window_segments
from airflow_cdc.sources.sqlserver.stream import read_window
from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator


def config_for(emu: SqlServerCdcEmulator, db: str, **extra: Any) -> Any:
    return sqlserver_config({
        "name": "mssql", "staging.path": "/tmp/unused", "database.hostname": emu.host,
        "database.port": emu.port, "database.user": emu.user, "database.password": emu.password,
        "database.names": db, "database.encrypt": False, **extra,
    })


def test_connect_with_debezium_properties(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str) -> None:
    conn = client.connect(config_for(sqlserver_emulator, mssql_db), mssql_db)
    assert conn.cursor().execute("SELECT DB_NAME()").fetchone()[0] == mssql_db
    conn.close()


def test_connect_errors_are_classified(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str) -> None:
    emu = sqlserver_emulator
    with pytest.raises(AuthenticationFailed, match="rejected the login of 'sa'") as err:
        client.connect(config_for(emu, mssql_db, **{"database.password": "nope"}), mssql_db)
    assert "nope" not in str(err.value)
    with pytest.raises(ConfigError, match="'missing_db' of database.names cannot be opened"):
        client.connect(config_for(emu, mssql_db), "missing_db")
    with pytest.raises(ConnectionFailed, match="cannot connect to SQL Server"):  # TLS asked, none offered
        client.connect(config_for(emu, mssql_db, **{"database.encrypt": True}), mssql_db)


def test_connection_string_per_driver(sqlserver_emulator: SqlServerCdcEmulator) -> None:
    cfg = config_for(sqlserver_emulator, "db", **{"database.password": "p;w}d", "database.applicationIntent": "ReadOnly"})
    text = client.connection_string(cfg, "db")
    assert "DRIVER={FreeTDS}" in text and "Encryption=off" in text and "PWD={p;w}}d}" in text
    assert "ApplicationIntent=ReadOnly" in text
    ms = config_for(sqlserver_emulator, "db", **{"database.odbc.driver": "ODBC Driver 18 for SQL Server",
                                                  "database.encrypt": True, "database.trustServerCertificate": True})
    text = client.connection_string(ms, None)
    assert "Encrypt=yes" in text and "TrustServerCertificate=yes" in text and f"tcp:127.0.0.1,{sqlserver_emulator.port}" in text


def test_exact_time_values_through_the_client(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str) -> None:
    emu = sqlserver_emulator
    emu.create_table(mssql_db, "dbo.clock", [("id", "int"), ("d2", "datetime2(7)"), ("t7", "time(7)"),
                                             ("dto", "datetimeoffset(7)"), ("dt", "datetime"),
                                             ("sdt", "smalldatetime")], primary_key=["id"])
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.clock VALUES (1, '1969-12-31 23:59:59.9999999', '23:59:59.9999999',"
                   " '2024-06-01 10:00:00.1234567 -05:30', '2024-02-29 12:34:56.997', '2024-02-29 12:35:00')")
    conn = client.connect(config_for(emu, mssql_db), mssql_db)
    row = conn.cursor().execute("SELECT [d2], [t7], [dto], [dt], [sdt] FROM [dbo].[clock]").fetchone()
    assert row[0] == -100  # 100 ns before the epoch
    assert row[1] == 86_399_999_999_900
    assert row[2] == (dt.datetime(2024, 6, 1, 10, 0, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=-5, minutes=-30))), 700)
    assert row[3] == int(dt.datetime(2024, 2, 29, 12, 34, 56, 997000, tzinfo=dt.UTC).timestamp() * 10**6) * 1000
    assert row[4] == int(dt.datetime(2024, 2, 29, 12, 35, tzinfo=dt.UTC).timestamp()) * 10**9


def test_window_merges_tables_pairs_updates_and_switches_capture_instance(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str) -> None:
    emu = sqlserver_emulator
    emu.create_table(mssql_db, "dbo.a", [("id", "int"), ("v", "nvarchar(10)")], primary_key=["id"])
    emu.create_table(mssql_db, "sales.b", [("k1", "int"), ("k2", "varchar(5)"), ("amount", "decimal(9,2)")],
                     primary_key=["k1", "k2"])
    emu.enable_table(mssql_db, "dbo.a")
    emu.enable_table(mssql_db, "sales.b")
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.a VALUES (1, 'x')")
        pg.execute("INSERT INTO sales.b VALUES (1, 'k', 1.00)")
        pg.commit()
        pg.execute("UPDATE sales.b SET amount = 2.50")
        pg.execute("UPDATE dbo.a SET v = 'y'")
        pg.commit()
    emu.run_capture_job(mssql_db)
    emu.add_column(mssql_db, "dbo.a", "extra", "int")
    emu.enable_table(mssql_db, "dbo.a", capture_instance="dbo_a_v2")
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("UPDATE dbo.a SET extra = 5")
        pg.execute("DELETE FROM sales.b")
        pg.commit()
    emu.run_capture_job(mssql_db)

    conn = client.connect(config_for(emu, mssql_db), mssql_db)
    instances = load_capture_instances(conn, mssql_db)
    assert [(c.schema, c.table, c.name, [col.name for col in c.columns], c.key) for c in instances] == [
        ("dbo", "a", "dbo_a", ["id", "v"], ["id"]), ("sales", "b", "sales_b", ["k1", "k2", "amount"], ["k1", "k2"]),
        ("dbo", "a", "dbo_a_v2", ["id", "v", "extra"], ["id"])]
    assert instances[1].columns[2].type_name == "decimal" and instances[1].columns[2].precision == 9
    high = SqlServerLsn.of(client.scalar(conn, sql.MAX_LSN))
    low = min(SqlServerLsn.of(client.scalar(conn, sql.MIN_LSN, c.name)) for c in instances)
    txns = list(read_window(conn, window_segments(instances, low, high)))
    shape = [[(e.op, e.instance.name, e.before, e.after, e.event_serial_no) for e in t] for t in txns]
    assert shape == [
        [("c", "dbo_a", None, (1, "x"), 1), ("c", "sales_b", None, (1, "k", Decimal("1.00")), 1)],
        [("u", "sales_b", (1, "k", Decimal("1.00")), (1, "k", Decimal("2.50")), 2),
         ("u", "dbo_a", (1, "x"), (1, "y"), 2)],
        [("u", "dbo_a_v2", (1, "y", None), (1, "y", 5), 2), ("d", "sales_b", (1, "k", Decimal("2.50")), None, 1)],
    ]
    flat = [e for t in txns for e in t]
    assert [(e.commit_lsn, e.change_lsn) for e in flat] == sorted((e.commit_lsn, e.change_lsn) for e in flat)
    assert all(len({e.commit_lsn for e in t}) == 1 for t in txns)
    assert str(flat[0].commit_lsn).count(":") == 2
    assert flat[2].update_mask == b"\x04"  # amount is captured ordinal 3
    # a window that starts after the first transaction sees only the later ones
    later = list(read_window(conn, window_segments(instances, flat[1].commit_lsn.increment(), high)))
    assert [len(t) for t in later] == [2, 2] and later[0][0].commit_lsn == txns[1][0].commit_lsn
    conn.close()

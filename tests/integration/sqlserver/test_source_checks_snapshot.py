"""Start-up checks and snapshot chunks of the SQL Server source against the emulator."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pytest

from airflow_cdc.core.errors import ConfigError, MissingPrivilege, OffsetUnavailable, ServerMisconfigured
from airflow_cdc.sources.sqlserver import checks, client
from airflow_cdc.sources.sqlserver.offsets import SqlServerLsn
from airflow_cdc.sources.sqlserver.schema import Column, load_capture_instances
from airflow_cdc.sources.sqlserver.snapshot import read_chunk
from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator
from airflow_cdc.testing.sqlserver_emulator.types import SqlType
from tests.integration.sqlserver.test_source_stream import config_for


@pytest.fixture
def conn(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str) -> Any:
    c = client.connect(config_for(sqlserver_emulator, mssql_db), mssql_db)
    yield c
    c.close()


def test_database_and_agent_checks(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, conn: Any) -> None:
    checks.check_database(conn, mssql_db)
    checks.check_agent(conn)
    with sqlserver_emulator.pg_connect(mssql_db) as pg:
        pg.execute("UPDATE sys.databases SET is_cdc_enabled = 0")
    with pytest.raises(ServerMisconfigured, match=f"not enabled on database '{mssql_db}'.*sp_cdc_enable_db"):
        checks.check_database(conn, mssql_db)
    with sqlserver_emulator.pg_connect(mssql_db) as pg:
        pg.execute("DELETE FROM sys.databases")
    with pytest.raises(ConfigError, match="does not exist"):
        checks.check_database(conn, mssql_db)
    sqlserver_emulator.set_agent_running(False)
    with pytest.raises(ServerMisconfigured, match="SQL Server Agent is not running"):
        checks.check_agent(conn)


def test_permission_and_purged_offset_checks(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str,
                                             conn: Any) -> None:
    emu = sqlserver_emulator
    emu.create_table(mssql_db, "dbo.t", [("id", "int")], primary_key=["id"])
    emu.enable_table(mssql_db, "dbo.t")
    for i in range(3):
        with emu.pg_connect(mssql_db) as pg:
            pg.execute("INSERT INTO dbo.t VALUES (%s)", (i,))
    emu.run_capture_job(mssql_db)
    instances = load_capture_instances(conn, mssql_db)
    checks.check_permissions(conn, mssql_db, instances)
    first = SqlServerLsn.of(client.scalar(conn, "SELECT MIN(start_lsn) FROM cdc.lsn_time_mapping"))
    assert checks.check_offset(conn, mssql_db, instances, first, {"dbo_t"}) == []
    emu.run_cleanup(mssql_db)  # purge everything below the max LSN
    problems = checks.check_offset(conn, mssql_db, instances, first, {"dbo_t"})
    assert len(problems) == 1 and "cleanup job purged" in problems[0] and str(first) in problems[0]
    assert checks.check_offset(conn, mssql_db, instances, first, set()) == []  # an instance new since then
    with pytest.raises(OffsetUnavailable, match="purged"):
        checks.raise_purged(problems, when_needed=False)
    assert checks.raise_purged(problems, when_needed=True) is True
    emu.deny_select(mssql_db, "cdc.dbo_t_CT")
    with pytest.raises(MissingPrivilege, match=f"{mssql_db}.cdc.dbo_t_CT \\(table {mssql_db}.dbo.t\\)"):
        checks.check_permissions(conn, mssql_db, instances)


KEY_SHAPES = [
    ([("id", "int")], lambda i: (i,)),
    ([("a", "bigint"), ("b", "nvarchar(20)")], lambda i: (i % 3, f"k{i:04d}é")),
    ([("d", "datetime2(7)")], lambda i: (f"2024-01-01 00:00:00.{i:07d}",)),
    ([("day", "date"), ("n", "decimal(12,3)")], lambda i: (dt.date(1, 1, 1) + dt.timedelta(days=i % 4), Decimal(i) / 8)),
    ([("t", "time(7)"), ("b", "varbinary(8)")], lambda i: (f"00:00:{i % 60:02d}.000000{i % 7}", bytes([i % 5, i]))),
    ([("g", "uniqueidentifier")], lambda i: (uuid.UUID(int=i * 7919),)),
]


@pytest.mark.parametrize("shape", range(len(KEY_SHAPES)))
def test_chunks_cover_the_table_once_in_key_order(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, conn: Any, shape: int) -> None:
    isolation = ["snapshot", "repeatable_read", "read_committed"][shape % 3]  # each mode, several key shapes
    keys, make = KEY_SHAPES[shape]
    emu = sqlserver_emulator
    emu.create_table(mssql_db, "dbo.k", [*keys, ("v", "int")], primary_key=[k for k, _ in keys])
    with emu.pg_connect(mssql_db) as pg:
        with pg.cursor() as cur:
            cur.executemany(f"INSERT INTO dbo.k VALUES ({', '.join(['%s'] * (len(keys) + 1))})",
                            [(*make(i), i) for i in range(57)])
    columns = [Column(n, i, SqlType.parse(t).name, 0, SqlType.parse(t).precision, SqlType.parse(t).scale, False)
               for i, (n, t) in enumerate([*keys, ("v", "int")], start=1)]
    key = [k for k, _ in keys]
    seen: list[tuple] = []
    after = None
    while True:
        chunk = read_chunk(conn, isolation, (mssql_db, "dbo", "k"), columns, key, after, 10)
        seen += chunk.rows
        assert chunk.low <= chunk.high
        if chunk.last:
            break
        after = chunk.last_key[: len(key)]
    assert sorted(r[-1] for r in seen) == list(range(57))  # every row exactly once
    full = [tuple(r) for r in conn.cursor().execute(
        f"SELECT {', '.join(f'[{c.name}]' for c in columns)} FROM [dbo].[k] ORDER BY {', '.join(f'[{k}]' for k in key)}"
    ).fetchall()]
    assert seen == full  # in the server's key order

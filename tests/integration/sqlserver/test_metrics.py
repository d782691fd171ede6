"""Issue 38 on SQL Server (the CDC emulator): the connector metrics after known work, the LSN
range the change tables keep, and the guard on the position's age and on a cleanup past it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from airflow_cdc.core.capture import Capture
from airflow_cdc.core.health import source_check
from airflow_cdc.core.pipeline import build_store
from airflow_cdc.sources.sqlserver.source import SqlServerSource
from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator
from tests.integration.sqlserver.test_source_capture import make_config


def _capture(config: Any) -> Any:
    return Capture(SqlServerSource(config), config, build_store(config)).run(commit=True)


def _state(config: Any) -> dict[str, Any]:
    stored = build_store(config).load(config.state_name)
    assert stored is not None
    return dict(stored.data)


def test_metrics_after_known_work_and_the_cdc_retention_guard(
    sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Path
) -> None:
    emu = sqlserver_emulator
    emu.create_table(mssql_db, "dbo.t", [("id", "int"), ("v", "nvarchar(10)")], primary_key=["id"])
    emu.enable_table(mssql_db, "dbo.t")
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.t SELECT g, 'x' FROM generate_series(1, 12) g")
    emu.run_capture_job(mssql_db)
    config = make_config(
        emu,
        mssql_db,
        tmp_path,
        **{
            "incremental.snapshot.chunk.size": 4,
            "snapshot.max.rows.per.run": 8,
            "retained.log.max.age.ms": 600_000,
        },
    )

    table = f"{mssql_db}.dbo.t"  # a SQL Server table is named with its database
    snap = _capture(config).metrics.to_json()["snapshot"]  # part-way: two chunks
    assert (snap["TotalTableCount"], snap["RemainingTableCount"], snap["SnapshotRunning"]) == (1, 1, 1)
    assert snap["tables"][table]["RowsScanned"] == 8 and (snap["ChunkFrom"], snap["ChunkTo"]) == ("4", "8")
    done = _capture(config).metrics.to_json()["snapshot"]
    assert (done["RemainingTableCount"], done["SnapshotCompleted"], done["tables"][table]["RowsScanned"]) == (
        0, 1, 12,
    )  # fmt: skip

    with emu.pg_connect(mssql_db) as pg:  # 4 events in 3 transactions
        pg.execute("INSERT INTO dbo.t VALUES (20, 'n'), (21, 'n')")
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("UPDATE dbo.t SET v = 'u' WHERE id = 1")
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("DELETE FROM dbo.t WHERE id = 2")
    emu.run_capture_job(mssql_db)
    s = _capture(config).metrics.to_json()["streaming"]
    assert (s["TotalNumberOfEventsSeen"], s["NumberOfCommittedTransactions"]) == (4, 3)
    counts = (
        s["TotalNumberOfCreateEventsSeen"],
        s["TotalNumberOfUpdateEventsSeen"],
        s["TotalNumberOfDeleteEventsSeen"],
    )
    assert counts == (2, 1, 1) and s["tables"][table]["TotalNumberOfEventsSeen"] == 4
    assert 0 <= s["MilliSecondsBehindSource"] < 60_000 and s["Connected"] == 1

    rec, verdict = source_check(config, _state(config))
    assert "change tables of" in rec.get("source", "RetainedLogDetail")
    assert rec.get("source", "RetainedLogLimitAgeMs") == 600_000  # no msdb in the emulator: the explicit one
    assert not verdict.tripped
    age = rec.get("source", "PositionAgeMs")
    time.sleep(0.2)  # an idle pipeline: the committed position ages
    tight = make_config(emu, mssql_db, tmp_path, **{"retained.log.max.age.ms": age + 100})
    rec, verdict = source_check(tight, _state(config))
    assert verdict.tripped and "the committed position is" in verdict.message
    assert f"retained.log.max.age.ms={age + 100}" in verdict.message

    with emu.pg_connect(mssql_db) as pg:  # a change the connector has not read, then a cleanup past it
        pg.execute("INSERT INTO dbo.t VALUES (30, 'lost')")
    emu.run_capture_job(mssql_db)
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.t VALUES (31, 'later')")
    emu.run_capture_job(mssql_db)
    emu.run_cleanup(mssql_db)
    _rec, verdict = source_check(config, _state(config))
    assert verdict.tripped and "dropped the log the committed offset needs" in verdict.message
    assert "cleaned up past the committed LSN: dbo_t" in verdict.message

"""A key change committed while a snapshot chunk is read: the chunk's row under the old key is
stale and must be dropped (the window's update carries both keys), or the old key comes back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.sources.sqlserver import snapshot
from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator
from tests.integration.sqlserver.test_source_capture import capture, make_config
from tests.support.pipeline import assert_rows_equal, replay


@pytest.mark.parametrize("change", ["UPDATE dbo.k SET id = id + 100 WHERE id = 3",
                                    "UPDATE dbo.k SET id = 1000, v = 'moved' WHERE id = 5"])
def test_key_change_between_watermarks_drops_the_old_key(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    emu = sqlserver_emulator
    emu.create_table(mssql_db, "dbo.k", [("id", "int"), ("v", "nvarchar(20)")], primary_key=["id"])
    emu.enable_table(mssql_db, "dbo.k")
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.k SELECT g, 'v' || g FROM generate_series(1, 8) g")
    emu.run_capture_job(mssql_db)
    calls: list[int] = []
    real_scalar = snapshot.scalar

    def scalar(conn: Any, query: str, *params: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:  # the high watermark: the chunk is read, the change commits now
            with emu.pg_connect(mssql_db) as pg:
                pg.execute(change)
            emu.run_capture_job(mssql_db)
        return real_scalar(conn, query, *params)

    monkeypatch.setattr(snapshot, "scalar", scalar)
    config = make_config(emu, mssql_db, tmp_path, **{"incremental.snapshot.chunk.size": 20})
    capture(config)
    monkeypatch.undo()
    capture(config)
    with emu.pg_connect(mssql_db) as pg:
        expected = {(i,): {"id": i, "v": v} for i, v in pg.execute("SELECT id, v FROM dbo.k").fetchall()}
    got = replay({"staging.path": str(tmp_path), "name": config["name"]}).rows(f"{mssql_db}.dbo.k")
    assert_rows_equal("dbo.k", expected, got)

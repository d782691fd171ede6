"""Benchmark: capture of a SQL Server CDC window (inserts + updates) into staged Parquet through
pyodbc + FreeTDS from the SQL Server CDC *emulator*, against a bare pyodbc fetch of the same
change-table rows, both measured in this run.

Measured: ``Capture(SqlServerSource).run(commit=False)`` (the offset does not move, so every repeat
reads the same window).  Baseline: one ``cdc.fn_cdc_get_all_changes_<ci>`` query over the same LSN
range with ``fetchall()`` -- the TDS transfer and pyodbc row building without any conversion.
Both go through the emulator's TDS server, so the ratio isolates the source's own cost.

Last line: ``sqlserver_capture: <rows/s> change rows/s; ratio <x> vs bare pyodbc fetch``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import REPEATS, clear_batches, fmt, log, median, timed  # noqa: E402

INSERTS, UPDATES = 60_000, 20_000
COLUMNS = [("id", "bigint"), ("qty", "int"), ("price", "decimal(12,2)"), ("label", "nvarchar(64)"),
           ("created", "datetime2(6)"), ("active", "bit")]


def main() -> None:
    import pyodbc

    from airflow_cdc.core.capture import Capture
    from airflow_cdc.core.pipeline import build_store
    from airflow_cdc.sources.sqlserver import sql
    from airflow_cdc.sources.sqlserver.config import sqlserver_config
    from airflow_cdc.sources.sqlserver.offsets import SqlServerLsn
    from airflow_cdc.sources.sqlserver.source import SqlServerSource
    from airflow_cdc.testing.servers import PostgresServer
    from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator

    pg = PostgresServer().start()
    emu = SqlServerCdcEmulator(pg).start()
    try:
        emu.create_database("bench")
        emu.create_table("bench", "dbo.orders", COLUMNS, primary_key=["id"])
        emu.enable_table("bench", "dbo.orders")
        with emu.pg_connect("bench") as conn:
            conn.execute(
                "INSERT INTO dbo.orders SELECT s, s %% 1000, (s %% 100000) / 100.0, 'customer-' || lpad(s::text, 10, '0'),"
                " timestamp '2024-01-01' + s * interval '1 second', s %% 3 = 0 FROM generate_series(1, %s) s",
                (INSERTS,))
            conn.commit()
            conn.execute("UPDATE dbo.orders SET qty = qty + 1 WHERE id <= %s", (UPDATES,))
        log("running the emulated capture job")
        emu.run_capture_job("bench")
        odbc = pyodbc.connect(emu.odbc_connection_string("bench"), autocommit=True)
        cur = odbc.cursor()
        low = cur.execute(sql.MIN_LSN, "dbo_orders").fetchall()[0][0]
        high = cur.execute(sql.MAX_LSN).fetchall()[0][0]
        query = sql.all_changes("bench", "dbo_orders", [c for c, _ in COLUMNS])
        bare = []
        for _ in range(REPEATS):
            seconds, rows = timed(lambda: cur.execute(query, low, high).fetchall())
            bare.append(len(rows) / seconds)
        change_rows = len(rows)
        staging = Path(tempfile.mkdtemp(prefix="bench-sqlserver-"))
        config = sqlserver_config({
            "name": "bench", "staging.path": str(staging), "database.hostname": emu.host,
            "database.port": emu.port, "database.user": emu.user, "database.password": emu.password,
            "database.names": "bench", "database.encrypt": False, "snapshot.mode": "no_data",
        })
        capture = Capture(SqlServerSource(config), config, build_store(config))
        capture.run(commit=True)  # stores the offset before the window
        # rewind: store an offset just below the instance's first LSN so each repeat reads the whole window
        store = build_store(config)
        state = store.load("bench")
        ours = []
        for _ in range(REPEATS):
            clear_batches(staging)
            data = dict(state.data)
            data["offset"] = dict(data["offset"], commit_lsn=str(SqlServerLsn.from_int(int.from_bytes(low, "big") - 1)))
            store.compare_and_set("bench", store.load("bench").version, data)
            seconds, result = timed(lambda: capture.run(commit=False))
            assert result.events == INSERTS + UPDATES, result.events
            ours.append(change_rows / seconds)
        log(f"bare pyodbc fetch: {fmt(bare)} change rows/s; capture: {fmt(ours)} change rows/s")
        print(f"sqlserver_capture: {median(ours):,.0f} change rows/s; ratio {median(ours) / median(bare):.2f} "
              f"vs bare pyodbc fetch ({change_rows:,} change rows, {INSERTS + UPDATES:,} events)")
    finally:
        emu.stop()
        pg.stop()


if __name__ == "__main__":
    main()

"""The SQL Server source end to end through the capture core: chunked snapshot while writers and
the capture job run, windows of whole transactions, replay == source; offsets; purged LSNs."""

from __future__ import annotations

import datetime as dt
import random
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.core.capture import Capture
from airflow_cdc.core.errors import OffsetUnavailable
from airflow_cdc.core.pipeline import build_store
from airflow_cdc.sources.sqlserver.config import sqlserver_config
from airflow_cdc.sources.sqlserver.source import SqlServerSource
from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator
from tests.support.pipeline import replay

COLUMNS = [("id", "int"), ("item", "nvarchar(40)"), ("price", "decimal(10,2)"), ("ts", "datetime2(7)")]


def make_config(emu: SqlServerCdcEmulator, db: str, staging: Path, **extra: Any) -> Any:
    return sqlserver_config({
        "name": f"mssql_{db}", "connector": "sqlserver", "staging.path": str(staging),
        "database.hostname": emu.host, "database.port": emu.port, "database.user": emu.user,
        "database.password": emu.password, "database.names": db, "database.encrypt": False,
        "incremental.snapshot.chunk.size": 7, "snapshot.isolation.mode": "snapshot", **extra,
    })


def capture(config: Any) -> Any:
    return Capture(SqlServerSource(config), config, build_store(config)).run(commit=True)


def expected_rows(emu: SqlServerCdcEmulator, db: str) -> dict[tuple, dict[str, Any]]:
    with emu.pg_connect(db) as pg:
        rows = pg.execute("SELECT id, item, price, ts FROM dbo.orders").fetchall()
    out = {}
    for id_, item, price, ts in rows:
        moment = dt.datetime.fromisoformat(ts[:19])
        nanos = int((moment - dt.datetime(1970, 1, 1)).total_seconds()) * 10**9 + int(ts[20:27]) * 100
        out[(id_,)] = {"id": id_, "item": item, "price": price, "ts": nanos}
    return out


def ts_text(i: int) -> str:
    return f"2024-01-{1 + i % 28:02d} 12:00:00.{i * 7919 % 10**7:07d}"


@pytest.fixture
def orders(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str) -> str:
    emu = sqlserver_emulator
    emu.create_table(mssql_db, "dbo.orders", COLUMNS, primary_key=["id"])
    emu.enable_table(mssql_db, "dbo.orders")
    with emu.pg_connect(mssql_db) as pg:
        with pg.cursor() as cur:
            cur.executemany("INSERT INTO dbo.orders VALUES (%s, %s, %s, %s)",
                            [(i, f"item {i}", Decimal(i) / 4, ts_text(i)) for i in range(40)])
    emu.run_capture_job(mssql_db)
    return "dbo_orders"


def test_snapshot_and_stream_converge_with_concurrent_writers(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, orders: str, tmp_path: Path) -> None:
    emu = sqlserver_emulator
    config = make_config(emu, mssql_db, tmp_path, **{"snapshot.max.rows.per.run": 10})
    stop = threading.Event()
    errors: list[BaseException] = []

    def write(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with emu.pg_connect(mssql_db) as pg:
                while not stop.is_set():
                    key = rng.randrange(60)
                    action = rng.random()
                    if action < 0.4:
                        pg.execute("INSERT INTO dbo.orders VALUES (%s, 'new', 1, %s) ON CONFLICT (id) DO UPDATE"
                                   " SET item = 'upserted'", (key, ts_text(key + 1)))
                    elif action < 0.8:
                        pg.execute("UPDATE dbo.orders SET price = price + 1, ts = %s WHERE id = %s",
                                   (ts_text(rng.randrange(1000)), key))
                    else:
                        pg.execute("DELETE FROM dbo.orders WHERE id = %s", (key,))
                    pg.commit()
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    def capture_job() -> None:
        while not stop.is_set():
            emu.run_capture_job(mssql_db)

    threads = [threading.Thread(target=write, args=(s,)) for s in range(2)] + [threading.Thread(target=capture_job)]
    for t in threads:
        t.start()
    results = []
    try:
        for _ in range(8):
            results.append(capture(config))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors
    emu.run_capture_job(mssql_db)
    for _ in range(10):
        result = capture(config)
        results.append(result)
        if result.events == 0 and result.snapshot_rows == 0:
            break
    assert sum(r.snapshot_rows for r in results) > 10  # chunked over several runs (touched keys drop out)
    assert sum(r.events for r in results) > 50  # and changes streamed meanwhile
    assert any("snapshot of" in n and "complete" in n for r in results for n in r.notes)
    table = f"{mssql_db}.dbo.orders"
    got = replay({"staging.path": str(tmp_path), "name": config["name"]}).rows(table)
    got = {k: v for k, v in got.items() if v is not None}
    assert got == expected_rows(emu, mssql_db)


def test_offsets_are_debezium_shaped_and_windows_are_whole_transactions(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, orders: str, tmp_path: Path) -> None:
    emu = sqlserver_emulator
    config = make_config(emu, mssql_db, tmp_path, **{"snapshot.mode": "no_data", "run.max.events": 3})
    first = capture(config)
    assert first.events == 0 and first.snapshot_rows == 0
    offset = first.to_offset
    assert set(offset) >= {"commit_lsn", "change_lsn", "event_serial_no", "databases", "capture_instances"}
    assert offset["commit_lsn"].count(":") == 2 and offset["capture_instances"] == [orders]
    with emu.pg_connect(mssql_db) as pg:
        for i in range(2):  # two transactions of two changes each
            pg.execute("UPDATE dbo.orders SET item = 'a' WHERE id = %s", (i,))
            pg.execute("UPDATE dbo.orders SET item = 'b' WHERE id = %s", (i + 10,))
            pg.commit()
    emu.run_capture_job(mssql_db)
    second = capture(config)
    assert second.events == 4  # max 3 events, but a window never splits a transaction
    assert second.to_offset["commit_lsn"] > offset["commit_lsn"]
    assert capture(config).events == 0


def test_purged_offset_fails_unless_when_needed(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, orders: str, tmp_path: Path) -> None:
    emu = sqlserver_emulator
    config = make_config(emu, mssql_db, tmp_path, **{"snapshot.mode": "no_data"})
    capture(config)
    for i in range(2):
        with emu.pg_connect(mssql_db) as pg:
            pg.execute("UPDATE dbo.orders SET item = 'x' WHERE id = %s", (i,))
        emu.run_capture_job(mssql_db)
    emu.run_cleanup(mssql_db)  # purges the first of the two transactions, not yet captured
    with pytest.raises(OffsetUnavailable, match="cleanup job purged"):
        capture(config)
    rescue = make_config(emu, mssql_db, tmp_path, **{"snapshot.mode": "when_needed"})
    result = capture(rescue)
    assert result.snapshot_rows == 40  # re-snapshotted from the head
    assert any("snapshot of" in n for n in result.notes), result.notes


def test_change_between_chunk_read_and_window_wins_over_the_chunk_row(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, orders: str, tmp_path: Path) -> None:
    """A transaction committed and captured after a chunk was read (so after its low watermark)
    must not be hidden by that chunk's older row image: the tracker drops the key from the chunk."""
    emu = sqlserver_emulator
    config = make_config(emu, mssql_db, tmp_path, **{"incremental.snapshot.chunk.size": 100})

    class Interleaved(SqlServerSource):
        def read_chunks(self, *args: Any) -> Any:
            chunks = super().read_chunks(*args)
            with emu.pg_connect(mssql_db) as pg:
                pg.execute("UPDATE dbo.orders SET item = 'after the chunk' WHERE id = 3")
                pg.execute("DELETE FROM dbo.orders WHERE id = 4")
            emu.run_capture_job(mssql_db)
            return chunks

    result = Capture(Interleaved(config), config, build_store(config)).run(commit=True)
    assert result.snapshot_rows == 38 and result.events == 2
    got = replay({"staging.path": str(tmp_path), "name": config["name"]}).rows(f"{mssql_db}.dbo.orders")
    assert got[(3,)]["item"] == "after the chunk"
    assert got.get((4,)) is None
    assert {k: v for k, v in got.items() if v is not None} == expected_rows(emu, mssql_db)


def test_table_moves_to_its_second_capture_instance(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, orders: str, tmp_path: Path) -> None:
    emu = sqlserver_emulator
    config = make_config(emu, mssql_db, tmp_path, **{"snapshot.mode": "no_data"})
    capture(config)
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("UPDATE dbo.orders SET item = 'old instance' WHERE id = 1")
    emu.run_capture_job(mssql_db)
    emu.add_column(mssql_db, "dbo.orders", "note", "nvarchar(20)")
    emu.enable_table(mssql_db, "dbo.orders", capture_instance="dbo_orders_v2")
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("UPDATE dbo.orders SET item = 'new instance', note = 'n' WHERE id = 2")
    emu.run_capture_job(mssql_db)
    result = capture(config)
    assert result.events == 2  # each change once, although both instances hold the second one
    assert sorted(result.to_offset["capture_instances"]) == ["dbo_orders", "dbo_orders_v2"]
    got = replay({"staging.path": str(tmp_path), "name": config["name"]}).rows(f"{mssql_db}.dbo.orders")
    assert got[(1,)]["item"] == "old instance" and "note" not in got[(1,)]
    assert (got[(2,)]["item"], got[(2,)]["note"]) == ("new instance", "n")
    emu.disable_table(mssql_db, "dbo.orders", "dbo_orders")  # the old instance goes away
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("UPDATE dbo.orders SET note = 'later' WHERE id = 1")
    emu.run_capture_job(mssql_db)
    assert capture(config).events == 1
    got = replay({"staging.path": str(tmp_path), "name": config["name"]}).rows(f"{mssql_db}.dbo.orders")
    assert got[(1,)]["note"] == "later"

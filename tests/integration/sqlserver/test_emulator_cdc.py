"""The emulator's CDC behaviour through pyodbc + FreeTDS: change-table layouts and LSN order,
visibility only after commit *and* the capture job, concurrent writers, cleanup, capture instances,
isolation levels, multi-database sessions."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest

from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator
from tests.integration.sqlserver.conftest import connect, pyodbc

ALL_CHANGES = ("SELECT * FROM cdc.[fn_cdc_get_all_changes_{ci}](?, ?, N'{opt}')"
               " ORDER BY [__$start_lsn], [__$seqval], [__$operation]")


@pytest.fixture
def orders(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str) -> str:
    sqlserver_emulator.create_table(
        mssql_db, "dbo.orders", [("id", "int"), ("item", "nvarchar(40)"), ("qty", "smallint"),
                                 ("price", "decimal(10,2)")], primary_key=["id"])
    return sqlserver_emulator.enable_table(mssql_db, "dbo.orders")


def changes(cur: Any, ci: str, opt: str = "all update old") -> list[tuple]:
    lo = cur.execute("SELECT sys.fn_cdc_get_min_lsn(?)", ci).fetchone()[0]
    hi = cur.execute("SELECT sys.fn_cdc_get_max_lsn()").fetchone()[0]
    return [tuple(r) for r in cur.execute(ALL_CHANGES.format(ci=ci, opt=opt), lo, hi).fetchall()]


def test_all_changes_has_sql_server_layout_and_lsn_order(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, orders: str, odbc: Any) -> None:
    with sqlserver_emulator.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.orders VALUES (1, 'pen', 2, 1.50), (2, 'ink', 1, 9.99)")
        pg.commit()
        pg.execute("UPDATE dbo.orders SET qty = 3 WHERE id = 1")
        pg.execute("DELETE FROM dbo.orders WHERE id = 2")
        pg.commit()
    assert sqlserver_emulator.run_capture_job(mssql_db) == 5
    cur = odbc.cursor()
    rows = changes(cur, orders)
    assert [d[0] for d in cur.description] == [
        "__$start_lsn", "__$seqval", "__$operation", "__$update_mask", "id", "item", "qty", "price"]
    assert [(r[2], r[4:]) for r in rows] == [
        (2, (1, "pen", 2, Decimal("1.50"))), (2, (2, "ink", 1, Decimal("9.99"))),
        (3, (1, "pen", 2, Decimal("1.50"))), (4, (1, "pen", 3, Decimal("1.50"))),
        (1, (2, "ink", 1, Decimal("9.99")))]
    assert all(len(r[0]) == 10 and len(r[1]) == 10 for r in rows)
    assert [bytes(r[3]) for r in rows] == [b"\x0f", b"\x0f", b"\x04", b"\x04", b"\x0f"]  # qty is ordinal 3
    first, second = bytes(rows[0][0]), bytes(rows[2][0])
    assert rows[1][0] == first and rows[3][0] == rows[4][0] == second and first < second
    assert bytes(rows[2][1]) == bytes(rows[3][1]) < bytes(rows[4][1])  # 3/4 share their seqval
    assert bytes(rows[0][1]) < bytes(rows[1][1]) < first  # change LSNs come before the commit LSN
    # the capture job's filler row (tran_id 0x00) moves the max LSN past the last transaction
    filler = cur.execute("SELECT sys.fn_cdc_get_max_lsn()").fetchone()[0]
    assert filler > second
    mapped = cur.execute("SELECT start_lsn, tran_end_time, tran_id FROM cdc.lsn_time_mapping"
                         " ORDER BY start_lsn").fetchall()
    assert [bytes(m[0]) for m in mapped] == [first, second, filler] and mapped[0][1] <= mapped[1][1]
    assert bytes(mapped[2][2]) == b"\x00" and bytes(mapped[1][2]) != b"\x00"
    assert cur.execute("SELECT sys.fn_cdc_map_lsn_to_time(?)", second).fetchone()[0] == mapped[1][1]
    without_old = changes(cur, orders, opt="all")
    assert [r[2] for r in without_old] == [2, 2, 4, 1]
    assert bytes(cur.execute("SELECT sys.fn_cdc_increment_lsn(?)", first).fetchone()[0]) == (
        int.from_bytes(first, "big") + 1).to_bytes(10, "big")


def test_changes_appear_only_after_commit_and_capture_job(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, orders: str, odbc: Any) -> None:
    cur = odbc.cursor()
    empty_max = cur.execute("SELECT sys.fn_cdc_get_max_lsn()").fetchone()[0]
    assert empty_max == b"\x00" * 10
    with sqlserver_emulator.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.orders VALUES (1, 'pen', 2, 1.50)")
        assert sqlserver_emulator.run_capture_job(mssql_db) == 0  # not committed yet
        assert cur.execute("SELECT COUNT(*) FROM cdc.[dbo_orders_CT]").fetchone()[0] == 0
        filler = cur.execute("SELECT sys.fn_cdc_get_max_lsn()").fetchone()[0]
        assert filler > empty_max  # a filler row: the scan saw no captured transaction
        pg.commit()
    assert cur.execute("SELECT COUNT(*) FROM cdc.[dbo_orders_CT]").fetchone()[0] == 0  # job not run
    assert cur.execute("SELECT sys.fn_cdc_get_max_lsn()").fetchone()[0] == filler
    assert sqlserver_emulator.run_capture_job(mssql_db) == 1
    assert sqlserver_emulator.run_capture_job(mssql_db) == 0  # idempotent
    assert [r[4] for r in changes(cur, orders)] == [1]


def test_rolled_back_and_uncaptured_tables_leave_no_rows(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, orders: str, odbc: Any) -> None:
    sqlserver_emulator.create_table(mssql_db, "dbo.plain", [("id", "int")], primary_key=["id"])
    with sqlserver_emulator.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.orders VALUES (1, 'pen', 2, 1.50)")
        pg.rollback()
        pg.execute("INSERT INTO dbo.plain VALUES (1)")
        pg.commit()
    assert sqlserver_emulator.run_capture_job(mssql_db) == 0
    cur = odbc.cursor()
    assert cur.execute("SELECT COUNT(*) FROM cdc.[dbo_orders_CT]").fetchone()[0] == 0
    # nothing captured: the scan wrote a filler row only, and the instance's range is empty
    assert cur.execute("SELECT COUNT(*) FROM cdc.lsn_time_mapping WHERE tran_id <> 0x00").fetchone()[0] == 0
    assert changes(cur, orders) == []
    lo = cur.execute("SELECT sys.fn_cdc_get_min_lsn(?)", orders).fetchone()[0]
    below = (int.from_bytes(lo, "big") - 1).to_bytes(10, "big")  # before the instance's start: 313
    with pytest.raises(pyodbc.Error, match=r"\(313\)"):
        cur.execute(ALL_CHANGES.format(ci=orders, opt="all"), below, lo).fetchall()


def test_concurrent_writers_are_captured_as_whole_transactions_in_commit_order(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, orders: str, odbc: Any) -> None:
    writers, txns = 4, 15
    stop = threading.Event()

    def write(w: int) -> None:
        with sqlserver_emulator.pg_connect(mssql_db) as pg:
            for t in range(txns):
                key = w * 1000 + t
                pg.execute("INSERT INTO dbo.orders VALUES (%s, 'x', 0, 0)", (key,))
                pg.execute("UPDATE dbo.orders SET qty = qty + 1 WHERE id = %s", (w * 1000,))
                pg.commit()

    def capture() -> None:
        while not stop.is_set():
            sqlserver_emulator.run_capture_job(mssql_db)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    poller = threading.Thread(target=capture)
    poller.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    poller.join()
    sqlserver_emulator.run_capture_job(mssql_db)
    rows = changes(odbc.cursor(), orders)
    by_txn: dict[bytes, list[tuple]] = {}
    for r in rows:
        by_txn.setdefault(bytes(r[0]), []).append(r)
    assert len(by_txn) == writers * txns
    assert all([r[2] for r in group] == [2, 3, 4] for group in by_txn.values())  # whole transactions
    for w in range(writers):  # each writer's counter grows by one per transaction, in LSN order
        after = [r[6] for r in rows if r[2] == 4 and r[4] == w * 1000]
        assert after == list(range(1, txns + 1))
    with sqlserver_emulator.pg_connect(mssql_db) as pg:
        commit_order = [r[0] for r in pg.execute(
            "SELECT id FROM dbo.orders ORDER BY xmin::text::bigint").fetchall()]
    inserted = [r[4] for r in rows if r[2] == 2]
    assert sorted(inserted) == sorted(commit_order)


def test_cleanup_moves_min_lsn_and_rejects_purged_ranges(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, orders: str, odbc: Any) -> None:
    with sqlserver_emulator.pg_connect(mssql_db) as pg:
        for i in range(3):
            pg.execute("INSERT INTO dbo.orders VALUES (%s, 'x', 0, 0)", (i,))
            pg.commit()
    sqlserver_emulator.run_capture_job(mssql_db)
    cur = odbc.cursor()
    old_min = cur.execute("SELECT sys.fn_cdc_get_min_lsn(?)", orders).fetchone()[0]
    lsns = [bytes(r[0]) for r in changes(cur, orders)]
    low = sqlserver_emulator.run_cleanup(mssql_db, lsns[1])
    new_min = cur.execute("SELECT sys.fn_cdc_get_min_lsn(?)", orders).fetchone()[0]
    assert bytes(new_min) == low == lsns[1] and new_min > old_min
    assert [bytes(r[0]) for r in changes(cur, orders)] == lsns[1:]
    hi = cur.execute("SELECT sys.fn_cdc_get_max_lsn()").fetchone()[0]
    with pytest.raises(pyodbc.Error, match=r"insufficient number of arguments.*\(313\)"):
        cur.execute(ALL_CHANGES.format(ci=orders, opt="all update old"), old_min, hi).fetchall()
    with pytest.raises(pyodbc.Error, match=r"\(313\)"):  # beyond the max LSN
        beyond = cur.execute("SELECT sys.fn_cdc_increment_lsn(?)", hi).fetchone()[0]
        cur.execute(ALL_CHANGES.format(ci=orders, opt="all update old"), new_min, beyond).fetchall()
    assert cur.execute("SELECT sys.fn_cdc_get_min_lsn(N'no_such_instance')").fetchone()[0] == b"\x00" * 10


def test_second_capture_instance_and_disable(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, orders: str, odbc: Any) -> None:
    emu, cur = sqlserver_emulator, odbc.cursor()
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.orders VALUES (1, 'pen', 2, 1.50)")
        pg.commit()
    emu.run_capture_job(mssql_db)
    emu.add_column(mssql_db, "dbo.orders", "note", "nvarchar(100)")
    second = emu.enable_table(mssql_db, "dbo.orders", capture_instance="dbo_orders_v2")
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.orders VALUES (2, 'ink', 1, 9.99, 'new column')")
        pg.commit()
    emu.run_capture_job(mssql_db)
    assert [r[4:] for r in changes(cur, orders)] == [(1, "pen", 2, Decimal("1.50")), (2, "ink", 1, Decimal("9.99"))]
    assert [r[4:] for r in changes(cur, second)] == [(2, "ink", 1, Decimal("9.99"), "new column")]
    instances = cur.execute(
        "SELECT ct.capture_instance, OBJECT_SCHEMA_NAME(ct.source_object_id), OBJECT_NAME(ct.source_object_id),"
        " ct.start_lsn, ct.create_date FROM cdc.change_tables ct ORDER BY ct.create_date, ct.capture_instance"
    ).fetchall()
    assert [tuple(r[:3]) for r in instances] == [(orders, "dbo", "orders"), (second, "dbo", "orders")]
    assert instances[0][3] < instances[1][3]
    captured = cur.execute(
        "SELECT ct.capture_instance, cc.column_name, cc.column_ordinal, cc.column_type FROM cdc.captured_columns cc"
        " JOIN cdc.change_tables ct ON ct.object_id = cc.object_id WHERE ct.capture_instance = ?"
        " ORDER BY cc.column_ordinal", second).fetchall()
    assert [tuple(r[1:]) for r in captured] == [("id", 1, "int"), ("item", 2, "nvarchar"), ("qty", 3, "smallint"),
                                                 ("price", 4, "decimal"), ("note", 5, "nvarchar")]
    keys = cur.execute("SELECT ic.column_name, ic.index_ordinal FROM cdc.index_columns ic"
                       " JOIN cdc.change_tables ct ON ct.object_id = ic.object_id WHERE ct.capture_instance = ?",
                       second).fetchall()
    assert [tuple(k) for k in keys] == [("id", 1)]
    with pytest.raises(Exception, match="22962"):
        emu.enable_table(mssql_db, "dbo.orders", capture_instance="third")
    emu.disable_table(mssql_db, "dbo.orders", orders)
    with pytest.raises(pyodbc.Error, match=r"Invalid object name 'cdc.fn_cdc_get_all_changes_dbo_orders'.*208"):
        changes(cur, orders)
    assert cur.execute("SELECT is_tracked_by_cdc FROM sys.tables WHERE name = N'orders'").fetchone()[0] is True
    emu.disable_table(mssql_db, "dbo.orders")
    assert cur.execute("SELECT is_tracked_by_cdc FROM sys.tables WHERE name = N'orders'").fetchone()[0] is False


def test_isolation_levels_are_real_transactions(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, orders: str) -> None:
    reader = connect(sqlserver_emulator, mssql_db)  # autocommit off: FreeTDS begins a transaction
    cur = reader.cursor()
    count = "SELECT COUNT(*) FROM [dbo].[orders]"
    # SQL Server's REPEATABLE READ locks the rows it read but takes no range locks: a new row is a
    # phantom the next statement sees (SET TRANSACTION ISOLATION LEVEL); only SNAPSHOT does not
    for level, sees_new_rows in (("SNAPSHOT", False), ("REPEATABLE READ", True), ("READ COMMITTED", True)):
        reader.commit()
        cur.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        before = cur.execute(count).fetchone()[0]
        with sqlserver_emulator.pg_connect(mssql_db) as pg:
            pg.execute("INSERT INTO dbo.orders VALUES (%s, 'x', 0, 0)", (before + 1,))
        assert cur.execute(count).fetchone()[0] == before + (1 if sees_new_rows else 0), level
    reader.commit()
    assert cur.execute(count).fetchone()[0] == 3
    reader.close()


def test_snapshot_isolation_must_be_allowed(sqlserver_emulator: SqlServerCdcEmulator) -> None:
    name = "ms_no_snapshot"
    sqlserver_emulator.create_database(name)
    try:
        conn = connect(sqlserver_emulator, name)
        cur = conn.cursor()
        cur.execute("SET TRANSACTION ISOLATION LEVEL SNAPSHOT")
        with pytest.raises(pyodbc.Error, match=r"snapshot isolation is not allowed.*3952"):
            cur.execute("SELECT COUNT(*) FROM cdc.change_tables").fetchall()
        conn.close()
    finally:
        sqlserver_emulator.drop_database(name)


def test_catalog_agent_permissions_and_databases(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, orders: str, odbc: Any) -> None:
    cur = odbc.cursor()
    agent = ("SELECT CASE WHEN dss.[status] = 4 THEN 1 ELSE 0 END FROM sys.dm_server_services dss"
             " WHERE dss.[servicename] LIKE N'SQL Server Agent (%'")
    assert cur.execute(agent).fetchone()[0] == 1
    sqlserver_emulator.set_agent_running(False)
    assert cur.execute(agent).fetchone()[0] == 0
    with sqlserver_emulator.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.orders VALUES (1, 'pen', 2, 1.50)")
    assert sqlserver_emulator.run_capture_job(mssql_db) == 0  # no agent, no capture job
    sqlserver_emulator.set_agent_running(True)
    assert sqlserver_emulator.run_capture_job(mssql_db) == 1
    perms = "SELECT HAS_PERMS_BY_NAME(N'cdc.dbo_orders_CT', N'OBJECT', N'SELECT')"
    assert cur.execute(perms).fetchone()[0] == 1
    sqlserver_emulator.deny_select(mssql_db, "cdc.dbo_orders_CT")
    assert cur.execute(perms).fetchone()[0] == 0
    row = cur.execute("SELECT name, is_cdc_enabled, snapshot_isolation_state FROM sys.databases"
                      " WHERE name = ?", mssql_db).fetchone()
    assert tuple(row) == (mssql_db, True, 1)
    cols = cur.execute(
        "SELECT c.name, ty.name, c.max_length, c.precision, c.scale, c.is_nullable FROM sys.columns c"
        " JOIN sys.types ty ON ty.user_type_id = c.user_type_id WHERE c.object_id = OBJECT_ID(N'dbo.orders')"
        " ORDER BY c.column_id").fetchall()
    assert [tuple(c) for c in cols] == [("id", "int", 4, 10, 0, False), ("item", "nvarchar", 80, 0, 0, True),
                                        ("qty", "smallint", 2, 5, 0, True), ("price", "decimal", 9, 10, 2, True)]


def test_use_and_three_part_names_reach_other_databases(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, orders: str, odbc: Any) -> None:
    other = mssql_db + "_b"
    sqlserver_emulator.create_database(other)
    try:
        sqlserver_emulator.create_table(other, "dbo.t", [("id", "int")], primary_key=["id"])
        with sqlserver_emulator.pg_connect(other) as pg:
            pg.execute("INSERT INTO dbo.t VALUES (7)")
        cur = odbc.cursor()
        assert cur.execute(f"SELECT [id] FROM [{other}].[dbo].[t]").fetchone()[0] == 7
        cur.execute(f"USE [{other}]")
        assert cur.execute("SELECT DB_NAME()").fetchone()[0] == other
        with pytest.raises(pyodbc.Error, match=r"Database 'nope' does not exist.*911"):
            cur.execute("SELECT * FROM [nope].[dbo].[t]")
    finally:
        sqlserver_emulator.drop_database(other)


def test_background_capture_job_polls(pg_server: Any) -> None:
    import time
    import uuid

    emu = SqlServerCdcEmulator(pg_server).start(capture_poll_seconds=0.05)
    name = f"ms_poll_{uuid.uuid4().hex[:8]}"
    try:
        emu.create_database(name)
        emu.create_table(name, "dbo.t", [("id", "int")], primary_key=["id"])
        emu.enable_table(name, "dbo.t")
        with emu.pg_connect(name) as pg:
            pg.execute("INSERT INTO dbo.t VALUES (1)")
        conn = connect(emu, name, autocommit=True)
        deadline = time.monotonic() + 20
        while conn.cursor().execute("SELECT COUNT(*) FROM cdc.[dbo_t_CT]").fetchone()[0] == 0:
            assert time.monotonic() < deadline, "the polling capture job never captured the insert"
            time.sleep(0.05)
        conn.close()
    finally:
        emu.stop()
        emu.drop_database(name)


@pytest.mark.parametrize("before_statement", range(6))
def test_table_enabled_while_the_capture_job_scans_is_captured(pg_server: Any, before_statement: int) -> None:
    """``sp_cdc_enable_table`` committing between any two statements of a capture scan: the
    instance still gets its start LSN and its changes (a poller once lost it for good)."""
    import uuid

    import psycopg

    from airflow_cdc.testing.sqlserver_emulator import capture

    emu = SqlServerCdcEmulator(pg_server)
    name = f"ms_race_{uuid.uuid4().hex[:8]}"
    emu.create_database(name)
    try:
        emu.create_table(name, "dbo.t", [("id", "int")], primary_key=["id"])
        statements, enabling = 0, False
        real_execute = psycopg.Connection.execute

        def execute(conn: psycopg.Connection, *args: Any, **kwargs: Any) -> Any:
            nonlocal statements, enabling
            if not enabling:
                if statements == before_statement:
                    enabling = True
                    emu.enable_table(name, "dbo.t")  # its own connection, committed
                    enabling = False
                statements += 1
            return real_execute(conn, *args, **kwargs)

        job = emu.db(name).capture
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(psycopg.Connection, "execute", execute)
            job.run()
        assert statements > before_statement, "the scan ran fewer statements than the case assumes"
        with emu.pg_connect(name) as pg:
            pg.execute("INSERT INTO dbo.t VALUES (7)")
        job.run()
        with emu.pg_connect(name) as pg:
            rows = pg.execute('SELECT id, "__$operation" FROM cdc."dbo_t_CT"').fetchall()
            instances = capture._instances(pg)
        assert [i.name for i in instances] == ["dbo_t"]
        assert [(str(i), op) for i, op in rows] == [("7", 2)]
    finally:
        emu.stop()
        emu.drop_database(name)

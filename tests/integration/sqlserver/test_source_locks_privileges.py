"""Locks and privileges (issue 31, item 6), against the emulator; ``tests/integration/sqlserver_real``
runs the same tests against a real SQL Server.

What each isolation level holds is Microsoft's *SET TRANSACTION ISOLATION LEVEL*: REPEATABLE READ and
SERIALIZABLE keep shared locks on the rows read until the commit, READ COMMITTED only while reading a
row (and waits for uncommitted writers), SNAPSHOT and READ UNCOMMITTED take none; an exclusive table
lock (``exclusive`` mode's ``TABLOCKX``) stops writers and locking readers.  The snapshot reads each
chunk in a transaction of its own, so a writer waits one chunk read at most, and not at all under
the default ``read_committed``.  A login without VIEW SERVER STATE captures with a warning.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_cdc.core.capture import Capture
from airflow_cdc.core.pipeline import build_store
from airflow_cdc.sources.sqlserver import client, sql
from airflow_cdc.sources.sqlserver.checks import check_connection
from airflow_cdc.sources.sqlserver.config import sqlserver_config
from airflow_cdc.sources.sqlserver.snapshot import read_chunk
from airflow_cdc.sources.sqlserver.source import SqlServerSource
from tests.integration.sqlserver.locks_bench import (
    CHUNK_SELECT,
    FREE,
    HOLD,
    ROWS,
    WAITED,
    App,
    Bench,
    SlowCommit,
    background,
    rows,
    stamped,
    timed,
)
from tests.support.pipeline import replay

pyodbc = pytest.importorskip("pyodbc")


@dataclass
class EmulatorBench(Bench):
    emulator: Any = None

    def properties(self) -> dict[str, Any]:
        emu = self.emulator
        return {"database.hostname": emu.host, "database.port": emu.port, "database.user": emu.user,
                "database.password": emu.password, "database.names": self.database, "database.encrypt": False}  # fmt: skip

    def app(self) -> App:
        return App(self.emulator.pg_connect(self.database), "%s")

    def run_capture_job(self) -> None:
        self.emulator.run_capture_job(self.database)

    def least_privilege_login(self) -> tuple[str, str]:
        name, password = f"cdc_reader_{uuid.uuid4().hex[:8]}", "Reader-Passw0rd!"
        self.emulator.add_login(name, password)  # SELECT on the tables and cdc, no VIEW SERVER STATE
        return name, password


@pytest.fixture
def bench(sqlserver_emulator: Any, mssql_db: str, tmp_path: Any) -> EmulatorBench:
    emu = sqlserver_emulator
    emu.create_table(mssql_db, "dbo.items", [("id", "int"), ("v", "int")], primary_key=["id"])
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.items SELECT g, 0 FROM generate_series(1, %s) g", (ROWS,))
    emu.enable_table(mssql_db, "dbo.items")
    emu.run_capture_job(mssql_db)
    return EmulatorBench(mssql_db, tmp_path / "staging", emulator=emu)


def run(*statements: str, on: Any) -> None:
    cur = on.cursor()
    for statement in statements:
        cur.execute(statement)


# -- the server's locks, statement by statement ------------------------------------------------
@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_locking_levels_hold_the_rows_read_until_the_commit(bench: Bench, level: str) -> None:
    reader, app, other = bench.reader(), bench.app(), bench.app()
    try:
        run(f"SET TRANSACTION ISOLATION LEVEL {level}", "BEGIN TRANSACTION", on=reader)
        assert [r[0] for r in rows(reader, CHUNK_SELECT)] == list(range(1, 11))
        with background() as submit:
            inside = submit(stamped, app.update, 5)
            assert other.update(ROWS - 10) < FREE  # a row not read is not locked
            time.sleep(HOLD)
            assert not inside.done()  # waits for the reader's transaction ...
            run("COMMIT TRANSACTION", on=reader)
            committed = time.monotonic()
            waited, ended = inside.result(timeout=30)
        assert waited >= HOLD and ended - committed < FREE  # ... and no longer
    finally:
        for c in (reader, app, other):
            c.close()


def test_read_committed_locks_a_row_only_while_reading_it(bench: Bench) -> None:
    reader, app = bench.reader(), bench.app()
    try:
        run("SET TRANSACTION ISOLATION LEVEL READ COMMITTED", "BEGIN TRANSACTION", on=reader)
        rows(reader, CHUNK_SELECT)
        assert app.update(5) < FREE  # the transaction is open, the rows read are not locked
        app.begin(7)  # an uncommitted change: a locking reader waits for it, then reads it
        with background() as submit:
            read = submit(stamped, rows, reader, CHUNK_SELECT)
            time.sleep(HOLD)
            assert not read.done()
            app.commit()
            committed = time.monotonic()
            got, ended = read.result(timeout=30)
        assert dict(got)[7] == 1 and dict(got)[5] == 1 and ended - committed < FREE
        run("COMMIT TRANSACTION", on=reader)
    finally:
        reader.close()
        app.close()


def test_exclusive_table_lock_stops_writers_and_locking_readers_only(bench: Bench) -> None:
    holder, app = bench.reader(), bench.app()
    readers = {level: bench.reader() for level in ("SNAPSHOT", "READ UNCOMMITTED", "READ COMMITTED")}
    try:
        run("BEGIN TRANSACTION", on=holder)
        rows(holder, "SELECT TOP (0) * FROM [dbo].[items] WITH (TABLOCKX)")  # Debezium's exclusive lock
        for level in ("SNAPSHOT", "READ UNCOMMITTED"):  # row versions / dirty reads: no shared locks
            run(f"SET TRANSACTION ISOLATION LEVEL {level}", "BEGIN TRANSACTION", on=readers[level])
            assert timed(rows, readers[level], CHUNK_SELECT) < FREE, level
        run("SET LOCK_TIMEOUT 300", on=readers["READ COMMITTED"])
        with pytest.raises(pyodbc.Error, match=r"Lock request time out period exceeded.*\(1222\)"):
            rows(readers["READ COMMITTED"], CHUNK_SELECT)
        with background() as submit:
            writer = submit(stamped, app.update, ROWS - 10)  # any row of the table
            time.sleep(HOLD)
            assert not writer.done()
            run("COMMIT TRANSACTION", on=holder)
            committed = time.monotonic()
            waited, ended = writer.result(timeout=30)
        assert waited >= HOLD and ended - committed < FREE
        for level in ("SNAPSHOT", "READ UNCOMMITTED"):  # their open transactions hold nothing
            assert app.update(5) < FREE, level
            run("COMMIT TRANSACTION", on=readers[level])
    finally:
        for c in (holder, app, *readers.values()):
            c.close()


def test_lock_timeout_cancels_the_statement_not_the_transaction(bench: Bench) -> None:
    reader, app, other = bench.reader(), bench.app(), bench.app()
    try:
        run("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", "SET LOCK_TIMEOUT 300", "BEGIN TRANSACTION",
            on=reader)  # fmt: skip
        rows(reader, "SELECT [id], [v] FROM [dbo].[items] WHERE [id] = 1")
        app.begin(2)
        started = time.monotonic()
        with pytest.raises(pyodbc.Error, match=r"Lock request time out period exceeded.*\(1222\)"):
            rows(reader, "SELECT [id], [v] FROM [dbo].[items] WHERE [id] = 2")
        assert 0.25 < time.monotonic() - started < 0.3 + FREE
        app.commit()
        with background() as submit:  # the transaction lives on: row 1 is still locked
            writer = submit(other.update, 1)
            time.sleep(HOLD)
            assert not writer.done()
            assert rows(reader, "SELECT [id], [v] FROM [dbo].[items] WHERE [id] = 2") == [(2, 1)]
            run("COMMIT TRANSACTION", on=reader)
            assert writer.result(timeout=30) >= HOLD
    finally:
        for c in (reader, app, other):
            c.close()


def test_deadlock_victim_gets_1205_and_its_transaction_is_rolled_back(bench: Bench) -> None:
    reader, app = bench.reader(), bench.app()
    try:
        run("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", "SET DEADLOCK_PRIORITY LOW", "BEGIN TRANSACTION",
            on=reader)  # fmt: skip
        rows(reader, "SELECT [id], [v] FROM [dbo].[items] WHERE [id] = 1")  # S lock on 1
        app.begin(2)  # X lock on 2
        with background() as submit:
            read = submit(rows, reader, "SELECT [id], [v] FROM [dbo].[items] WHERE [id] = 2")  # waits for 2
            time.sleep(0.3)
            write = submit(app.begin, 1)  # waits for 1: a cycle
            with pytest.raises(pyodbc.Error, match=r"deadlocked on lock resources with another process and "
                                                   r"has been chosen as the deadlock victim.*\(1205\)"):  # fmt: skip
                read.result(timeout=60)
            write.result(timeout=30)  # the victim's locks are gone with its transaction
        app.commit()
        assert bench.values()[1] == 1
    finally:
        reader.close()
        app.close()


# -- the source's chunk reads -----------------------------------------------------------------
#: mode: (a writer of a row in the chunk waits for its commit, a writer of another row does)
MODES = {
    "read_committed": (False, False),
    "repeatable_read": (True, False),
    "exclusive": (True, True),
    "snapshot": (False, False),
    "read_uncommitted": (False, False),
}


def test_each_mode_holds_what_sql_server_holds_for_one_chunk_read(bench: Bench) -> None:
    config = sqlserver_config(bench.config())
    source = SqlServerSource(config)
    source.open()
    inside, outside = bench.app(), bench.app()
    try:
        ci = source.table_state(f"{bench.database}.dbo.items").instance
        target = (ci.database, ci.schema, ci.table)
        for mode, expected in MODES.items():
            slow = SlowCommit(source.conn, HOLD)
            with background() as submit:
                chunk = submit(read_chunk, slow, mode, target, ci.columns, list(ci.key), None, 10)
                assert slow.reached.wait(30), mode
                waits = submit(inside.update, 5), submit(outside.update, ROWS - 10)
                got = tuple(w.result(timeout=30) >= WAITED for w in waits)
                assert [r[0] for r in chunk.result(timeout=30).rows] == list(range(1, 11))
            assert got == expected, (mode, [w.result() for w in waits])
            assert inside.update(6) < FREE and outside.update(7) < FREE, mode  # nothing held after it
        assert client.scalar(source.conn, "SELECT 1") == 1
    finally:
        inside.close()
        outside.close()
        source.close()


def test_a_chunk_read_chosen_as_deadlock_victim_is_read_again(bench: Bench, caplog: Any) -> None:
    source = SqlServerSource(sqlserver_config(bench.config()))
    source.open()
    app = bench.app()
    try:
        ci = source.table_state(f"{bench.database}.dbo.items").instance
        target = (ci.database, ci.schema, ci.table)
        caplog.set_level(logging.WARNING)
        app.begin(8)
        with background() as submit:  # the chunk locks 1..7, then waits for 8
            chunk = submit(
                read_chunk, source.conn, "repeatable_read", target, ci.columns, list(ci.key), None, 10
            )
            time.sleep(0.3)
            submit(app.begin, 3).result(timeout=60)  # a cycle: the chunk is the victim, 3 is free
            app.commit()
            got = chunk.result(timeout=60)
        assert dict(r[:2] for r in got.rows) == {k: int(k in (3, 8)) for k in range(1, 11)}
        assert any("deadlock victim" in r.getMessage() and "(1205)" in r.getMessage() for r in caplog.records)
    finally:
        app.close()
        source.close()


@pytest.mark.parametrize("mode", [None, "repeatable_read", "exclusive"])
def test_a_writer_never_waits_longer_than_one_chunk_read(
    bench: Bench, mode: str | None, monkeypatch: Any
) -> None:
    config = sqlserver_config(bench.config(**({"snapshot.isolation.mode": mode} if mode else {})))
    if mode is None:
        assert config["snapshot.isolation.mode"] == "read_committed"  # the default
    hold, opened, real_connect = HOLD / 2, [], client.connect

    def slow_connect(*args: Any, **kwargs: Any) -> SlowCommit:
        opened.append(SlowCommit(real_connect(*args, **kwargs), hold))
        return opened[-1]

    monkeypatch.setattr(client, "connect", slow_connect)
    stop, waits = threading.Event(), []

    def write() -> None:
        app, rng = bench.app(), random.Random(7)
        try:
            while not stop.is_set():
                waits.append(app.update(rng.randint(1, ROWS)))
        finally:
            app.close()

    with background() as submit:
        writer = submit(write)
        try:
            result = Capture(SqlServerSource(config), config, build_store(config)).run(commit=True)
        finally:
            stop.set()
        writer.result(timeout=60)
    chunks = [c for conn in opened for c in conn.chunks]
    assert result.snapshot_rows == ROWS and len(chunks) >= ROWS // 100 and len(waits) > 20
    assert max(waits) <= max(chunks) + 0.1, (max(waits), max(chunks))
    if mode is None:
        assert max(waits) < FREE
    else:
        assert max(waits) >= 0.6 * hold  # the writer did meet a chunk's locks


# -- privileges --------------------------------------------------------------------------------
def test_least_privilege_login_captures_a_table_with_a_warning(bench: Bench, caplog: Any) -> None:
    user, password = bench.least_privilege_login()
    config = sqlserver_config(bench.config(database__user=user, database__password=password))
    caplog.set_level(logging.WARNING)
    first = Capture(SqlServerSource(config), config, build_store(config)).run(commit=True)
    assert first.snapshot_rows == ROWS
    assert any("VIEW SERVER STATE" in r.getMessage() and "SQL Server Agent" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    app = bench.app()
    try:
        app.update(3)
    finally:
        app.close()
    bench.run_capture_job()
    second = Capture(SqlServerSource(config), config, build_store(config)).run(commit=True)
    assert second.events == 1
    got = replay({"staging.path": config["staging.path"], "name": config["name"]}).rows(
        f"{bench.database}.dbo.items"
    )
    assert got == {(k,): {"id": k, "v": v} for k, v in bench.values().items()}


def test_connection_check_reports_the_missing_permission_as_a_warning(bench: Bench) -> None:
    user, password = bench.least_privilege_login()
    props = {"database__user": user, "database__password": password}
    reader = bench.reader(**props)
    try:
        with pytest.raises(pyodbc.Error) as denied:
            rows(reader, sql.AGENT_RUNNING)
        # SQL Server sends 300 ("VIEW SERVER STATE permission was denied on object 'server',
        # database 'master'.") and then 297; FreeTDS's ODBC driver reports the last one
        assert "The user does not have permission to perform this action. (297)" in str(denied.value)
        assert rows(reader, "SELECT COUNT(*) FROM cdc.change_tables") == [(1,)]  # the rest is readable
    finally:
        reader.close()
    summary = check_connection(sqlserver_config(bench.config(**props)))
    assert (
        summary.startswith(f"CDC enabled on {bench.database}; warning: ") and "VIEW SERVER STATE" in summary
    )
    admin = check_connection(sqlserver_config(bench.config()))
    assert admin == f"CDC enabled on {bench.database}; SQL Server Agent not reported stopped"

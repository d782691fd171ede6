"""Tables without key columns on SQL Server: captured, not refused.  Mirrored exactly as multisets
(duplicates, updates and deletes of one of several equal rows) unless they stage large-object
columns, whose old images change tables do not hold (then an append-only log, with a warning);
snapshots read whole at the log's end under a table lock; SIGKILLed captures with writers."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.errors import MissingPrivilege
from airflow_cdc.core.pipeline import build_config
from airflow_cdc.sources.sqlserver import sql, whole
from airflow_cdc.sources.sqlserver.offsets import SqlServerLsn, SqlServerPosition
from airflow_cdc.sources.sqlserver.source import SqlServerSource
from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator
from tests.integration.sqlserver.conftest import connect
from tests.support import keyless
from tests.support.pipeline import CrashRuns, assert_rows_equal, replay, run_capture, snapshot_pending

#: one occurrence of the rows ``where`` picks: equal rows are told apart by their place (``ctid``)
#: in the backing PostgreSQL table, as a SQL Server writer's ``DELETE TOP (1)`` picks one
ONE = "(SELECT ctid FROM dbo.{t} WHERE {where} LIMIT 1)"


def config_for(emu: SqlServerCdcEmulator, db: str, staging: Path, **props: Any) -> dict[str, Any]:
    return {
        "name": f"kl_{db}", "connector": "sqlserver", "staging.path": str(staging),
        "database.hostname": emu.host, "database.port": emu.port, "database.user": emu.user,
        "database.password": emu.password, "database.names": db, "database.encrypt": False,
        "snapshot.isolation.mode": "snapshot", **{k.replace("__", "."): v for k, v in props.items()},
    }  # fmt: skip


def write(emu: SqlServerCdcEmulator, db: str, *statements: str, capture: bool = True) -> None:
    """Run the statements on the backing database, one transaction each; then the capture job."""
    with emu.pg_connect(db, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)
    if capture:
        emu.run_capture_job(db)


def keyless_table(emu: SqlServerCdcEmulator, db: str, name: str, columns: list[tuple[str, str]]) -> str:
    """Create ``dbo.<name>`` without a key and enable CDC on it (``@supports_net_changes = 0``)."""
    emu.create_table(db, f"dbo.{name}", columns)
    emu.enable_table(db, f"dbo.{name}")
    emu.run_capture_job(db)  # establishes the capture instance's start LSN
    return f"{db}.dbo.{name}"


def source_multiset(config: dict[str, Any], table: str) -> list[dict[str, Any]]:
    """Every row of the live table (duplicates included), encoded like captured rows: what
    ``verify`` reads (a table without key columns in one read under a table lock)."""
    source = SqlServerSource(build_config(config))
    source.open()
    try:
        return [row for piece in source.encoded_chunks(table, 1000) for row in piece.to_pylist()]
    finally:
        source.close()


def source_rows(config: dict[str, Any], table: str) -> dict[tuple, dict[str, Any]]:
    """The live keyed table by its key, encoded like captured rows."""
    source = SqlServerSource(build_config(config))
    source.open()
    try:
        keys = source.table_state(table).key_columns
    finally:
        source.close()
    return {tuple(r[k] for k in keys): r for r in source_multiset(config, table)}


def mirrored(config: dict[str, Any], table: str) -> Any:
    return keyless.assert_mirrored(config, table, source_multiset)


def staged_events(config: dict[str, Any], table: str) -> list[dict[str, Any]]:
    """Every staged event of ``table`` in every batch, in batch order."""
    out = []
    for batch in list_batches(config["staging.path"], config["name"]):
        if table in batch.tables():
            out += [row for rb in batch.iter_events(table) for row in rb.to_pylist()]
    return out


COLUMNS = [("a", "int"), ("b", "nvarchar(10)"), ("n", "decimal(6,2)"), ("bin", "varbinary(4)")]


def test_keyless_table_is_a_multiset(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Path):
    emu = sqlserver_emulator
    table = keyless_table(emu, mssql_db, "h", COLUMNS)
    write(
        emu, mssql_db,
        "INSERT INTO dbo.h SELECT g % 7, 'b' || (g % 3), NULL, '\\x00' FROM generate_series(1, 300) g",
        "INSERT INTO dbo.h VALUES (NULL, NULL, NULL, NULL), (NULL, NULL, NULL, NULL)",
    )  # fmt: skip
    config = config_for(emu, mssql_db, tmp_path / "staging", snapshot__max__rows__per__run=50)
    run_capture(config)
    assert not snapshot_pending(config), "a keyless table is read whole in one run"
    info = list_batches(config["staging.path"], config["name"])[-1].table_info(table)
    assert info["keyless"] == "multiset" and info["key_columns"] == []
    mirrored(config, table)
    write(
        emu, mssql_db,
        f"DELETE FROM dbo.h WHERE ctid = {ONE.format(t='h', where='a = 1')}",
        f"UPDATE dbo.h SET n = 1.5 WHERE ctid = {ONE.format(t='h', where='a = 2')}",
        f"DELETE FROM dbo.h WHERE ctid = {ONE.format(t='h', where='a IS NULL')}",
        "INSERT INTO dbo.h VALUES (1, 'b1', NULL, '\\x00')",
        "UPDATE dbo.h SET b = 'z' WHERE a = 3",
        "BEGIN; DELETE FROM dbo.h WHERE a = 4; INSERT INTO dbo.h (a, b) VALUES (4, 'back'), (4, 'back'); COMMIT",
    )  # fmt: skip
    run_capture(config)
    mirrored(config, table)
    # a second snapshot (its rows replace silver's), then a change to one of two equal rows
    write(emu, mssql_db, "DELETE FROM dbo.h", "INSERT INTO dbo.h (a) VALUES (7), (7), (8)")
    run_capture(config, signals=[{"execute-snapshot": {"data-collections": [table]}}])
    write(emu, mssql_db, f"UPDATE dbo.h SET a = 9 WHERE ctid = {ONE.format(t='h', where='a = 7')}")
    run_capture(config)
    oracle = mirrored(config, table)
    assert sorted(r["a"] for r in oracle.multiset(table)) == [7, 8, 9]


@pytest.mark.parametrize("isolation", ["snapshot", "read_committed"])
def test_snapshot_is_positioned_at_the_log_end_past_the_capture_job(
    sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Path, isolation: str
):
    """Changes committed before the whole read but not yet copied by the capture job are in its
    rows; their events reach a later window, below the snapshot's position, and change nothing.
    Changes after the read are above it.  (``snapshot``: the rows are read in a SNAPSHOT
    transaction after the table lock is released; otherwise under it.)"""
    emu = sqlserver_emulator
    table = keyless_table(emu, mssql_db, "lag", [("a", "int"), ("b", "nvarchar(10)")])
    write(emu, mssql_db, "INSERT INTO dbo.lag SELECT g % 5, 'x' FROM generate_series(1, 40) g")
    write(
        emu, mssql_db,
        "INSERT INTO dbo.lag VALUES (1, 'x'), (99, 'late')",
        f"DELETE FROM dbo.lag WHERE ctid = {ONE.format(t='lag', where='a = 2')}",
        capture=False,
    )  # fmt: skip
    config = config_for(emu, mssql_db, tmp_path / "staging", snapshot__isolation__mode=isolation)
    first = run_capture(config)
    assert first.snapshot_rows == 41
    events = staged_events(config, table)
    position = SqlServerPosition.from_sort_key(events[0]["__position"])
    assert events[0]["op"] == "t" and {e["op"] for e in events[1:]} == {"r"}
    assert position.commit_lsn > SqlServerLsn.parse(first.to_offset["commit_lsn"]), "past the window"
    emu.run_capture_job(mssql_db)  # now the change tables hold the three late changes
    write(emu, mssql_db, f"UPDATE dbo.lag SET b = 'after' WHERE ctid = {ONE.format(t='lag', where='a = 1')}")
    second = run_capture(config)
    assert second.events == 4  # the three changes the rows hold, and the update after them
    later = [e for e in staged_events(config, table)[len(events) :] if e["op"] != "t"]
    below = [e for e in later if e["__position"] < events[0]["__position"]]
    assert len(below) == 3 and all(SqlServerPosition.from_sort_key(e["__position"]).commit_lsn
                                   < position.commit_lsn for e in below)  # fmt: skip
    oracle = mirrored(config, table)
    assert sorted(r["b"] for r in oracle.multiset(table) if r["a"] == 1).count("after") == 1


def test_writers_go_on_while_a_snapshot_read_streams_the_rows(
    sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Under ``snapshot.isolation.mode: snapshot`` the table lock ends before the rows are read: a
    writer committing meanwhile does not wait, is not in the rows, and is applied after them."""
    emu = sqlserver_emulator
    table = keyless_table(emu, mssql_db, "wr", [("a", "int")])
    write(emu, mssql_db, "INSERT INTO dbo.wr VALUES (1), (1)")
    rows = whole._rows

    def rows_with_a_writer(cur: Any, ci: Any, size: int) -> Any:
        with emu.pg_connect(mssql_db, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '2s'")  # a writer waiting for the table lock fails
            conn.execute("INSERT INTO dbo.wr VALUES (2)")
            conn.execute(f"DELETE FROM dbo.wr WHERE ctid = {ONE.format(t='wr', where='a = 1')}")
        yield from rows(cur, ci, size)

    monkeypatch.setattr(whole, "_rows", rows_with_a_writer)
    config = config_for(emu, mssql_db, tmp_path / "staging")
    assert run_capture(config).snapshot_rows == 2  # the table before the writer
    monkeypatch.undo()
    emu.run_capture_job(mssql_db)
    run_capture(config)
    assert sorted(r["a"] for r in mirrored(config, table).multiset(table)) == [1, 2]


def test_large_object_columns_make_an_append_log_with_a_warning(
    sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    emu = sqlserver_emulator
    columns = [("a", "int"), ("doc", "nvarchar(max)"), ("old", "text"), ("tag", "nvarchar(10)")]
    table = keyless_table(emu, mssql_db, "docs", columns)
    write(emu, mssql_db, "INSERT INTO dbo.docs VALUES (1, 'long', 'legacy', 't'), (1, 'long', 'legacy', 't')")
    config = config_for(emu, mssql_db, tmp_path / "staging")
    with caplog.at_level(logging.WARNING, logger="airflow_cdc.sources.sqlserver.tables"):
        run_capture(config)
    warned = [r.getMessage() for r in caplog.records if "append-only log" in r.getMessage()]
    assert warned and table in warned[0] and "doc, old" in warned[0], warned
    write(
        emu, mssql_db,
        f"UPDATE dbo.docs SET tag = 'u' WHERE ctid = {ONE.format(t='docs', where='a = 1')}",
        f"DELETE FROM dbo.docs WHERE ctid = {ONE.format(t='docs', where='a = 1')}",
    )  # fmt: skip
    run_capture(config)
    batches = [b for b in list_batches(config["staging.path"], config["name"]) if table in b.tables()]
    assert {b.table_info(table)["keyless"] for b in batches} == {"append"}
    events = staged_events(config, table)
    update = next(e for e in events if e["op"] == "u")
    delete = next(e for e in events if e["op"] == "d")
    # SQL Server's change tables: an unchanged (max) value and text are NULL in the before image,
    # text is NULL in the delete, nvarchar(max) keeps its value there
    assert (update["before"]["doc"], update["before"]["old"], update["after"]["doc"]) == (None, None, "long")
    assert (delete["before"]["doc"], delete["before"]["old"]) == ("long", None)
    log = replay(config).keyless[table].log
    assert [op for op, _ in log] == ["r", "r", "u", "d"]


def test_excluding_the_large_object_columns_mirrors_the_table(
    sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Path
):
    emu = sqlserver_emulator
    table = keyless_table(emu, mssql_db, "docs2", [("a", "int"), ("doc", "xml"), ("tag", "nvarchar(10)")])
    write(emu, mssql_db, "INSERT INTO dbo.docs2 VALUES (1, '<a/>', 't'), (1, '<a/>', 't')")
    config = config_for(emu, mssql_db, tmp_path / "staging", column__exclude__list="dbo.docs2.doc")
    run_capture(config)
    write(
        emu, mssql_db, f"UPDATE dbo.docs2 SET tag = 'u' WHERE ctid = {ONE.format(t='docs2', where='a = 1')}"
    )
    run_capture(config)
    assert list_batches(config["staging.path"], config["name"])[-1].table_info(table)["keyless"] == "multiset"
    assert sorted(r["tag"] for r in mirrored(config, table).multiset(table)) == ["t", "u"]


def test_message_key_columns_key_a_table_without_key(
    sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Path
):
    emu = sqlserver_emulator
    table = keyless_table(emu, mssql_db, "mk", [("id", "int"), ("v", "nvarchar(10)")])
    write(emu, mssql_db, "INSERT INTO dbo.mk SELECT g, 'v' || g FROM generate_series(1, 30) g")
    config = config_for(emu, mssql_db, tmp_path / "staging", message__key__columns="dbo.mk:id",
                        incremental__snapshot__chunk__size=7)  # fmt: skip
    result = run_capture(config)
    info = list_batches(config["staging.path"], config["name"])[-1].table_info(table)
    assert info["key_columns"] == ["id"] and "keyless" not in info
    assert result.snapshot_rows == 30 and not any("read whole" in n for n in result.notes)
    write(emu, mssql_db, "UPDATE dbo.mk SET v = 'new' WHERE id = 3", "DELETE FROM dbo.mk WHERE id = 4")
    run_capture(config)
    with emu.pg_connect(mssql_db) as conn:
        expected = {(i,): {"id": i, "v": v} for i, v in conn.execute("SELECT id, v FROM dbo.mk")}
    assert_rows_equal(table, expected, replay(config).rows(table))


def test_whole_read_hardens_delayed_durable_commits_and_needs_view_server_state(
    sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Path
):
    emu = sqlserver_emulator
    table = keyless_table(emu, mssql_db, "dd", [("a", "int")])
    write(
        emu, mssql_db, "INSERT INTO dbo.dd VALUES (1), (1)", "UPDATE sys.databases SET delayed_durability = 1"
    )
    config = config_for(emu, mssql_db, tmp_path / "staging")
    run_capture(config)
    assert emu.db(mssql_db).log_flushes == 1  # sys.sp_flush_log before the log's end is read
    mirrored(config, table)
    emu.add_login("reader", "Reader-Passw0rd!")  # no VIEW SERVER STATE: sys.dm_db_log_stats refused
    low = config_for(
        emu, mssql_db, tmp_path / "low", database__user="reader", database__password="Reader-Passw0rd!"
    )
    with pytest.raises(MissingPrivilege, match="VIEW SERVER STATE"):
        run_capture(low)


def test_shared_table_lock_holds_writers_not_readers(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str):
    """The whole read's ``WITH (TABLOCK, HOLDLOCK)``: writers of the table wait for the reading
    transaction's commit, a locking (READ COMMITTED) reader of the table does not."""
    emu = sqlserver_emulator
    keyless_table(emu, mssql_db, "lk", [("a", "int")])
    write(emu, mssql_db, "INSERT INTO dbo.lk VALUES (1), (1)")
    holder, reader = connect(emu, mssql_db, autocommit=True), connect(emu, mssql_db, autocommit=True)
    try:
        cur = holder.cursor()
        cur.execute("BEGIN TRANSACTION")
        cur.execute(sql.table_share_lock(mssql_db, "dbo", "lk")).fetchall()
        got = reader.cursor().execute(sql.whole_select(mssql_db, "dbo", "lk", ["a"])).fetchall()
        assert [r[0] for r in got] == [1, 1]
        done = threading.Event()
        writer = threading.Thread(
            target=lambda: (write(emu, mssql_db, "INSERT INTO dbo.lk VALUES (2)"), done.set())
        )
        writer.start()
        assert not done.wait(0.5), "a writer of the table waits for the lock"
        cur.execute("COMMIT TRANSACTION")
        assert done.wait(10), "and goes on once it is released"
        writer.join()
    finally:
        holder.close()
        reader.close()


# -- SIGKILLed captures while writers change one of several equal rows ------------------------------
#: the random changes of the crash scenario (:func:`keyless.random_change`), run by writers on the
#: emulator's backing database; one of several equal rows is picked by ``ctid``
CHANGES = keyless.ChangeSql(
    copy_row="INSERT INTO dbo.ev SELECT grp, val, qty, note FROM dbo.ev WHERE grp = %s LIMIT 1",
    insert_new="INSERT INTO dbo.ev VALUES (%s, 'new', 0, NULL)",
    delete_one=f"DELETE FROM dbo.ev WHERE ctid = {ONE.format(t='ev', where='grp = %s')}",
    bump_one=f"UPDATE dbo.ev SET qty = qty + 1 WHERE ctid = {ONE.format(t='ev', where='grp = %s')}",
    extend_val="UPDATE dbo.ev SET val = val || '+' WHERE grp = %s AND qty = %s",
    delete_nulls="DELETE FROM dbo.ev WHERE grp = %s AND note IS NULL",
    touch_keyed="UPDATE dbo.keyed SET v = v || '!' WHERE id = %s",
    delete_keyed="DELETE FROM dbo.keyed WHERE id = %s",
)
RETRY = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
#: :data:`keyless.FAILPOINTS` with a rarer ``mid_window`` (it fires per staged transaction, and the
#: capture job's timer makes windows of many): kills also land in whole reads and after publishing
FAILPOINTS = "after_batch_write:0.25,after_state_commit:0.25,mid_window:0.005,whole_read:0.3"


def _agent(emu: SqlServerCdcEmulator, db: str, stop: threading.Event) -> None:
    """The SQL Server Agent's capture job, on a timer."""
    while not stop.wait(0.1):
        emu.run_capture_job(db)


def keyless_crash_runs(
    emu: SqlServerCdcEmulator, db: str, tmp_path: Path, seed: int = 7
) -> tuple[dict, CrashRuns]:
    """:func:`keyless.keyless_crash_runs` on SQL Server: ``ev`` (equal rows, no key) and ``keyed``,
    while the capture job runs on a timer and logs every other transaction's updates as deferred
    updates (a delete and an insert under one seqval)."""
    keyless_table(
        emu, db, "ev", [("grp", "int"), ("val", "nvarchar(40)"), ("qty", "int"), ("note", "nvarchar(5)")]
    )
    emu.create_table(db, "dbo.keyed", [("id", "int"), ("v", "nvarchar(200)")], primary_key=["id"])
    emu.enable_table(db, "dbo.keyed")
    write(
        emu, db,
        "INSERT INTO dbo.ev SELECT g % 300, 'v' || (g % 7), g % 3, CASE WHEN g % 11 = 0 THEN NULL ELSE 'n' END"
        " FROM generate_series(1, 3000) g",
        "INSERT INTO dbo.keyed SELECT g, 'k' || g FROM generate_series(1, 6000) g",
    )  # fmt: skip
    emu.db(db).capture.deferred = "mixed"
    config = config_for(emu, db, tmp_path / "staging", incremental__snapshot__chunk__size=1000,
                        snapshot__max__rows__per__run=3000)  # fmt: skip
    writers = keyless.KeylessWriters(lambda: emu.pg_connect(db), CHANGES, RETRY)
    writers.threads.append(threading.Thread(target=_agent, args=(emu, db, writers.stop), daemon=True))
    runs = keyless.keyless_crash_runs(
        config, tmp_path / "pipeline.json", writers, f"{db}.dbo.ev", seed, FAILPOINTS
    )
    emu.run_capture_job(db)
    run_capture(config)  # the changes the last run's window did not reach
    return config, runs


@pytest.mark.slow
def test_keyless_converges_with_sigkills(
    sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Path
):
    config, runs = keyless_crash_runs(sqlserver_emulator, mssql_db, tmp_path)
    ev, keyed = f"{mssql_db}.dbo.ev", f"{mssql_db}.dbo.keyed"
    keyless.assert_crash_runs_converged(config, runs, ev, keyed, source_multiset, source_rows)

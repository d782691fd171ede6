"""Tables without key columns read whole, positioned exactly in the log (their snapshots).

A table without key columns has no order to chunk by, and its rows cannot be reconciled with the
window by key: its snapshot is one read whose log position ``P`` is exact -- every change of the
table with a commit LSN at or below ``P`` is in the rows, none above it -- so its rows, staged at
``(P, MAX, MAX)``, need no reconciliation (:meth:`ChangeSource.read_whole`).

SQL Server reports no log position for a snapshot (a ``SNAPSHOT`` transaction is versioned by
transaction sequence numbers, not LSNs), and ``sys.fn_cdc_get_max_lsn()`` is the capture job's
progress, behind the log.  So the table is pinned instead, as Materialize's SQL Server source pins
it (``src/sql-server-util/src/cdc.rs``: lock, establish the snapshot and the LSN, unlock):

1. A second connection (the *fence*) takes a shared table lock held to the end of its transaction,
   ``SELECT TOP (0) * ... WITH (TABLOCK, HOLDLOCK)`` (Microsoft's *Table hints*,
   https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table).  It is granted
   once every transaction holding a write lock on the table has ended, and no transaction writes
   the table until it is released; readers are not blocked.  The wait for it is bounded by
   ``snapshot.lock.timeout.ms`` (error 1222 fails the run; nothing staged).
2. The reading connection starts its transaction: under ``snapshot.isolation.mode: snapshot`` a
   ``SNAPSHOT`` one, whose version of the data is fixed by its first read ("the XSN is assigned
   when the transaction first reads or writes data", not at ``BEGIN``: Microsoft's *Transaction
   locking and row versioning guide*,
   https://learn.microsoft.com/en-us/sql/relational-databases/sql-server-transaction-locking-and-row-versioning-guide):
   it reads one row of ``cdc.change_tables`` now, while the table is locked.  Otherwise a ``READ
   COMMITTED`` one that reads the rows while the fence holds the lock.
3. The fence reads ``sys.dm_db_log_stats(DB_ID()).log_end_lsn``, "the LSN of the last log record
   in the transaction log"
   (https://learn.microsoft.com/en-us/sql/relational-databases/system-dynamic-management-views/sys-dm-db-log-stats-transact-sql):
   every transaction that wrote the table committed before the lock was granted, so its commit
   record (a change row's ``__$start_lsn``, "LSN associated with the commit transaction") is at or
   below ``P``; every later one commits after the lock is released, above ``P``.  A database that
   allows delayed durability (``sys.databases.delayed_durability`` > 0) may not have written a
   committed transaction's log yet: ``sys.sp_flush_log`` ("hardening all previously committed
   delayed durable transactions",
   https://learn.microsoft.com/en-us/sql/relational-databases/system-stored-procedures/sys-sp-flush-log-transact-sql)
   runs first.  The view needs ``VIEW SERVER STATE`` (its *Permissions*): without it the read is
   refused (``MissingPrivilege``); a readable secondary reports no LSN (``ServerMisconfigured``).
4. ``SNAPSHOT``: the fence rolls back (writers go on) and the rows are read in the snapshot, which
   holds exactly the transactions below ``P``.  Otherwise the rows are read first and the fence
   rolls back after them: writers of the table wait for the whole read.  The rows are streamed
   from the server (``fetchmany``) into the batch.

``P`` may be above the window the batch holds: the capture job fills change tables behind the
log.  That is what the contract allows (an applier skips a keyless table's events at or below what
it holds by position): the window's changes of the table below ``P`` are in the rows, and a later
window's are skipped.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.errors import MissingPrivilege, ServerMisconfigured
from airflow_cdc.core.events import now_us
from airflow_cdc.core.failpoints import failpoint
from airflow_cdc.core.progress import Progress
from airflow_cdc.core.snapshot import TableSnapshot
from airflow_cdc.sources.sqlserver import client, sql
from airflow_cdc.sources.sqlserver.offsets import SqlServerLsn, SqlServerPosition
from airflow_cdc.sources.sqlserver.schema import CaptureInstance

if TYPE_CHECKING:
    from airflow_cdc.sources.sqlserver.source import SqlServerSource

log = logging.getLogger(__name__)

#: rows fetched from the server at a time
FETCH_ROWS = 2048
#: SQL Server's errors for a missing server-level permission (as in :mod:`.checks`)
_NO_SERVER_STATE = re.compile(r"\((?:297|300)\)")


def read_whole(source: SqlServerSource, snap: TableSnapshot, writer: BatchWriter) -> int:
    """Stage the table of ``snap`` (without key columns) whole at its exact log position, after a
    truncate there when silver mirrors it (``keyless: multiset``); returns the rows staged.
    Repeating it stages the table again, at a new position.

    :raises MissingPrivilege: the login may not read ``sys.dm_db_log_stats`` (VIEW SERVER STATE).
    :raises ServerMisconfigured: the server reports no log end (a readable secondary).
    :raises pyodbc.Error: the table lock timed out (error 1222) or the read failed; rolled back.
    """
    state = source.table_state(snap.table)
    with pinned(source, state.instance) as (cur, end):
        position = SqlServerPosition.snapshot_at(source.epoch, end).sort_key()
        sink = state.sink(writer, "snapshot")
        src = (now_us() // 1000, None, str(end), None)
        if state.keyless == "multiset":  # the image replaces silver's multiset
            sink.append("t", None, None, position, src)
        progress = Progress(f"snapshot of {snap.table} (whole)", None)
        rows = 0
        for batch in _rows(cur, state.instance, FETCH_ROWS):
            for row in batch:
                sink.append("r", None, row, position, src)
            rows += len(batch)
            progress.update(rows)
            if rows == len(batch):
                failpoint("whole_read")  # crash tests: a table read whole, part of it staged
        progress.finish(rows)
    log.info("snapshot of %s read whole at log position %s (the log's end, table pinned)", snap.table, end)
    return rows


def encoded_whole(source: SqlServerSource, table: str, chunk_size: int) -> Iterator[pa.Table]:
    """The live table without key columns (``verify``), in no order, at most ``chunk_size`` rows
    at a time, encoded like captured rows: one image of the table, read as a snapshot is (see the
    module notes).  Writes nothing; closing the iterator ends the read."""
    state = source.table_state(table)
    keep, codecs = state.select, state.codecs
    schema = pa.schema([codecs[i].field for i in keep])
    with pinned(source, state.instance) as (cur, _):
        for batch in _rows(cur, state.instance, max(1, min(chunk_size, FETCH_ROWS))):
            yield pa.Table.from_arrays(
                [codecs[i].convert_values([r[i] for r in batch]) for i in keep], schema=schema
            )


@contextmanager
def pinned(source: SqlServerSource, ci: CaptureInstance) -> Iterator[tuple[Any, SqlServerLsn]]:
    """``(cursor, P)``: a cursor of the source's connection inside a transaction that reads the
    table as it is at log position ``P`` (steps 1 to 4 of the module notes); committed when the
    block ends, rolled back (and the fence released) when it raises."""
    snapshot = source.config["snapshot.isolation.mode"] == "snapshot"
    fence = client.connect(source.config, source.database)
    cur = source.conn.cursor()
    try:
        fenced = fence.cursor()
        fenced.execute(sql.lock_timeout(source.config["snapshot.lock.timeout.ms"]))
        fenced.execute(sql.BEGIN)
        fenced.execute(sql.table_share_lock(ci.database, ci.schema, ci.table)).fetchall()
        cur.execute(sql.ISOLATION["snapshot" if snapshot else "read_committed"])
        cur.execute(sql.BEGIN)
        try:
            if snapshot:  # the snapshot's version is fixed by its first read: now, while locked
                cur.execute(sql.first_read(ci.database)).fetchall()
            end = _log_end(fenced, ci.database, ci.table_id)
            if snapshot:  # writers go on; the snapshot keeps its version
                fenced.execute(sql.ROLLBACK)
            yield cur, end
            cur.execute(sql.COMMIT)
        except BaseException:  # GeneratorExit too: a reader stopped early
            with contextlib.suppress(Exception):  # the read's own error is the one to see
                cur.execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION")
            raise
    finally:
        with contextlib.suppress(Exception):
            cur.execute(sql.SESSION_ISOLATION)
        cur.close()
        with contextlib.suppress(Exception):  # the lock ends with the fence's transaction
            fence.cursor().execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION")
        fence.close()


def _rows(cur: Any, ci: CaptureInstance, size: int) -> Iterator[list[tuple]]:
    """Every row of the table in pieces of ``size``, computed columns NULL as in every change-table
    row (and in chunk rows)."""
    computed = [n for n, c in enumerate(ci.columns) if c.computed]
    cur.execute(sql.whole_select(ci.database, ci.schema, ci.table, [c.name for c in ci.columns]))
    while batch := cur.fetchmany(size):
        yield [tuple(None if i in computed else v for i, v in enumerate(raw)) for raw in batch]


def _log_end(cur: Any, database: str, table: str) -> SqlServerLsn:
    """The log's end now, after hardening delayed durable commits where the database allows them.

    :raises MissingPrivilege: no VIEW SERVER STATE.
    :raises ServerMisconfigured: no LSN reported (a readable secondary), or not in LSN form.
    """
    try:
        text, delayed = cur.execute(sql.LOG_END, database).fetchall()[0]
        if delayed:
            cur.execute(sql.FLUSH_LOG)
            text = cur.execute(sql.LOG_END, database).fetchall()[0][0]
    except Exception as e:
        if not _NO_SERVER_STATE.search(str(e)):
            raise
        raise MissingPrivilege(
            f"the snapshot of {table} (no key columns) is positioned at the log's end, which "
            f"sys.dm_db_log_stats reports only to logins with VIEW SERVER STATE: {e}",
            hint="GRANT VIEW SERVER STATE TO <connector login>, or give the table key columns "
            "(a primary key, @index_name, or message.key.columns)",
        ) from e
    try:
        return SqlServerLsn.parse(text)
    except ValueError as e:
        raise ServerMisconfigured(
            f"the snapshot of {table} (no key columns) needs the log's end LSN, and "
            f"sys.dm_db_log_stats reported {text!r} for database {database} (a readable secondary "
            "reports none)",
            hint="capture from the primary replica, or give the table key columns "
            "(a primary key, @index_name, or message.key.columns)",
        ) from e

"""Tables read whole at an exact WAL position: snapshots of tables without key columns, and
blocking snapshots (``execute-snapshot`` with ``"type": "blocking"``) of any table.

A temporary logical slot is created on a ``replication=database`` connection with
``EXPORT_SNAPSHOT``: PostgreSQL returns the slot's consistent point ``C`` and a snapshot that sees
exactly the transactions a slot starting at ``C`` does not decode -- those whose commit record
starts below ``C`` (``SnapBuildXactNeedsSkip``).  Our positions order events by that commit record
LSN (``PgPosition``), so rows read in that snapshot and positioned at ``(epoch, C, 0)`` sit after
every event they contain and before every event they lack: the image needs no reconciliation with
the window, and no transaction is applied twice or lost.  The table is read in one ``REPEATABLE
READ`` transaction that imports the snapshot, by one ``COPY`` streamed into the batch in pieces.
The temporary slot goes with the replication connection, right after the import.

Creating a slot waits for the transactions running at that moment to end (as creating the
connector's own slot does) and needs a free ``max_replication_slots`` entry and walsender.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import psycopg
from psycopg import pq, sql
from psycopg.conninfo import make_conninfo

from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.conditions import RAW_SQL_PROPERTY, condition_pieces
from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import ServerMisconfigured
from airflow_cdc.core.failpoints import failpoint
from airflow_cdc.core.progress import Progress
from airflow_cdc.core.snapshot import TableSnapshot
from airflow_cdc.sources.postgres import client, copyread
from airflow_cdc.sources.postgres import sql as q
from airflow_cdc.sources.postgres.position import PgPosition, parse_pg_lsn

if TYPE_CHECKING:
    from airflow_cdc.sources.postgres.source import PostgresSource

log = logging.getLogger(__name__)

#: value bytes per piece staged from the COPY (bounds the memory a table of any size needs)
PIECE_BYTES = 16 << 20


@contextmanager
def exported_snapshot(config: ConnectorConfig) -> Iterator[tuple[str, int]]:
    """A snapshot exported by a temporary logical slot: ``(snapshot name, consistent point)``.

    Valid until the context ends (the replication connection closes, dropping the slot): import
    it (``SET TRANSACTION SNAPSHOT``) inside the context.

    :raises ServerMisconfigured: the slot cannot be created (no free slot or walsender, ...).
    """
    params = client.connect_params(config, "airflow-cdc")
    conninfo = make_conninfo("", **params, options=q.SESSION_OPTIONS, replication="database")
    pg = pq.PGconn.connect(conninfo.encode())
    try:
        if pg.status != pq.ConnStatus.OK:
            client.raise_connect_error(config, psycopg.OperationalError(pg.get_error_message()))
        name = f"airflow_cdc_whole_{os.getpid()}_{secrets.token_hex(4)}"
        res = pg.exec_(f"CREATE_REPLICATION_SLOT {name} TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT".encode())
        if res.status != pq.ExecStatus.TUPLES_OK:
            text = (res.error_message or b"").decode(errors="replace").strip()
            raise ServerMisconfigured(
                f"cannot create the temporary replication slot a snapshot of a table without key "
                f"columns is read with: {text}",
                hint="raise max_replication_slots and max_wal_senders, or give the table a key "
                "(primary key, or message.key.columns)",
            )
        consistent, snapshot = (res.get_value(0, i) or b"" for i in (1, 2))
        yield snapshot.decode(), parse_pg_lsn(consistent.decode())
    finally:
        pg.finish()


def read_whole(source: PostgresSource, snap: TableSnapshot, writer: BatchWriter) -> int:
    """Stage ``snap``'s table whole at its exported snapshot's position (see the module notes);
    returns the rows.  A table mirrored as a multiset gets a truncate at that position first; a
    keyed table (a blocking snapshot) none, and only its rows matching ``snap.condition``.

    :raises ServerMisconfigured: see :func:`exported_snapshot`.
    """
    conn = source.conn
    assert conn is not None
    state = source.table_state(snap.table)
    tid, oid = source._tables[snap.table]
    meta = source.catalog.table_meta(tid, oid, source.filters)
    columns = [c.name for c in meta.columns]
    # a keyed table is read whole by a blocking snapshot: its override statement and its
    # additional-conditions filter apply (a keyless table takes neither: its image replaces silver)
    relation = source._snapshot_relation(snap.table, snap.origin) if state.key_columns else None
    pieces = condition_pieces(snap.table, snap.condition, columns, source.config[RAW_SQL_PROPERTY])
    where = sql.SQL(" WHERE {}").format(q.user_condition(pieces)) if pieces else sql.SQL("")

    def statement(fmt: str) -> sql.Composed:
        query = sql.SQL("SELECT {} FROM {}{}").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in columns),
            q.qualified(tid.schema, tid.table) if relation is None else relation,
            where,
        )
        return sql.SQL("COPY ({}) TO STDOUT (FORMAT {})").format(query, sql.SQL(fmt))

    rows = 0
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        with exported_snapshot(source.config) as (name, consistent):
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(name)))
        # the slot is gone; the transaction keeps the snapshot it imported
        position = PgPosition(source.epoch, consistent, 0).sort_key()
        sink = source._snapshot_sink(writer, snap.table)
        ts = time.time_ns() // 1000
        src = (ts // 1000, ts, ts * 1000, None, None, consistent)
        if state.keyless == "multiset":
            sink.append("t", None, None, position, src)
        progress = Progress(f"snapshot of {snap.table} (whole)", _estimate(conn, oid))
        for piece in copyread.iter_table(conn, statement, len(columns), PIECE_BYTES):
            sink.write_columnar("r", [piece.column(i) for i in range(piece.num_columns)], position, src)
            rows += piece.num_rows
            progress.update(rows, rows)
            failpoint("whole_read")  # crash tests: a table read whole, part of it staged
        progress.finish(rows)
    return rows


def _estimate(conn: psycopg.Connection, oid: int) -> int | None:
    """The planner's row estimate of a table (None: never analysed)."""
    row = conn.execute("SELECT reltuples::int8 FROM pg_class WHERE oid = %s", (oid,)).fetchone()
    return int(row[0]) if row and row[0] is not None and row[0] >= 0 else None

"""Tables read whole at an exact binlog coordinate: snapshots of tables without key columns, and
blocking snapshots (``execute-snapshot`` with ``"type": "blocking"``) of any table.

The table is read in one ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` whose binlog coordinate
``C`` is exact: MariaDB reports it without locks (``binlog_snapshot_file/position``: the end of the
last transaction the snapshot contains); on MySQL, which has no such status, the snapshot is
started under ``FLUSH TABLES WITH READ LOCK`` -- held only while the snapshot starts and the
binlog head is read, as ``mysqldump --single-transaction --source-data`` does (RELOAD privilege).
Every transaction whose events start below ``C`` is in the rows, none at or above it, so rows
positioned at ``(epoch, C, 0)`` need no reconciliation with the window (``MySqlPosition``: a rows
event's position is where it starts).  Rows stream from the server (an unbuffered cursor) into
the batch in pieces.

A coordinate below the window start (a transaction logged but not yet committed by the engine:
semi-synchronous replication) would put rows below events the batch before already applied: such
a read is started again until the snapshot reaches the window start.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pymysql
import pymysql.cursors

from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.conditions import RAW_SQL_PROPERTY, condition_pieces
from airflow_cdc.core.errors import MissingPrivilege
from airflow_cdc.core.failpoints import failpoint
from airflow_cdc.core.progress import Progress
from airflow_cdc.core.snapshot import TableSnapshot, read_when_visible
from airflow_cdc.sources.mysql import client, snapshot
from airflow_cdc.sources.mysql import sql as q
from airflow_cdc.sources.mysql.chunk_keys import SESSION_SQL
from airflow_cdc.sources.mysql.position import MySqlPosition

if TYPE_CHECKING:
    from airflow_cdc.sources.mysql.source import MySqlSource

log = logging.getLogger(__name__)

#: rows fetched from the server at a time
FETCH_ROWS = 2048


def read_whole(source: MySqlSource, snap: TableSnapshot, writer: BatchWriter) -> int:
    """Stage ``snap``'s table whole at its consistent snapshot's binlog coordinate (see the module
    notes), after a truncate there for a table without key columns (a keyed table, read by a
    blocking snapshot, gets none and only its rows matching ``snap.condition``); returns the rows.

    :raises MissingPrivilege: MySQL without the RELOAD privilege the read lock needs.
    :raises ServerMisconfigured: the snapshot stayed below the window start (semi-sync).
    """
    start = client.coordinate(source._start[0], source._start[1]) if source._start[0] else 0
    conn = source.conn
    tdef = source._tables[snap.table]
    with conn.cursor(pymysql.cursors.SSCursor) as cur:
        cur.execute(SESSION_SQL)
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")

        def attempt() -> tuple[int | None, str]:
            coord = _begin(cur, source)
            if coord >= start:
                return coord, ""
            cur.execute("ROLLBACK")
            return (
                None,
                f"the consistent snapshot stayed at binlog coordinate {coord:#x}, below the window start",
            )

        coord = read_when_visible(
            snap.table,
            attempt,
            "transactions are logged but not committed: check semi-synchronous replication",
        )
        try:
            return _stage(source, snap, writer, cur, tdef, coord)
        finally:
            cur.execute("COMMIT")


def _begin(cur: Any, source: MySqlSource) -> int:
    """Start the consistent snapshot; returns its binlog coordinate."""
    watermark = source.flavour.snapshot_watermark_sql()
    if watermark is not None:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        cur.execute(watermark)
        status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
        return client.coordinate(status["binlog_snapshot_file"], int(status["binlog_snapshot_position"]))
    try:
        cur.execute("FLUSH TABLES WITH READ LOCK")
    except pymysql.err.OperationalError as e:
        raise MissingPrivilege(
            f"a snapshot of a table without key columns needs FLUSH TABLES WITH READ LOCK on MySQL: {e}",
            hint="GRANT RELOAD ON *.* TO <connector user>, or give the table a key (message.key.columns)",
        ) from e
    try:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        cur.execute(source.flavour.status_sql)
        head = cur.fetchone()
        while cur.fetchone() is not None:  # an unbuffered cursor reads its result to the end
            pass
    finally:
        cur.execute("UNLOCK TABLES")
    return client.coordinate(str(head[0]), int(head[1]))


def _select(source: MySqlSource, snap: TableSnapshot, tdef: Any, keyed: bool) -> tuple[str, list | None]:
    """The whole-table query and its parameters: a keyed table (a blocking snapshot) reads its
    override statement and its ``additional-conditions`` filter, a keyless table neither."""
    select = ", ".join(snapshot.select_expr(c) for c in tdef.columns)
    relation = source._snapshot_relation(snap.table, snap.origin) if keyed else None
    query = f"SELECT {select} FROM {relation or q.qualified(tdef.db, tdef.table)}"  # noqa: S608 - quoted
    names = [c.name for c in tdef.columns]
    pieces = condition_pieces(snap.table, snap.condition, names, source.config[RAW_SQL_PROPERTY])
    if not pieces:
        return query, None
    where, args = q.condition_sql(pieces)  # literals bound: the rest of the text escapes its %
    return f"{query.replace('%', '%%')} WHERE {where}", args


def _stage(
    source: MySqlSource, snap: TableSnapshot, writer: BatchWriter, cur: Any, tdef: Any, coord: int
) -> int:
    position = MySqlPosition(source.epoch, coord >> 32, coord & 0xFFFFFFFF, 0).sort_key()
    sink = source._snapshot_sink(writer, snap.table)
    src = source._snapshot_source(coord)
    keyed = bool(source.table_state(snap.table).key_columns)
    if not keyed:  # the image replaces silver's multiset; a keyed table's rows are re-read only
        sink.append("t", None, None, position, src)
    columns = tdef.columns
    cur.execute(*_select(source, snap, tdef, keyed))
    progress = Progress(f"snapshot of {snap.table} (whole)", None)
    rows = 0
    while batch := cur.fetchmany(FETCH_ROWS):
        for raw in batch:
            sink.append(
                "r",
                None,
                tuple(snapshot.neutral(c, v) for c, v in zip(columns, raw, strict=True)),
                position,
                src,
            )
        rows += len(batch)
        progress.update(rows)
        if rows == len(batch):
            failpoint("whole_read")  # crash tests: a table read whole, part of it staged
    progress.finish(rows)
    return rows

"""Snapshot chunks: key-ordered reads under a consistent snapshot, in neutral values.

Each chunk runs in its own ``START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY`` (REPEATABLE READ).
On MariaDB, ``binlog_snapshot_file/position`` read inside it is the exact binlog coordinate of
that snapshot: a transaction is reflected by the chunk iff it starts below it.  MySQL has no
such status; its chunks are reflected by no transaction of the window (every chunk row touched
in the window is dropped, the log version wins), which is exact with full row images.
Values are read as text (no driver conversions) and turned into the same neutral forms the
binlog decoder produces, so tracker keys and codecs are shared.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pymysql

from airflow_cdc.core.conditions import Piece
from airflow_cdc.core.snapshot import ChunkRead, TableSnapshot
from airflow_cdc.sources.mysql import chunk_keys as ck
from airflow_cdc.sources.mysql import client
from airflow_cdc.sources.mysql import sql as q
from airflow_cdc.sources.mysql.schema import ColumnDef, TableDef
from airflow_cdc.sources.mysql.types import key_text

log = logging.getLogger(__name__)
_INTS = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint", "year"})


@dataclass(frozen=True)
class Watermark:
    """``coord``: binlog coordinate of the chunk's snapshot (None: unknown, MySQL);
    ``lsn_after``: a coordinate the window must reach to hold every transaction the chunk saw."""

    coord: int | None
    lsn_after: int


@dataclass
class MySqlChunk(ChunkRead):
    rows: list[tuple] = field(default_factory=list)
    #: (name, declared type) of the columns the rows hold, when read by another process (parts)
    structure: list[list[str]] | None = None


def select_expr(col: ColumnDef) -> str:
    name = q.ident(col.name)
    if col.data_type in ("enum", "set", "bit"):
        return f"{name} + 0"
    if col.data_type == "timestamp":
        return f"UNIX_TIMESTAMP({name})"
    if col.data_type in ck.CHARS and col.charset not in (None, "binary"):
        # the stored bytes, as the binlog carries them: tracker keys and values then agree for
        # every character set (the connection's utf8mb4 would re-encode latin1 & co.)
        return f"CAST({name} AS BINARY)"
    if col.data_type == "float":
        # FLOAT prints with 6 significant digits; as a DOUBLE it prints the stored value exactly,
        # which is what the binlog carries
        return f"{name} + 0e0"
    return name


def _micros_of(text: str) -> tuple[str, int]:
    whole, _, frac = text.partition(".")
    return whole, int((frac + "000000")[:6]) if frac else 0


def neutral(col: ColumnDef, v: Any) -> Any:
    """The binlog decoder's neutral value of one text value read by SQL."""
    if v is None:
        return None
    t = col.data_type
    if t in _INTS or t in ("enum", "set", "bit"):
        return int(v)
    if t in ("float", "double", "real"):
        return float(v)
    if t == "date":
        y, m, d = (int(x) for x in v.split("-"))
        return y << 9 | m << 5 | d
    if t == "datetime":
        whole, micros = _micros_of(v)
        digits = whole.replace("-", "").replace(":", "").replace(" ", "")
        return int(digits) * 1_000_000 + micros
    if t == "timestamp":
        whole, micros = _micros_of(v)
        return int(whole) * 1_000_000 + micros
    if t == "time":
        sign = -1 if v.startswith("-") else 1
        whole, micros = _micros_of(v.lstrip("-"))
        h, m, s = (int(x) for x in whole.split(":"))
        return sign * (((h * 60 + m) * 60 + s) * 1_000_000 + micros)
    return v


def _restart_old_cursor(snap: TableSnapshot, cursor: list | None) -> list | None:
    """A cursor stored by an older version (neutral values, not comparable by the server): restart
    the table's snapshot from its first row -- rows are emitted again, never skipped."""
    if snap.cursor_format == ck.CURSOR_FORMAT:
        return cursor
    if snap.last_key is not None or snap.max_key is not None:
        log.warning(
            "snapshot of %s: its stored chunk cursor has an older format (%s) that the server cannot "
            "compare exactly; restarting this table's snapshot from its first row (%d rows already "
            "emitted are emitted again)",
            snap.table,
            snap.cursor_format,
            snap.rows,
        )
        snap.last_key = snap.max_key = None
        cursor = None
    snap.cursor_format = ck.CURSOR_FORMAT
    return cursor


def read_chunk(
    conn: Any,
    snapshot_sql: str | None,
    tdef: TableDef,
    snap: TableSnapshot,
    cursor: list | None,
    key: list[str],
    limit: int,
    status_sql: str,
    condition: list[Piece] | None = None,
    relation: str | None = None,
) -> MySqlChunk:
    """Read one chunk of ``snap`` after ``cursor`` in a consistent snapshot of its own.

    Ordered by a key that may repeat (a surrogate key, NULLs in ``message.key.columns``), a full
    chunk is re-read up to and including its last cursor value, so a run of equal values never
    straddles two chunks.

    ``condition``: the ad hoc snapshot's additional condition
    (:func:`airflow_cdc.core.conditions.condition_pieces`); ``relation``: what is read instead of
    the table (a ``snapshot.select.statement.overrides`` statement, :func:`sql.override_relation`).

    :raises UnsupportedType: a chunking column has no exact order (nothing is read).
    """
    order = [snap.surrogate_key] if snap.surrogate_key else key
    with conn.cursor() as cur:
        collations = ck.read_collations(cur, tdef) if ck.needs_collations(tdef, order) else {}
        keys = ck.key_columns(tdef, order, collations)
        cursor = _restart_old_cursor(snap, cursor)
        cur.execute(ck.SESSION_SQL)
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        try:
            coord = None
            if snapshot_sql is not None:
                cur.execute(snapshot_sql)
                status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
                coord = client.coordinate(
                    status["binlog_snapshot_file"], int(status["binlog_snapshot_position"])
                )
            if snap.max_key is None:
                cursors = [k.cursor for k in keys]
                cur.execute(*q.max_key(tdef.db, tdef.table, cursors, order, condition, relation))
                row = cur.fetchone()
                snap.max_key = [None if v is None else str(v) for v in row] if row else []
            rows: list[tuple] = []
            if snap.max_key:
                rows = _select(cur, tdef, keys, cursor, snap.max_key, (condition, relation), limit)
                if len(rows) == limit and order != tdef.key:
                    upto = _cursor_of(rows[-1], keys)
                    rows = _select(cur, tdef, keys, cursor, upto, (condition, relation), None)
            lsn_after = coord
            if coord is None:
                cur.execute(status_sql)
                head = cur.fetchone()
                lsn_after = client.coordinate(str(head[0]), int(head[1]))
        finally:
            cur.execute("COMMIT")
    return _chunk(snap, tdef, key, rows, limit, Watermark(coord, lsn_after or 0))


def _cursor_of(row: tuple, keys: list[ck.KeyColumn]) -> list[str | None]:
    return [None if v is None else str(v) for v in row[len(row) - len(keys) :]]


def _select(
    cur: Any,
    tdef: TableDef,
    keys: list[ck.KeyColumn],
    after: list | None,
    upto: list,
    filters: tuple[list[Piece] | None, str | None],
    limit: int | None,
) -> list[tuple]:
    """Rows after ``after`` up to ``upto`` (cursor texts): table columns then cursor texts.
    ``filters``: the additional condition and the relation read instead of the table."""
    condition, relation = filters
    upper, args = ck.bound(keys, upto, "<=")
    where = [upper]
    if after is not None:
        lower, more = ck.bound(keys, after, ">")
        where.append(lower)
        args += more
    select = [select_expr(c) for c in tdef.columns] + [k.cursor for k in keys]
    if condition:
        text, more = q.condition_sql(condition)
        where.append(text)
        args += more
    cur.execute(q.chunk(tdef.db, tdef.table, select, [k.name for k in keys], where, limit, relation), args)
    return list(cur.fetchall())


def _tracker_text(value: Any, fixed_binary: bool) -> str | None:
    """A key value as the binlog decoder's key text: the binlog drops a BINARY(n) value's
    trailing zero bytes (the codec pads them back), so the tracker compares without them."""
    if fixed_binary and isinstance(value, bytes):
        value = value.rstrip(b"\0")
    return key_text(value)


def _chunk(
    snap: TableSnapshot,
    tdef: TableDef,
    key: list[str],
    raw: list[tuple],
    limit: int,
    watermark: Watermark,
) -> MySqlChunk:
    names = [c.name for c in tdef.columns]
    ncols = len(names)
    rows = [tuple(neutral(c, v) for c, v in zip(tdef.columns, r[:ncols], strict=True)) for r in raw]
    cols = {c.name: (names.index(c.name), c.data_type == "binary") for c in tdef.columns}
    data = {c: pa.array([_tracker_text(r[cols[c][0]], cols[c][1]) for r in rows], pa.string()) for c in key}
    ncursor = len(raw[0]) - ncols if raw else len(snap.max_key or [])
    for i in range(ncursor):
        data[f"__cursor{i}"] = pa.array(
            [None if r[ncols + i] is None else str(r[ncols + i]) for r in raw], pa.string()
        )
    data["__row"] = pa.array(range(len(rows)), pa.int64())
    table = pa.table(data)
    columns = list(data)
    key_index = list(range(len(key)))
    cursor_index = [columns.index(f"__cursor{i}") for i in range(ncursor)]
    chunk = MySqlChunk(snap, columns, table, key_index, watermark, False, cursor_index, rows)
    last_cursor = chunk.next_cursor() if rows else None
    chunk.last = not snap.max_key or len(rows) < limit or last_cursor == snap.max_key
    return chunk


def is_missing_column(e: Exception) -> bool:
    """A chunk read raced with a DDL (unknown column / table definition changed)."""
    return isinstance(e, pymysql.err.MySQLError) and bool(e.args) and e.args[0] in (1054, 1412, 1146)

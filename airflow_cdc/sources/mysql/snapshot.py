"""Snapshot chunks: key-ordered reads under a consistent snapshot, in neutral values.

Each chunk runs in its own ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` (REPEATABLE READ).
On MariaDB, ``binlog_snapshot_file/position`` read inside it is the exact binlog coordinate of
that snapshot: a transaction is reflected by the chunk iff it starts below it.  MySQL has no
such status; its chunks are reflected by no transaction of the window (every chunk row touched
in the window is dropped, the log version wins), which is exact with full row images.
Values are read as text (no driver conversions) and turned into the same neutral forms the
binlog decoder produces, so tracker keys and codecs are shared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pymysql

from airflow_cdc.core.snapshot import ChunkRead, TableSnapshot
from airflow_cdc.sources.mysql import client
from airflow_cdc.sources.mysql import sql as q
from airflow_cdc.sources.mysql.schema import ColumnDef, TableDef
from airflow_cdc.sources.mysql.types import key_text

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


def select_expr(col: ColumnDef) -> str:
    name = q.ident(col.name)
    if col.data_type in ("enum", "set", "bit"):
        return f"{name} + 0"
    if col.data_type == "timestamp":
        return f"UNIX_TIMESTAMP({name})"
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


def _bind(col: ColumnDef, text: str | None) -> Any:
    if text is None:
        return None
    return int(text) if col.data_type in _INTS else text


def read_chunk(
    conn: Any,
    snapshot_sql: str | None,
    tdef: TableDef,
    snap: TableSnapshot,
    cursor: list | None,
    key: list[str],
    limit: int,
    status_sql: str,
) -> MySqlChunk:
    """Read one chunk of ``snap`` after ``cursor`` in a consistent snapshot of its own."""
    cols = {c.name: c for c in tdef.columns}
    order = [snap.surrogate_key] if snap.surrogate_key else key
    with conn.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        try:
            coord = None
            if snapshot_sql is not None:
                cur.execute(snapshot_sql)
                status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
                coord = client.coordinate(
                    status["binlog_snapshot_file"], int(status["binlog_snapshot_position"])
                )
            if snap.max_key is None:
                cur.execute(q.max_key(tdef.db, tdef.table, order, snap.condition))
                row = cur.fetchone()
                snap.max_key = (
                    [key_text(neutral(cols[c], v)) for c, v in zip(order, row, strict=True)] if row else []
                )
            rows: list[tuple] = []
            if snap.max_key:
                args = [_bind(cols[c], v) for c, v in zip(order, snap.max_key, strict=True)]
                if cursor is not None:
                    args += [_bind(cols[c], v) for c, v in zip(order, cursor, strict=True)]
                cur.execute(
                    q.chunk(
                        tdef.db,
                        tdef.table,
                        [select_expr(c) for c in tdef.columns],
                        order,
                        cursor is not None,
                        snap.condition,
                        limit,
                    ),
                    args,
                )
                rows = [
                    tuple(neutral(c, v) for c, v in zip(tdef.columns, r, strict=True)) for r in cur.fetchall()
                ]
            after_sql = status_sql if coord is None else None
            lsn_after = coord
            if after_sql is not None:
                cur.execute(after_sql)
                head = cur.fetchone()
                lsn_after = client.coordinate(str(head[0]), int(head[1]))
        finally:
            cur.execute("COMMIT")
    return _chunk(snap, tdef, key, order, rows, limit, Watermark(coord, lsn_after or 0))


def _chunk(
    snap: TableSnapshot,
    tdef: TableDef,
    key: list[str],
    order: list[str],
    rows: list[tuple],
    limit: int,
    watermark: Watermark,
) -> MySqlChunk:
    names = [c.name for c in tdef.columns]
    text_cols = list(dict.fromkeys(key + order))
    data = {c: pa.array([key_text(r[names.index(c)]) for r in rows], pa.string()) for c in text_cols}
    data["__row"] = pa.array(range(len(rows)), pa.int64())
    table = pa.table(data)
    key_index = [text_cols.index(k) for k in key]
    cursor_index = [text_cols.index(k) for k in order]
    chunk = MySqlChunk(snap, text_cols + ["__row"], table, key_index, watermark, False, cursor_index, rows)
    last_cursor = chunk.next_cursor() if rows else None
    chunk.last = not snap.max_key or len(rows) < limit or last_cursor == snap.max_key
    return chunk


def is_missing_column(e: Exception) -> bool:
    """A chunk read raced with a DDL (unknown column / table definition changed)."""
    return isinstance(e, pymysql.err.MySQLError) and bool(e.args) and e.args[0] in (1054, 1412, 1146)

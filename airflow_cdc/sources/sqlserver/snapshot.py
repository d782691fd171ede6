"""Snapshot chunk reads with LSN watermarks under ``snapshot.isolation.mode``.

A chunk is the next ``limit`` rows in key order after the last key read.  ``fn_cdc_get_max_lsn()``
is read before and after it: changes committed up to the low watermark are in the chunk, changes
after the high watermark are not, and keys changed in between are dropped from the chunk (the
window's events carry them), as in Debezium's incremental snapshot.

Key values are bound as text for the temporal types: FreeTDS encodes some date parameters wrongly
(0001-01-01 as an invalid day, some pre-1900 dates a day early), and SQL Server converts the text
to the column's type exactly, 100 ns digits included.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_cdc.core.conditions import Piece
from airflow_cdc.sources.sqlserver import sql
from airflow_cdc.sources.sqlserver.client import scalar
from airflow_cdc.sources.sqlserver.offsets import SqlServerLsn
from airflow_cdc.sources.sqlserver.schema import Column

_EPOCH = dt.datetime(1970, 1, 1)


@dataclass
class Chunk:
    rows: list[tuple]
    low: SqlServerLsn
    high: SqlServerLsn
    last: bool  # fewer rows than asked: the table is done

    @property
    def last_key(self) -> tuple | None:
        return self.rows[-1] if self.rows else None


def read_chunk(
    conn: Any,
    isolation: str,
    target: tuple[str, str, str],
    columns: Sequence[Column],
    order: Sequence[str],
    after: Sequence[Any] | None,
    limit: int,
    condition: list[Piece] | None = None,
    unique: bool = True,
) -> Chunk:
    """Read one chunk of ``target`` (database, schema, table) between two watermarks.

    ``order`` is the key, or an ad hoc snapshot's surrogate key (``unique`` false: values may
    repeat, so a full chunk is re-read up to and including its last value and a run of equal values
    never straddles two chunks).  ``after`` holds the order values (as the client returns them) of
    the last row already read.  ``condition``: the additional condition
    (:func:`airflow_cdc.core.conditions.condition_pieces`).  A failed read rolls its transaction
    back and raises the driver's error; nothing is kept.
    """
    db, schema, table = target
    names = [c.name for c in columns]
    by_name = {c.name: c for c in columns}
    bound = (
        sql.chunk_params([key_param(by_name[k], v) for k, v in zip(order, after, strict=True)])
        if after
        else []
    )
    where, cond_args = sql.condition_sql(condition) if condition else (None, [])
    low = SqlServerLsn.of(scalar(conn, sql.MAX_LSN))
    cur = conn.cursor()
    try:
        cur.execute(sql.ISOLATION[isolation])
        cur.execute(sql.BEGIN)
        query = sql.chunk_select(db, schema, table, names, order, limit, after is not None, where)
        rows = [tuple(r) for r in cur.execute(query, *bound, *cond_args).fetchall()]
        if not unique and len(rows) == limit:
            last = key_param(by_name[order[0]], rows[-1][names.index(order[0])])
            query = sql.chunk_select(db, schema, table, names, order, None, after is not None, where, True)
            rows = [tuple(r) for r in cur.execute(query, *bound, last, *cond_args).fetchall()]
        cur.execute(sql.COMMIT)
    except Exception:
        cur.execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION")
        raise
    finally:
        cur.close()
    high = SqlServerLsn.of(scalar(conn, sql.MAX_LSN))
    return Chunk(rows, low, high, len(rows) < limit)


def key_param(col: Column, value: Any) -> Any:
    """A key value as a bound parameter: temporal values as SQL Server's literal text."""
    t = col.type_name.lower()
    if (
        value is None
        or isinstance(value, str)
        or t not in ("date", "time", "datetime", "smalldatetime", "datetime2", "datetimeoffset")
    ):
        return value
    if t == "date":
        return value.isoformat()
    if t == "time":  # nanoseconds since midnight
        seconds, ns = divmod(int(value), 10**9)
        return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{ns // 100:07d}"
    if t == "datetimeoffset":
        moment, extra = value
        off = int((moment.utcoffset() or dt.timedelta(0)).total_seconds()) // 60
        sign = "-" if off < 0 else "+"
        frac = f"{moment.microsecond * 10 + extra // 100:07d}"
        return f"{moment:%Y-%m-%d %H:%M:%S}.{frac} {sign}{abs(off) // 60:02d}:{abs(off) % 60:02d}"
    seconds, ns = divmod(int(value), 10**9)  # datetime types: nanoseconds since the epoch
    moment = _EPOCH + dt.timedelta(seconds=seconds)
    if t in ("datetime", "smalldatetime"):
        return f"{moment:%Y-%m-%d %H:%M:%S}.{ns // 10**6:03d}"
    return f"{moment:%Y-%m-%d %H:%M:%S}.{ns // 100:07d}"

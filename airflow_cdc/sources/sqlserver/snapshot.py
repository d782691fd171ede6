"""Snapshot chunk reads with LSN watermarks under ``snapshot.isolation.mode``.

A chunk is the next ``limit`` rows in key order after the last key read.  ``fn_cdc_get_max_lsn()``
is read before and after it: changes committed up to the low watermark are in the chunk, changes
after the high watermark are not, and keys changed in between are dropped from the chunk (the
window's events carry them), as in Debezium's incremental snapshot.

Each chunk is its own transaction, committed right after its ``SELECT``: the locks a mode takes
on SQL Server (shared row locks to the commit under ``repeatable_read``, plus an exclusive table
lock under ``exclusive``) keep the application's writers waiting for one chunk read at most.  The
default ``read_committed`` holds a row's shared lock only while reading it; the watermarks, not
the isolation level, make a chunk consistent with the stream (Debezium's incremental snapshot
reads its chunks at the connection's READ COMMITTED too).

Key values are bound as text for the temporal types: FreeTDS encodes some date parameters wrongly
(0001-01-01 as an invalid day, some pre-1900 dates a day early), and SQL Server converts the text
to the column's type exactly, 100 ns digits included.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from airflow_cdc.core.conditions import Piece
from airflow_cdc.sources.sqlserver import sql
from airflow_cdc.sources.sqlserver.client import scalar
from airflow_cdc.sources.sqlserver.offsets import SqlServerLsn
from airflow_cdc.sources.sqlserver.schema import Column

log = logging.getLogger(__name__)
T = TypeVar("T")
_EPOCH = dt.datetime(1970, 1, 1)
#: Debezium's ``snapshot.lock.timeout.ms`` default: how long a ``repeatable_read``/``exclusive``
#: chunk read waits for a lock (holding the ones it has) before failing with error 1222.
LOCK_TIMEOUT_MS = 10_000
_DEADLOCK_ATTEMPTS = 3
_ROLLBACK = "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION"


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
    lock_timeout_ms: int = LOCK_TIMEOUT_MS,
    relation: str | None = None,
) -> Chunk:
    """Read one chunk of ``target`` (database, schema, table) between two watermarks.

    ``order`` is the key, or an ad hoc snapshot's surrogate key (``unique`` false: values may
    repeat, so a full chunk is re-read up to and including its last value and a run of equal values
    never straddles two chunks).  ``after`` holds the order values (as the client returns them) of
    the last row already read.  ``condition``: the additional condition
    (:func:`airflow_cdc.core.conditions.condition_pieces`).  The chunk is one short transaction under
    ``isolation`` (:func:`_in_transaction`), so whatever the mode locks is held for one chunk read
    at most.  A deadlock victim (error 1205: SQL Server rolled the read back and asks to rerun it)
    is read again (three attempts in all); any other failure rolls back and raises the driver's
    error.  ``relation``: what is read instead of the table (a ``snapshot.select.statement.overrides``
    statement, :func:`sql.override_relation`).
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

    def read(cur: Any) -> list[tuple]:
        select = partial(sql.chunk_select, db, schema, table, names, order, relation=relation)
        query = select(limit, after is not None, where)
        rows = [tuple(r) for r in cur.execute(query, *bound, *cond_args).fetchall()]
        if not unique and len(rows) == limit:
            last = key_param(by_name[order[0]], rows[-1][names.index(order[0])])
            query = select(None, after is not None, where, True)
            rows = [tuple(r) for r in cur.execute(query, *bound, last, *cond_args).fetchall()]
        return rows

    low = SqlServerLsn.of(scalar(conn, sql.MAX_LSN))
    rows = _rerun_deadlocked(lambda: _in_transaction(conn, isolation, target, lock_timeout_ms, read), target)
    high = SqlServerLsn.of(scalar(conn, sql.MAX_LSN))
    return Chunk(rows, low, high, len(rows) < limit)


def _rerun_deadlocked(read: Callable[[], T], target: tuple[str, str, str]) -> T:
    """``read()``, again while SQL Server makes it a deadlock victim (error 1205, "Rerun the
    transaction"), at most :data:`_DEADLOCK_ATTEMPTS` times in all."""
    for attempt in range(1, _DEADLOCK_ATTEMPTS):
        try:
            return read()
        except Exception as e:
            if "(1205)" not in str(e):
                raise
            log.warning("snapshot chunk of %s.%s.%s: deadlock victim %d time(s) (%s)", *target, attempt, e)
    return read()


def _in_transaction(
    conn: Any, isolation: str, target: tuple[str, str, str], lock_timeout_ms: int, read: Callable[[Any], T]
) -> T:
    """Run ``read`` in a transaction of ``snapshot.isolation.mode`` ``isolation``, committed right
    after it; afterwards the connection is back at READ COMMITTED without a lock timeout.

    ``exclusive`` takes Debezium's exclusive table lock first; it and ``repeatable_read`` hold
    shared locks on what they read until the commit, so they wait at most ``lock_timeout_ms`` for a
    lock (error 1222) rather than letting writers queue behind them indefinitely.
    """
    holds = isolation in sql.LOCK_HOLDING
    cur = conn.cursor()
    try:
        try:
            cur.execute(sql.ISOLATION[isolation])
            if holds:
                cur.execute(sql.lock_timeout(lock_timeout_ms))
            cur.execute(sql.BEGIN)
            if isolation == "exclusive":
                cur.execute(sql.table_lock(*target)).fetchall()
            out = read(cur)
            cur.execute(sql.COMMIT)
        except Exception:
            with contextlib.suppress(Exception):  # the read's own error is the one to see
                cur.execute(_ROLLBACK)
                _reset(cur, isolation, holds)
            raise
        _reset(cur, isolation, holds)
        return out
    finally:
        cur.close()


def _reset(cur: Any, isolation: str, holds: bool) -> None:
    if isolation != "read_committed":
        cur.execute(sql.SESSION_ISOLATION)
    if holds:
        cur.execute(sql.lock_timeout(-1))


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

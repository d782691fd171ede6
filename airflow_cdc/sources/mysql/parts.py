"""Snapshot parts for MySQL/MariaDB: range boundaries, and chunks stored between tasks.

A part's chunks go to Parquet and back unchanged: the chunk's tracker table as is, and its rows
(the binlog decoder's neutral values: int, float, Decimal, str, bytes) as tagged text columns,
exact for every value (floats through their hex form).  See :mod:`airflow_cdc.core.snapshot_parts`.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa

from airflow_cdc.core.errors import SchemaError
from airflow_cdc.core.snapshot import TableSnapshot
from airflow_cdc.sources.mysql import chunk_keys as ck
from airflow_cdc.sources.mysql import snapshot
from airflow_cdc.sources.mysql import sql as q
from airflow_cdc.sources.mysql.schema import TableDef

_VALUE = "__value"


def bounds(
    conn: Any,
    tdef: TableDef,
    snap: TableSnapshot,
    key: list[str],
    offsets: list[int],
    condition: list[q.Piece] | None = None,
    relation: str | None = None,
) -> tuple[list, list]:
    """``max_key`` and the cursors ``offsets`` rows past ``snap.last_key``, in one consistent snapshot;
    ``relation``: what is read instead of the table (``snapshot.select.statement.overrides``).

    A snapshot whose stored cursor has an older format is not split (``[]`` bounds: capture restarts
    it itself).
    """
    if snap.cursor_format != ck.CURSOR_FORMAT and (snap.last_key is not None or snap.max_key is not None):
        return snap.max_key or [], []
    order = [snap.surrogate_key] if snap.surrogate_key else key
    out: list = []
    with conn.cursor() as cur:
        collations = ck.read_collations(cur, tdef) if ck.needs_collations(tdef, order) else {}
        keys = ck.key_columns(tdef, order, collations)
        cur.execute(ck.SESSION_SQL)
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        try:
            max_key = snap.max_key
            if max_key is None:
                cursors = [k.cursor for k in keys]
                query, params = q.max_key(tdef.db, tdef.table, cursors, order, condition, relation)
                cur.execute(query, params)
                row = cur.fetchone()
                max_key = [None if v is None else str(v) for v in row] if row else []
            for offset in offsets if max_key else []:
                upper, args = ck.bound(keys, max_key, "<=")
                where = [upper]
                if snap.last_key is not None:
                    lower, more = ck.bound(keys, snap.last_key, ">")
                    where.append(lower)
                    args += more
                if condition:
                    text, more = q.condition_sql(condition)
                    where.append(text)
                    args += more
                select = [k.cursor for k in keys]
                query = q.chunk(tdef.db, tdef.table, select, [k.name for k in keys], where, 1, relation)
                cur.execute(f"{query} OFFSET {int(offset)}", args)
                row = cur.fetchone()
                if row is None:
                    break
                out.append([None if v is None else str(v) for v in row])
        finally:
            cur.execute("COMMIT")
    return max_key, out


def _tag(value: Any, table: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return f"i:{int(value)}"
    if isinstance(value, int):
        return f"i:{value}"
    if isinstance(value, float):
        return f"f:{value.hex()}"
    if isinstance(value, Decimal):
        return f"d:{value}"
    if isinstance(value, str):
        return f"s:{value}"
    if isinstance(value, (bytes, bytearray)):
        return f"b:{bytes(value).hex()}"
    raise SchemaError(f"snapshot parts of {table}: a value of type {type(value).__name__} cannot be stored")


def _untag(text: str | None) -> Any:
    if text is None:
        return None
    kind, value = text[0], text[2:]
    if kind == "i":
        return int(value)
    if kind == "f":
        return float.fromhex(value)
    if kind == "d":
        return Decimal(value)
    if kind == "s":
        return value
    return bytes.fromhex(value)


def chunk_to_table(chunk: snapshot.MySqlChunk) -> tuple[pa.Table, int]:
    """The chunk's tracker table plus its rows as tagged text columns; returns (table, row width)."""
    width = len(chunk.rows[0]) if chunk.rows else 0
    table = chunk.data
    for i in range(width):
        values = [_tag(r[i], chunk.snapshot.table) for r in chunk.rows]
        table = table.append_column(f"{_VALUE}{i}", pa.array(values, pa.string()))
    return table, width


def rows_of(table: pa.Table, width: int) -> tuple[pa.Table, list[tuple]]:
    """Split what :func:`chunk_to_table` stored back into the tracker table and the rows."""
    data = table.select([n for n in table.column_names if not n.startswith(_VALUE)])
    cols = [[_untag(v) for v in table.column(f"{_VALUE}{i}").to_pylist()] for i in range(width)]
    return data, list(zip(*cols, strict=True))

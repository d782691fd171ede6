"""Read a live table, encoded exactly like captured rows (for ``verify``).

A keyed table is read in key order by the snapshot chunk reader (key-ordered ``COPY`` with
``LIMIT``); a table without key columns has no order to chunk by, so it is read by one ``COPY``
of the whole table in one ``REPEATABLE READ`` transaction (one consistent view), handed on in
pieces as it streams in.  No stored state is touched: nothing here writes to the server or the
state store.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from psycopg import sql

from airflow_cdc.core.snapshot import key_ordered_chunks
from airflow_cdc.sources.postgres import copyread
from airflow_cdc.sources.postgres import sql as q
from airflow_cdc.sources.postgres.source import PostgresSource
from airflow_cdc.sources.postgres.whole import PIECE_BYTES


def encoded_chunks(source: PostgresSource, table: str, chunk_size: int) -> Iterator[pa.Table]:
    """Yield the table's current rows, at most ``chunk_size`` at a time, as Arrow tables whose
    fields (with Connect metadata) are the captured columns: in key order, or for a table without
    key columns in no particular order (pieces of at most :data:`PIECE_BYTES` of values).
    ``source`` must be open."""
    state = source.table_state(table)
    schema = pa.schema([c.field for c in state.codecs])
    pieces = (
        _key_ordered(source, table, chunk_size) if state.key_columns else _whole(source, table, chunk_size)
    )
    for data in pieces:
        if data.num_rows:
            arrays = [
                codec.convert(data.column(i)) for codec, i in zip(state.codecs, state.select, strict=True)
            ]
            yield pa.Table.from_arrays(arrays, schema=schema)


def _key_ordered(source: PostgresSource, table: str, chunk_size: int) -> Iterator[pa.Table]:
    for chunk in key_ordered_chunks(source, table, chunk_size):
        yield chunk.data


def _whole(source: PostgresSource, table: str, chunk_size: int) -> Iterator[pa.Table]:
    """Every column of every row, in the table's order, from one ``COPY`` (stopped, if the caller
    stops early, by psycopg's cancel on leaving the copy)."""
    conn = source.conn
    assert conn is not None
    tid, oid = source._tables[table]
    names = [c.name for c in source.catalog.table_meta(tid, oid, source.filters).columns]
    select = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(sql.Identifier(n) for n in names), q.qualified(tid.schema, tid.table)
    )

    def statement(fmt: str) -> sql.Composed:
        return sql.SQL("COPY ({}) TO STDOUT (FORMAT {})").format(select, sql.SQL(fmt))

    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        for piece in copyread.iter_table(conn, statement, len(names), PIECE_BYTES):
            for start in range(0, piece.num_rows, chunk_size):
                yield piece.slice(start, chunk_size)

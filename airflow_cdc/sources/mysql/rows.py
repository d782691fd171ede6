"""Read a live table, encoded exactly like captured rows (for ``verify``).

A keyed table is read in key order by the snapshot chunk reader (key-ordered ``SELECT`` with
``LIMIT``, each chunk in a consistent snapshot of its own); a table without key columns has no
order to chunk by, so it is read by one ``SELECT`` of the whole table in one consistent snapshot,
streamed from the server (an unbuffered cursor).  No stored state is touched: nothing here writes
to the server or the state store.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pymysql.cursors

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.snapshot import key_ordered_chunks
from airflow_cdc.sources.mysql import snapshot
from airflow_cdc.sources.mysql import sql as q
from airflow_cdc.sources.mysql.chunk_keys import SESSION_SQL
from airflow_cdc.sources.mysql.snapshot import MySqlChunk
from airflow_cdc.sources.mysql.tables import TableState
from airflow_cdc.sources.mysql.whole import FETCH_ROWS

if TYPE_CHECKING:
    from airflow_cdc.sources.mysql.source import MySqlSource


def encode_rows(state: TableState, rows: list[tuple]) -> list[pa.Array]:
    """The captured columns of neutral row tuples (all table columns), converted by their codecs."""
    columns = zip(state.codecs, state.select, strict=True)
    return [codec.convert_values([r[i] for r in rows]) for codec, i in columns]


def encoded_chunks(source: MySqlSource, table: str, chunk_size: int) -> Iterator[pa.Table]:
    """Yield the table's current rows, at most ``chunk_size`` at a time, as Arrow tables whose
    fields (with Connect metadata) are the captured columns: in key order, or for a table without
    key columns in no particular order (pieces of at most :data:`FETCH_ROWS` rows).  ``source``
    must be open.

    :raises ConfigError: ``table`` is not captured (filters, or no such table).
    """
    if table not in source.tables():
        raise ConfigError(
            f"table {table} is not captured by connector {source.name} (check the table filters)"
        )
    if not source.table_state(table).key_columns:
        yield from _whole(source, table, chunk_size)
        return
    for chunk in key_ordered_chunks(source, table, chunk_size):
        assert isinstance(chunk, MySqlChunk)
        if chunk.rows:  # the structure of this chunk's read (a DDL may have raced with it)
            state = source.table_state(table)
            schema = pa.schema([c.field for c in state.codecs])
            yield pa.Table.from_arrays(encode_rows(state, chunk.rows), schema=schema)


def _whole(source: MySqlSource, table: str, chunk_size: int) -> Iterator[pa.Table]:
    """Every row, in the table's order, from one ``SELECT`` in one consistent snapshot."""
    tdef = source._tables[table]
    state = source.table_state(table)
    schema = pa.schema([c.field for c in state.codecs])
    select = ", ".join(snapshot.select_expr(c) for c in tdef.columns)
    with source.conn.cursor(pymysql.cursors.SSCursor) as cur:
        cur.execute(SESSION_SQL)
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        try:
            cur.execute(f"SELECT {select} FROM {q.qualified(tdef.db, tdef.table)}")  # noqa: S608 - quoted
            while batch := cur.fetchmany(min(chunk_size, FETCH_ROWS)):
                rows = [
                    tuple(snapshot.neutral(c, v) for c, v in zip(tdef.columns, r, strict=True)) for r in batch
                ]
                yield pa.Table.from_arrays(encode_rows(state, rows), schema=schema)
        finally:
            cur.execute("COMMIT")

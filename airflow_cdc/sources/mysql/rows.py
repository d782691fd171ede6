"""Read a live table in key order, encoded exactly like captured rows (for ``verify``).

Reuses the snapshot chunk reader (key-ordered ``SELECT`` with ``LIMIT``, each chunk in a
consistent snapshot of its own) without touching any stored state: nothing here writes to the
server or the state store.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.snapshot import key_ordered_chunks
from airflow_cdc.sources.mysql.snapshot import MySqlChunk
from airflow_cdc.sources.mysql.tables import TableState

if TYPE_CHECKING:
    from airflow_cdc.sources.mysql.source import MySqlSource


def encode_rows(state: TableState, rows: list[tuple]) -> list[pa.Array]:
    """The captured columns of neutral row tuples (all table columns), converted by their codecs."""
    columns = zip(state.codecs, state.select, strict=True)
    return [codec.convert_values([r[i] for r in rows]) for codec, i in columns]


def encoded_chunks(source: MySqlSource, table: str, chunk_size: int) -> Iterator[pa.Table]:
    """Yield the table's current rows in key order, ``chunk_size`` at a time, as Arrow tables whose
    fields (with Connect metadata) are the captured columns.  ``source`` must be open.

    :raises ConfigError: ``table`` is not captured (filters, or no such table).
    """
    if table not in source.tables():
        raise ConfigError(
            f"table {table} is not captured by connector {source.name} (check the table filters)"
        )
    for chunk in key_ordered_chunks(source, table, chunk_size):
        assert isinstance(chunk, MySqlChunk)
        if chunk.rows:  # the structure of this chunk's read (a DDL may have raced with it)
            state = source.table_state(table)
            schema = pa.schema([c.field for c in state.codecs])
            yield pa.Table.from_arrays(encode_rows(state, chunk.rows), schema=schema)

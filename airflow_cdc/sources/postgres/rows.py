"""Read a live table in key order, encoded exactly like captured rows (for ``verify``).

Reuses the snapshot chunk reader (key-ordered ``COPY`` with ``LIMIT``) without touching any
stored state: nothing here writes to the server or the state store.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from airflow_cdc.core.snapshot import TableSnapshot
from airflow_cdc.sources.postgres.source import PostgresSource


def encoded_chunks(source: PostgresSource, table: str, chunk_size: int) -> Iterator[pa.Table]:
    """Yield the table's current rows in key order, ``chunk_size`` at a time, as Arrow tables whose
    fields (with Connect metadata) are the captured columns.  ``source`` must be open."""
    state = source.table_state(table)
    fields = [c.field for c in state.codecs]
    snap = TableSnapshot(table)
    while True:
        chunk = source.read_chunks([snap], chunk_size, chunk_size)[0]
        arrays = [
            codec.convert(chunk.data.column(i)) for codec, i in zip(state.codecs, state.select, strict=True)
        ]
        if chunk.data.num_rows:
            yield pa.Table.from_arrays(arrays, schema=pa.schema(fields))
        if chunk.last:
            return
        snap.last_key = chunk.next_cursor()
        snap.rows += chunk.data.num_rows

"""Read a live table in key order, encoded exactly like captured rows (for ``verify``).

Reuses the snapshot chunk reader (key-ordered ``COPY`` with ``LIMIT``) without touching any
stored state: nothing here writes to the server or the state store.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from airflow_cdc.core.snapshot import key_ordered_chunks
from airflow_cdc.sources.postgres.source import PostgresSource


def encoded_chunks(source: PostgresSource, table: str, chunk_size: int) -> Iterator[pa.Table]:
    """Yield the table's current rows in key order, ``chunk_size`` at a time, as Arrow tables whose
    fields (with Connect metadata) are the captured columns.  ``source`` must be open."""
    state = source.table_state(table)
    schema = pa.schema([c.field for c in state.codecs])
    for chunk in key_ordered_chunks(source, table, chunk_size):
        if chunk.data.num_rows:
            arrays = [
                codec.convert(chunk.data.column(i))
                for codec, i in zip(state.codecs, state.select, strict=True)
            ]
            yield pa.Table.from_arrays(arrays, schema=schema)

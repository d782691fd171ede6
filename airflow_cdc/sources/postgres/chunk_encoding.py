"""Snapshot chunks encoded ahead: while the next chunk is read (the compiled COPY reader waits
on the server with the GIL released), a worker thread encodes the rows just read with the
table's codecs, so the writer later finds them ready.

The work is the writer's own (:func:`airflow_cdc.core.table_sink.encode_columns`), so the staged
values are the same either way; it is used only when it fits exactly: the whole chunk survived
reconciliation and the table state (codecs, selected columns) is the one it was encoded with.
Otherwise the writer encodes the text columns itself, as without this module.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from airflow_cdc.core.table_sink import encode_columns


@dataclass(frozen=True)
class Prepared:
    """A chunk's rows being encoded with ``state``'s codecs."""

    state: Any
    future: Future


class EncodeAhead:
    """One worker thread per open source; closing it drops work not started yet."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, state: Any, data: pa.Table) -> Prepared:
        """Start encoding ``data`` (text columns) with ``state.codecs`` / ``state.select``."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="airflow-cdc-encode")
        columns = [data.column(i) for i in range(data.num_columns)]
        job = self._pool.submit(encode_columns, list(state.codecs), list(state.select), columns)
        return Prepared(state, job)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def take(prepared: Prepared | None, state: Any, rows: pa.Table, data: pa.Table) -> list[pa.Array] | None:
    """The encoded columns of ``rows`` if they were prepared: ``rows`` is the whole chunk ``data``
    and ``state`` the table state they were encoded with; else None (the writer encodes).

    :raises Exception: whatever encoding raised (as the writer would have).
    """
    if prepared is None or rows is not data or prepared.state is not state:
        return None
    return prepared.future.result()

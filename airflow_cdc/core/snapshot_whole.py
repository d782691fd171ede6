"""Snapshots of tables read whole: tables without key columns, which no key can chunk.

A chunked snapshot needs an order to resume from and keys to reconcile with the window; a table
without key columns has neither.  Its snapshot is read in one consistent snapshot of the source,
streamed into the batch in bounded pieces, and positioned where that snapshot stands in the log
(:meth:`ChangeSource.read_whole`): exact without reconciliation, whatever the window holds.  The
price: the table is read in one run, whatever ``snapshot.max.rows.per.run`` says, and a run that
dies reads it again from its first row.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from airflow_cdc.core.snapshot import SnapshotContext, TableSnapshot
from airflow_cdc.core.source import ChangeSource

log = logging.getLogger(__name__)


@dataclass
class WholeReads:
    """The pending snapshots read whole in this run, with the rows each staged."""

    done: list[tuple[TableSnapshot, int]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(n for _, n in self.done)


def split(
    source: ChangeSource, pending: list[TableSnapshot], notes: list[str]
) -> tuple[list[TableSnapshot], list[TableSnapshot]]:
    """``(read whole, chunked)`` of the pending snapshots, in order.  A snapshot of a table read
    whole with an ``additional-conditions`` filter is refused (dropped, with a note): its rows
    would replace the table's whole mirror."""
    whole, chunked = [], []
    for snap in pending:
        if not source.snapshot_whole(snap.table):
            chunked.append(snap)
        elif snap.condition:
            message = (
                f"snapshot of {snap.table} with additional-conditions refused: a table without key "
                "columns is snapshotted whole (its rows replace silver's)"
            )
            log.warning(message)
            notes.append(message)
        else:
            whole.append(snap)
    return whole, chunked


def read(source: ChangeSource, writer: object, whole: list[TableSnapshot], max_rows: int) -> WholeReads:
    """Stage the snapshots of ``whole`` in order while fewer than ``max_rows`` rows were staged
    (the first one always): the rest wait for the next run."""
    out = WholeReads()
    for snap in whole:
        if out.done and out.rows >= max_rows:
            break
        started = time.monotonic()
        rows = source.read_whole(snap, writer)
        log.info("snapshot of %s read whole: %d rows in %.1fs", snap.table, rows, time.monotonic() - started)
        out.done.append((snap, rows))
    return out


def book(ctx: SnapshotContext, reads: WholeReads, counts: dict[str, int], notes: list[str]) -> int:
    """Record the whole reads as completed snapshots (``counts``: staged rows per table)."""
    for snap, rows in reads.done:
        snap.rows += rows
        snap.chunks += 1
        counts[snap.table] = counts.get(snap.table, 0) + rows
        ctx.finish(snap)
        notes.append(f"snapshot of {snap.table} complete: {snap.rows} rows, read whole (no key columns)")
    return reads.rows

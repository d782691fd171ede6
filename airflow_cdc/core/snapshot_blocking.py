"""Blocking snapshots: Debezium's ``execute-snapshot`` with ``"type": "blocking"`` in the batch model.

Debezium stops streaming at the signal, snapshots the tables as its initial snapshot does, and
resumes streaming.  A capture run does the same within its batch: the run whose window holds the
signal (a signal-table row, or a signal passed to the run) reads its window to the end, then reads
each named table whole in one consistent snapshot of the source at an exact log position ``C``
(:meth:`ChangeSource.read_whole`), staged as ``op=r`` rows at ``C``.  Every event at or below ``C``
is in those rows and sorts before them; every event above ``C`` sorts after them, in this batch or a
later one, and wins.  So nothing is applied twice or lost, and -- unlike Debezium -- no event is
re-emitted over the snapshot's rows.  A keyed table gets no reset (the snapshot re-reads rows, as
Debezium's does): a row deleted in the source stays deleted.  ``additional-conditions`` filter the
rows read (and ``snapshot.select.statement.overrides`` apply), as Debezium documents for blocking
snapshots.  A table without key columns is read as its ordinary snapshot is (its image replaces
silver's), so it takes no filter.

Nothing is stored for a blocking snapshot: it is done in the run that meets the signal, whatever
``snapshot.max.rows.per.run`` says.  Committed, that run's window lies behind the stored offset and
the signal is never met again; killed (or its batch not committed), the next run reads the same
window from the committed offset, meets the signal again and reads the tables again -- at most
one read per committed batch, none lost.  A signal passed to a run (not through the signal table)
is the run's own: a retried run with the same request reads again, a new run without it does not.
"""

from __future__ import annotations

import logging
import time

from airflow_cdc.core.snapshot import TableSnapshot
from airflow_cdc.core.source import ChangeSource

log = logging.getLogger(__name__)


def refused(source: ChangeSource) -> str | None:
    """Why ``source`` cannot run blocking snapshots (None: it can)."""
    if source.capabilities.blocking_snapshots:
        return None
    return (
        f"the {source.kind} source has no consistent whole-table read at an exact log position, "
        "which a blocking snapshot is read with"
    )


def unique(requests: list[TableSnapshot]) -> list[TableSnapshot]:
    """The requests in order, each (table, condition) once: two signals met in one run ask for
    the same read."""
    seen: set[tuple[str, str | None]] = set()
    out = []
    for snap in requests:
        if (snap.table, snap.condition) not in seen:
            seen.add((snap.table, snap.condition))
            out.append(snap)
    return out


def read(
    source: ChangeSource,
    writer: object,
    requests: list[TableSnapshot],
    counts: dict[str, int],
    notes: list[str],
) -> int:
    """Stage the blocking snapshots ``requests`` whole, in order; returns the rows staged.

    A table without key columns with a filter is refused with a note (its rows replace silver's
    mirror, so a filtered read would drop the rest); a table no longer captured is skipped with a
    note.  ``counts`` (staged rows per table) grows.

    :raises ServerMisconfigured, MissingPrivilege: from the source's whole-table reader; the run
        fails and the next one meets the signal again.
    """
    total = 0
    for snap in unique(requests):
        if snap.table not in source.tables():
            notes.append(f"blocking snapshot of {snap.table} skipped: the table is not captured any more")
            continue
        if snap.condition and source.snapshot_whole(snap.table):
            message = (
                f"blocking snapshot of {snap.table} with additional-conditions refused: a table without "
                "key columns is snapshotted whole (its rows replace silver's)"
            )
            log.warning(message)
            notes.append(message)
            continue
        started = time.monotonic()
        rows = source.read_whole(snap, writer)
        seconds = time.monotonic() - started
        log.info("blocking snapshot of %s: %d rows read whole in %.1fs", snap.table, rows, seconds)
        counts[snap.table] = counts.get(snap.table, 0) + rows
        filtered = f" matching {snap.condition!r}" if snap.condition else ""
        notes.append(f"blocking snapshot of {snap.table} complete: {rows} rows{filtered}, read whole")
        total += rows
    return total

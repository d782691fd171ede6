"""Which batches of a backlog the job applies to a table as one (``job.apply_batches``).

Consecutive batches of a connector are consecutive windows of one change stream.  For a table,
a stretch of them is exactly what one longer capture window would have staged: the same events
at the same positions.  So the job reads such a stretch as one frame and writes it with one
tombstone write and one MERGE (or rewrite): the per-batch fixed work (planning, log replay,
tombstone lookups, MERGE jobs) is paid once per stretch instead of once per batch.  Each event
keeps its own batch id, so silver's ``__batch_id`` is what applying batch by batch gives.

A table's stretch ends where the batches stop being consecutive windows:

* at a batch already applied to the table (its events are stored: a frame spanning it would fill
  unchanged-TOAST values from events older than the stored row);
* where a batch does not start at the previous one's end offset, when both manifests record them
  (a batch missing in between);
* where the key columns change.

Tables not combined at all, applied batch by batch (:func:`combinable`): keyless tables (their
writes skip events by the greatest position applied, ``keyless.py``, recorded per write), tables
with SCD type 2 history (their history log records each batch), and soft deletes (a soft-deleted
row keeps the values silver held when the delete was applied, so they depend on where batches
end).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .staged import StagedBatch, StagedTable


@dataclass(frozen=True)
class Entry:
    """One batch's part of one table."""

    index: int  # position of the batch in the backlog
    staged: StagedBatch
    table: StagedTable


def combinable(table: StagedTable, history: bool, soft: bool) -> bool:
    """Whether a table's batches may be applied as stretches (see the module doc)."""
    return bool(table.key_columns) and not history and not soft


def breaks(batches: list[StagedBatch]) -> set[int]:
    """Indexes of the batches that do not continue the previous one's window (see the module doc)."""
    out = set()
    for i in range(1, len(batches)):
        end, start = batches[i - 1].manifest.get("to_offset"), batches[i].manifest.get("from_offset")
        if end and start and end != start:  # not recorded (or empty): consecutive as given
            out.add(i)
    return out


def stretches(
    entries: list[Entry], cuts: set[int], applied: Callable[[StagedBatch], bool], combine: bool
) -> list[list[Entry]]:
    """A table's entries (in backlog order) cut into stretches applied as one.

    :param cuts: :func:`breaks` of the backlog.
    :param applied: whether a batch is already applied to the table's silver.
    :param combine: False for tables applied batch by batch (every stretch one batch).
    """
    out: list[list[Entry]] = []
    previous: Entry | None = None
    for entry in entries:
        alone = not combine or applied(entry.staged)
        joins = (
            previous is not None
            and not alone
            and entry.table.key_columns == previous.table.key_columns
            and not any(previous.index < i <= entry.index for i in cuts)
        )
        if joins:
            out[-1].append(entry)
        else:
            out.append([entry])
        previous = None if alone else entry
    return out


def combined_table(stretch: list[Entry]) -> StagedTable:
    """The stretch's parts as one staged table (schema groups in order, counts summed)."""
    first = stretch[0].table
    if len(stretch) == 1:
        return first
    ops: dict[str, int] = {}
    for entry in stretch:
        for op, n in entry.table.ops.items():
            ops[op] = ops.get(op, 0) + n
    return StagedTable(
        first.name,
        list(first.key_columns),
        [group for entry in stretch for group in entry.table.groups],
        ops,
        toast=any(e.table.toast for e in stretch),
        ops_counted=all(e.table.ops_counted for e in stretch),
        row_bytes=max(e.table.row_bytes for e in stretch),
        keyless=first.keyless,
    )

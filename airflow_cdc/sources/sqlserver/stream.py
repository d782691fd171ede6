"""Read a window of change-table rows in Debezium's order and turn them into change events.

Each capture instance's all-changes function is read for its segment of the window (sorted by
the server: commit LSN, change LSN, operation) and the per-instance streams are merged in that
order.  ``__$operation`` 3 (before image) and 4 (after image) of one change LSN become one ``u``
event; 1 is ``d``, 2 is ``c``.  Events of one commit LSN form one transaction.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from airflow_cdc.core.errors import ProtocolError
from airflow_cdc.sources.sqlserver import sql
from airflow_cdc.sources.sqlserver.offsets import SqlServerLsn
from airflow_cdc.sources.sqlserver.schema import CaptureInstance, Segment

_OPS = {1: "d", 2: "c"}


@dataclass(frozen=True)
class ChangeEvent:
    commit_lsn: SqlServerLsn
    change_lsn: SqlServerLsn
    event_serial_no: int
    op: str
    instance: CaptureInstance
    before: tuple | None
    after: tuple | None
    update_mask: bytes


def read_segment(conn: Any, segment: Segment) -> list[tuple]:
    """The change rows of one segment as ``(start_lsn, seqval, operation, mask, *columns)``."""
    ci = segment.instance
    cur = conn.cursor()
    query = sql.all_changes(ci.database, ci.name, [c.name for c in ci.columns])
    try:
        rows = cur.execute(query, segment.low.raw, segment.high.raw).fetchall()
    finally:
        cur.close()
    return [(bytes(r[0]), bytes(r[1]), r[2], bytes(r[3]), *r[4:]) for r in rows]


def merge(
    streams: Iterable[tuple[CaptureInstance, Iterable[tuple]]],
) -> Iterator[tuple[CaptureInstance, tuple]]:
    """Merge per-instance row streams by (commit LSN, change LSN, operation)."""
    iters = [_keyed(n, ci, rows) for n, (ci, rows) in enumerate(streams)]
    for _, ci, row in heapq.merge(*iters, key=lambda t: t[0]):
        yield ci, row


def _keyed(
    n: int, ci: CaptureInstance, rows: Iterable[tuple]
) -> Iterator[tuple[tuple, CaptureInstance, tuple]]:
    # a function, not a nested generator expression: each stream must keep its own ``ci``
    for row in rows:
        yield (row[0], row[1], row[2], n), ci, row


def events(rows: Iterable[tuple[CaptureInstance, tuple]]) -> Iterator[ChangeEvent]:
    """Pair update images and number events like Debezium.

    ``event_serial_no`` follows Debezium's ``SqlServerOffsetContext.setChangePosition``: an event
    counts 1 (insert, delete) or 2 (update), and an event at the same (commit LSN, change LSN) as
    the one before continues the count instead of restarting it.  SQL Server logs a *deferred
    update* (of key or unique-index columns, MERGE, some plans) as a delete (1) and an insert (2)
    that share one ``__$start_lsn`` and one ``__$seqval``; read in ``__$operation`` order the
    delete is serial 1 and the insert serial 2, so their positions differ and the insert wins.

    :raises ProtocolError: an update's before image (3) without its after image (4).
    """
    pending: tuple[CaptureInstance, tuple] | None = None
    last: tuple[bytes, bytes] | None = None
    serial = 0
    for ci, row in rows:
        start, seqval, op, mask, values = row[0], row[1], row[2], row[3], tuple(row[4:])
        if pending is not None:
            pci, prow = pending
            pending = None
            if op != 4 or pci is not ci or prow[1] != seqval:
                raise ProtocolError(
                    f"capture instance {pci.name}: update before-image at change LSN "
                    f"{SqlServerLsn(prow[1])} has no after-image"
                )
            serial = serial + 2 if last == (start, seqval) else 2
            last = (start, seqval)
            yield ChangeEvent(
                SqlServerLsn(start), SqlServerLsn(seqval), serial, "u", ci, tuple(prow[4:]), values, mask
            )
            continue
        if op == 3:
            pending = (ci, row)
        elif op in _OPS:
            serial = serial + 1 if last == (start, seqval) else 1
            last = (start, seqval)
            before, after = (values, None) if op == 1 else (None, values)
            yield ChangeEvent(
                SqlServerLsn(start), SqlServerLsn(seqval), serial, _OPS[op], ci, before, after, mask
            )
        else:
            raise ProtocolError(f"capture instance {ci.name}: unexpected __$operation {op}")
    if pending is not None:
        raise ProtocolError(f"capture instance {pending[0].name}: window ends inside an update")


def transactions(stream: Iterable[ChangeEvent]) -> Iterator[list[ChangeEvent]]:
    """Group consecutive events by commit LSN (one group per source transaction)."""
    group: list[ChangeEvent] = []
    for ev in stream:
        if group and ev.commit_lsn != group[0].commit_lsn:
            yield group
            group = []
        group.append(ev)
    if group:
        yield group


def read_window(conn: Any, segments: list[Segment]) -> Iterator[list[ChangeEvent]]:
    """Transactions of a window, in commit order, over every capture instance.

    Each segment is read whole before merging (one active result set per connection, as FreeTDS
    has no MARS), so the caller bounds a window's size by its LSN range.
    """
    streams = [(seg.instance, read_segment(conn, seg)) for seg in segments]
    return transactions(events(merge(streams)))

"""Capture instances of a database: source table, captured columns with types, key, validity start.

A source table has one or two capture instances (SQL Server's way to evolve a captured schema:
create a second instance with the new columns, then drop the old one).  For a window, each table
is read from the older instance up to the LSN where the newer one starts, and from the newer one
after it, so no change is read twice and none is missed.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from airflow_cdc.sources.sqlserver import sql
from airflow_cdc.sources.sqlserver.offsets import SqlServerLsn


@dataclass(frozen=True)
class Column:
    name: str
    ordinal: int
    type_name: str
    max_length: int
    precision: int
    scale: int
    nullable: bool
    computed: bool = False  # a computed column: NULL in every change-table row (Microsoft docs)


@dataclass
class CaptureInstance:
    database: str
    schema: str
    table: str
    name: str
    object_id: int
    start_lsn: SqlServerLsn
    create_date: dt.datetime
    columns: list[Column] = field(default_factory=list)
    key: list[str] = field(default_factory=list)
    #: ``cdc.change_tables.start_lsn`` is NULL: enabled, but the capture job has not scanned the
    #: log since (Microsoft: "the low endpoint ... has not been established"); nothing to read yet
    pending: bool = False

    @property
    def table_id(self) -> str:
        """``database.schema.table``, the name table filters and staged batches use."""
        return f"{self.database}.{self.schema}.{self.table}"


def load_capture_instances(conn: Any, database: str) -> list[CaptureInstance]:
    """Every capture instance of ``database``, oldest first, with columns and key columns."""
    cur = conn.cursor()
    rows = cur.execute(sql.capture_instances(database)).fetchall()
    instances = {
        r[3]: CaptureInstance(
            database, r[0], r[1], r[2], r[3], SqlServerLsn.of(r[4]), r[5], pending=r[4] is None
        )
        for r in rows
    }
    for oid, name, ordinal, tname, max_len, prec, scale, nullable, computed in cur.execute(
        sql.captured_columns(database)
    ).fetchall():
        if oid in instances:
            column = Column(name, ordinal, tname, max_len, prec, scale, bool(nullable), bool(computed))
            instances[oid].columns.append(column)
    for oid, name, _ in cur.execute(sql.index_columns(database)).fetchall():
        if oid in instances:
            instances[oid].key.append(name)
    cur.close()
    return list(instances.values())


@dataclass(frozen=True)
class Segment:
    """Read ``instance`` for commit LSNs in ``[low, high]``."""

    instance: CaptureInstance
    low: SqlServerLsn
    high: SqlServerLsn


def window_segments(instances: list[CaptureInstance], low: SqlServerLsn, high: SqlServerLsn) -> list[Segment]:
    """Which capture instance covers which part of ``[low, high]``, per source table.

    Instances are ordered by start LSN per table; each covers from its own start (or ``low``) up to
    just before the next one's start.  Empty ranges are dropped.  A pending instance (no start LSN
    yet) covers nothing: until the capture job establishes its start the older instance, which
    still captures every change, covers the whole range.
    """
    by_table: dict[tuple[str, str], list[CaptureInstance]] = {}
    for ci in instances:
        if not ci.pending:
            by_table.setdefault((ci.schema, ci.table), []).append(ci)
    segments = []
    for group in by_table.values():
        group.sort(key=lambda c: (c.start_lsn, c.create_date))
        for i, ci in enumerate(group):
            lo = max(low, ci.start_lsn)
            hi = (
                high
                if i + 1 == len(group)
                else min(high, SqlServerLsn.from_int(int(group[i + 1].start_lsn) - 1))
            )
            if lo <= hi:
                segments.append(Segment(ci, lo, hi))
    return segments

"""Incremental snapshot bookkeeping and the watermark reconciliation (DBLog / Debezium).

The snapshot context is pure, JSON-serialisable state kept in the connector state:
pending table snapshots with their chunk cursor, and recently completed ones.

Reconciliation of one run: chunks are read first, each with a source-specific *watermark*
that can tell, for any transaction of the change window, whether the chunk's read already
reflects it.  While the window streams, :class:`ChunkTracker` records the keys of chunk rows
touched by transactions the chunk does not reflect; those rows are dropped (the log version
wins) and the survivors are emitted as ``op = r`` at the window's end position, after every
event of the window and before any later one.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from airflow_cdc.core.errors import ConfigError

COMPLETED_KEPT = 50


@dataclass
class TableSnapshot:
    """One pending table snapshot and its cursor (last emitted key, as text values)."""

    table: str
    origin: str = "initial"  # initial | adhoc
    condition: str | None = None
    surrogate_key: str | None = None
    last_key: list[str | None] | None = None
    max_key: list[str | None] | None = None
    rows: int = 0
    chunks: int = 0
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started_at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TableSnapshot:
        return cls(**data)


@dataclass
class SnapshotContext:
    """Pending and completed table snapshots; the order of ``pending`` is the snapshot order."""

    pending: list[TableSnapshot] = field(default_factory=list)
    completed: list[dict[str, Any]] = field(default_factory=list)
    initial_done: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "pending": [p.to_json() for p in self.pending],
            "completed": self.completed[-COMPLETED_KEPT:],
            "initial_done": self.initial_done,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> SnapshotContext:
        if not data:
            return cls()
        return cls(
            [TableSnapshot.from_json(p) for p in data.get("pending", [])],
            list(data.get("completed", [])),
            bool(data.get("initial_done", False)),
        )

    def add(
        self,
        tables: Iterable[str],
        origin: str,
        conditions: dict[str, str] | None = None,
        surrogate_key: str | None = None,
    ) -> list[TableSnapshot]:
        """Queue snapshots; a table already pending is restarted from its first chunk."""
        added = []
        for table in tables:
            self.pending = [p for p in self.pending if p.table != table]
            snap = TableSnapshot(table, origin, (conditions or {}).get(table), surrogate_key)
            self.pending.append(snap)
            added.append(snap)
        return added

    def stop(self, tables: Iterable[str] | None) -> list[str]:
        """Drop pending snapshots (all when ``tables`` is None); returns the stopped tables."""
        wanted = None if tables is None else set(tables)
        stopped = [p.table for p in self.pending if wanted is None or p.table in wanted]
        self.pending = [p for p in self.pending if p.table not in stopped]
        return stopped

    def finish(self, snap: TableSnapshot) -> None:
        self.pending = [p for p in self.pending if p.id != snap.id]
        self.completed.append(
            {
                "table": snap.table,
                "origin": snap.origin,
                "rows": snap.rows,
                "chunks": snap.chunks,
                "finished_at": time.time(),
            }
        )


def match_tables(patterns: Iterable[str], tables: Iterable[str]) -> list[str]:
    """Tables whose full name matches any of Debezium's ``data-collections`` regexes."""
    compiled = []
    for p in patterns:
        try:
            compiled.append(re.compile(p))
        except re.error as e:
            raise ConfigError(f"execute-snapshot: invalid data-collections regex {p!r}: {e}") from e
    return [t for t in tables if any(c.fullmatch(t) for c in compiled)]


@dataclass
class ChunkRead:
    """Rows of one chunk (text columns, key columns first in ``key_index`` order) and its watermark."""

    snapshot: TableSnapshot
    columns: list[str]
    data: pa.Table
    key_index: list[int]
    watermark: Any
    last: bool  # the table has no rows after this chunk
    dropped: set[int] = field(default_factory=set)
    cursor_index: list[int] | None = None  # chunking columns (surrogate key), default the key

    def next_cursor(self) -> list[str | None] | None:
        if self.data.num_rows == 0:
            return self.snapshot.last_key
        row = self.data.num_rows - 1
        return [self.data.column(i)[row].as_py() for i in (self.cursor_index or self.key_index)]


class ChunkTracker:
    """Maps chunk keys to rows and marks rows touched by transactions their chunk does not reflect.

    :param reflects: ``reflects(watermark, txn) -> bool``: whether a chunk read with
        ``watermark`` already contains the effects of transaction ``txn`` (source-specific).
    """

    def __init__(self, chunks: list[ChunkRead], reflects: Callable[[Any, Any], bool]) -> None:
        self.chunks, self._reflects = chunks, reflects
        self._keys: dict[str, dict[tuple, tuple[int, int]]] = {}
        for ci, chunk in enumerate(chunks):
            keymap = self._keys.setdefault(chunk.snapshot.table, {})
            cols = [chunk.data.column(i).to_pylist() for i in chunk.key_index]
            for ri, key in enumerate(zip(*cols, strict=True)):
                keymap[key] = (ci, ri)

    def tables(self) -> frozenset[str]:
        return frozenset(self._keys)

    def observe(self, table: str, key: tuple, txn: Any) -> None:
        """Record that ``txn`` changed the row with ``key`` (text values) in ``table``."""
        hit = self._keys.get(table, {}).get(key)
        if hit is not None:
            chunk = self.chunks[hit[0]]
            if not self._reflects(chunk.watermark, txn):
                chunk.dropped.add(hit[1])

    def observe_truncate(self, table: str, txn: Any) -> None:
        """A truncate by ``txn``: every row of chunks that do not reflect it is stale."""
        for chunk in self.chunks:
            if chunk.snapshot.table == table and not self._reflects(chunk.watermark, txn):
                chunk.dropped.update(range(chunk.data.num_rows))

    def survivors(self, chunk: ChunkRead) -> pa.Table:
        """The chunk's rows that no unreflected transaction touched."""
        if not chunk.dropped:
            return chunk.data
        mask = [i not in chunk.dropped for i in range(chunk.data.num_rows)]
        return chunk.data.filter(pa.array(mask))

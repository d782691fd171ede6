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

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from airflow_cdc.core.errors import ServerMisconfigured
from airflow_cdc.core.filters import any_full_match, compile_patterns

log = logging.getLogger(__name__)

_Read = TypeVar("_Read")  # what a read retried by read_when_visible returns (a chunk ...)

#: How long a chunk read waits for transactions the log already holds to become visible to it.
VISIBILITY_TIMEOUT = 30.0
COMPLETED_KEPT = 50


@dataclass
class TableSnapshot:
    """One pending table snapshot and its cursor (last emitted key, as text values)."""

    table: str
    origin: str = "initial"  # initial | adhoc (| verify: never stored)
    condition: str | None = None
    surrogate_key: str | None = None
    last_key: list[str | None] | None = None
    max_key: list[str | None] | None = None
    rows: int = 0
    chunks: int = 0
    #: hex position: when this snapshot completes, rows captured below it are void (the offset was
    #: lost and the log restarted in a new epoch; rows deleted meanwhile must leave silver too)
    purge_below: str | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started_at: float = field(default_factory=time.time)
    #: form of ``last_key`` / ``max_key``, set by the source (0: stored before forms were versioned)
    cursor_format: int = 0

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
    compiled = compile_patterns("execute-snapshot", list(patterns), what="data-collections regex")
    return [t for t in tables if any_full_match(compiled, t)]


@dataclass
class ChunkRead:
    """Rows of one chunk (text columns, key columns first in ``key_index`` order) and its watermark."""

    snapshot: TableSnapshot
    columns: list[str]
    data: pa.Table
    key_index: list[int]
    watermark: Any
    last: bool  # the table has no rows after this chunk
    cursor_index: list[int] | None = None  # chunking columns (surrogate key), default the key
    #: the chunk's rows already being written as a part of their own (``ChangeSource.write_ahead``)
    ahead: Any = field(default=None, init=False, repr=False, compare=False)

    def next_cursor(self) -> list[str | None] | None:
        if self.data.num_rows == 0:
            return self.snapshot.last_key
        row = self.data.num_rows - 1
        return [self.data.column(i)[row].as_py() for i in (self.cursor_index or self.key_index)]


def read_when_visible(
    table: str,
    attempt: Callable[[], tuple[_Read | None, str]],
    hint: str,
    timeout: float | None = None,
) -> _Read:
    """Read a chunk whose snapshot sees every transaction the log may already have handed out.

    With synchronous replication a commit is in the log (and maybe emitted by an earlier window)
    before snapshots see it; a chunk read then could not be reconciled.  ``attempt()`` returns
    ``(chunk, "")``, or ``(None, what is still hidden)`` and is retried every 20 ms.

    :raises ServerMisconfigured: still hidden after ``timeout`` seconds (default
        :data:`VISIBILITY_TIMEOUT`); the message names the table and what stayed hidden.
    """
    limit = VISIBILITY_TIMEOUT if timeout is None else timeout
    deadline = time.monotonic() + limit
    while True:
        chunk, hidden = attempt()
        if chunk is not None:
            return chunk
        if time.monotonic() > deadline:
            raise ServerMisconfigured(f"snapshot chunk of {table}: {hidden} for {limit:.0f}s", hint=hint)
        time.sleep(0.02)


class ChunkSizer:
    """Rows per snapshot chunk, grown towards a target read time per chunk.

    Starts at ``start`` rows (``incremental.snapshot.chunk.size``'s default) and, after each full
    chunk, aims the next at ``target_s`` seconds at the rate just measured -- growing at most
    four-fold per chunk, never below ``start`` nor above ``most`` rows.  Per-chunk overhead (a
    query, a watermark, a transaction) then stops dominating large tables, while a slow table
    (wide rows, a busy server) keeps small chunks.
    """

    def __init__(self, start: int, target_s: float, most: int = 131_072) -> None:
        self.size, self.least, self.target, self.most = start, start, target_s, max(most, start)

    def observe(self, rows: int, seconds: float, asked: int) -> None:
        """Record a chunk of ``rows`` (``asked`` for) read in ``seconds``."""
        if rows < asked:  # a short (last) chunk says nothing about the rate
            return
        want = int(rows / max(seconds, 1e-3) * self.target)
        self.size = max(self.least, min(self.most, want, self.size * 4))


def captured_only(pending: list[TableSnapshot], captured: Iterable[str]) -> list[TableSnapshot]:
    """The pending snapshots of tables still captured, in order; the others are skipped, logged."""
    captured = set(captured)
    kept = []
    for snap in pending:
        if snap.table in captured:
            kept.append(snap)
        else:
            log.warning("snapshot of %s skipped: table is not captured (filters or dropped)", snap.table)
    return kept


def read_budgeted(
    pending: list[TableSnapshot],
    captured: Iterable[str],
    max_rows: int,
    chunk_size: int | ChunkSizer,
    read: Callable[[TableSnapshot, list | None, int], ChunkRead],
) -> list[ChunkRead]:
    """Chunks of the pending table snapshots, in order, up to ``max_rows`` rows in total.

    ``read(snapshot, cursor, limit)`` reads one chunk after ``cursor``; an empty chunk counts as one
    row, so a run always ends.  Snapshots of tables that are not (or no longer) captured are skipped.
    ``chunk_size`` is fixed rows per chunk, or a :class:`ChunkSizer` that adapts it.
    """
    chunks: list[ChunkRead] = []
    budget = max_rows
    sizer = chunk_size if isinstance(chunk_size, ChunkSizer) else None
    for snap in captured_only(pending, captured):
        cursor = snap.last_key
        while budget > 0:
            asked = min(sizer.size if sizer else int(chunk_size), budget)  # type: ignore[arg-type]
            started = time.monotonic()
            chunk = read(snap, cursor, asked)
            if sizer is not None:
                sizer.observe(chunk.data.num_rows, time.monotonic() - started, asked)
            chunks.append(chunk)
            budget -= max(chunk.data.num_rows, 1)
            cursor = chunk.next_cursor()
            if chunk.last:
                break
        if budget <= 0:
            break
    return chunks


def key_ordered_chunks(source: Any, table: str, chunk_size: int) -> Iterator[ChunkRead]:
    """Read a live table in key order, ``chunk_size`` rows at a time, with the source's snapshot
    chunk reader (``read_chunks``), for ``verify``: no snapshot state is stored, nothing written.
    The whole table, whatever ``snapshot.select.statement.overrides`` says (origin ``verify``)."""
    snap = TableSnapshot(table, origin="verify")
    while True:
        chunk = source.read_chunks([snap], chunk_size, chunk_size)[0]
        yield chunk
        if chunk.last:
            return
        snap.last_key = chunk.next_cursor()
        snap.rows += chunk.data.num_rows


class ChunkTracker:
    """Marks chunk rows touched by transactions their chunk does not reflect.

    Chunks of one *group* are read one after another, so their snapshots only move forward: a
    transaction reflected by chunk *i* of a group is reflected by every later chunk of it.  Each
    transaction therefore has, per group, a first reflecting chunk (found by binary search,
    cached), and each touched key keeps the greatest such position over the transactions that
    touched it: chunks before that position must drop the key.  Chunks read in parallel (snapshot
    parts, :mod:`airflow_cdc.core.snapshot_parts`) form one group per reader, since the order of
    their snapshots across readers is unknown.  Memory grows with the keys the window touches (times
    the groups), not with the chunk rows.

    :param reflects: ``reflects(watermark, txn) -> bool``: whether a chunk read with
        ``watermark`` already contains the effects of transaction ``txn`` (source-specific).
    :param groups: the group of each chunk (default: one group, the list's order is the read order);
        within a group, chunks must be listed in read order.
    """

    def __init__(
        self, chunks: list[ChunkRead], reflects: Callable[[Any, Any], bool], groups: list[int] | None = None
    ) -> None:
        self.chunks, self._reflects = chunks, reflects
        self._tables = frozenset(c.snapshot.table for c in chunks)
        members: dict[int, list[int]] = {}
        for i, g in enumerate(groups if groups is not None else [0] * len(chunks)):
            members.setdefault(g, []).append(i)
        self._groups = list(members.values())  # chunk indices of each group, in read order
        # each chunk's (group, position inside the group)
        self._place = {i: (g, pos) for g, idx in enumerate(self._groups) for pos, i in enumerate(idx)}
        self._touched: dict[str, dict[tuple, tuple[int, ...]]] = {}
        self._truncated: dict[str, tuple[int, ...]] = {}
        self._first: dict[Any, tuple[int, ...]] = {}
        self._steps: dict[str, dict[tuple, list[tuple[tuple[int, ...], bytes | None]]]] = {}

    def tables(self) -> frozenset[str]:
        return self._tables

    def _first_in(self, members: list[int], txn: Any) -> int:
        lo, hi = 0, len(members)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._reflects(self.chunks[members[mid]].watermark, txn):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _first_reflecting(self, txn: Any) -> tuple[int, ...]:
        first = self._first.get(txn)
        if first is None:
            self._first[txn] = first = tuple(self._first_in(m, txn) for m in self._groups)
        return first

    def observe(self, table: str, key: tuple, txn: Any, pre_image: bytes | None = None) -> None:
        """Record that ``txn`` changed the row with ``key`` (text values) in ``table``.

        :param pre_image: the change left values unsent (PostgreSQL unchanged TOAST) and the
            position just before the transaction's events: a chunk that drops the key because of
            this (first unreflected) change emits its row there, so the unsent values resolve.
        """
        first = self._first_reflecting(txn)
        if any(first):
            keys = self._touched.setdefault(table, {})
            seen = keys.get(key)
            if seen is None or any(f > s for f, s in zip(first, seen, strict=True)):
                keys[key] = first if seen is None else tuple(map(max, first, seen))
                # the window is in commit order and, for one row, a chunk reflects a prefix of its
                # changes (PostgreSQL row locks): this is the first change some chunks miss
                self._steps.setdefault(table, {}).setdefault(key, []).append((first, pre_image))

    def observe_truncate(self, table: str, txn: Any) -> None:
        """A truncate by ``txn``: every row of chunks that do not reflect it is stale."""
        first = self._first_reflecting(txn)
        seen = self._truncated.get(table)
        self._truncated[table] = first if seen is None else tuple(map(max, first, seen))

    def _where(self, chunk: ChunkRead) -> tuple[int, int]:
        index = next(i for i, c in enumerate(self.chunks) if c is chunk)
        return self._place[index]

    def survivors(self, chunk: ChunkRead) -> pa.Table:
        """The chunk's rows that no unreflected transaction touched."""
        group, pos = self._where(chunk)
        table = chunk.snapshot.table
        if self._truncated.get(table, (0,) * len(self._groups))[group] > pos:
            return chunk.data.slice(0, 0)
        stale = [k for k, first in self._touched.get(table, {}).items() if first[group] > pos]
        if not stale:
            return chunk.data
        if len(chunk.key_index) == 1:
            column = chunk.data.column(chunk.key_index[0])
            hit = pc.is_in(column, value_set=pa.array([k[0] for k in stale], pa.string()))
            mask = pc.invert(pc.fill_null(hit, False))
        else:
            wanted = set(stale)
            cols = [chunk.data.column(i).to_pylist() for i in chunk.key_index]
            mask = pa.array([key not in wanted for key in zip(*cols, strict=True)], pa.bool_())
        return chunk.data.filter(mask)

    def pre_images(self, chunk: ChunkRead) -> list[tuple[bytes, pa.Table]]:
        """Dropped rows of ``chunk`` to emit just before their key's first unreflected change.

        A chunk row is the row's state right before the first change the chunk does not reflect
        (for one row, visibility order is commit order); when that change left values unsent,
        the row is emitted at the position given to :meth:`observe` so apply fills them from it.
        Returns ``(position, rows)`` groups; empty for truncated chunks and without such changes.
        """
        group, pos = self._where(chunk)
        table = chunk.snapshot.table
        if self._truncated.get(table, (0,) * len(self._groups))[group] > pos:
            return []
        wanted: dict[tuple, bytes] = {}
        for key, steps in self._steps.get(table, {}).items():
            step = next((s for s in steps if s[0][group] > pos), None)
            if step is not None and step[1] is not None:
                wanted[key] = step[1]
        if not wanted:
            return []
        cols = [chunk.data.column(i).to_pylist() for i in chunk.key_index]
        rows_at: dict[bytes, list[int]] = {}
        for row, key in enumerate(zip(*cols, strict=True)):
            at = wanted.get(key)
            if at is not None:
                rows_at.setdefault(at, []).append(row)
        return [(at, chunk.data.take(pa.array(rows))) for at, rows in sorted(rows_at.items())]

"""Snapshot readers side by side (snapshot.max.threads) against an in-memory source: every key
read exactly once across runs, ranges read to their end while rows are inserted into them, the
run's budget, several tables, a surrogate-key table left to the capture's connection, errors."""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from airflow_cdc.core.snapshot import ChunkRead, TableSnapshot, read_budgeted
from airflow_cdc.core.snapshot_readers import read_side_by_side


class MemorySource:
    """Tables of sorted integer keys; readers share them and count their connections."""

    def __init__(
        self, tables: dict[str, list[int]], insert_every: int = 0, fail_on: int | None = None
    ) -> None:
        self.data = {t: sorted(keys) for t, keys in tables.items()}
        self.lock = threading.Lock()
        self.clock = itertools.count(1)
        self.open_readers = 0
        self.readers_made = 0
        self.insert_every, self.fail_on = insert_every, fail_on
        self.reads = 0
        self.inserted: list[tuple[str, int]] = []
        self.refuse_readers = False

    def tables(self) -> list[str]:
        return list(self.data)

    def snapshot_bounds(self, snap: TableSnapshot, offsets: list[int]) -> tuple[list, list]:
        with self.lock:
            keys = self.data[snap.table]
            max_key = snap.max_key if snap.max_key is not None else ([keys[-1]] if keys else [])
            if not max_key:
                return [], []
            rest = self._between(keys, snap.last_key, max_key[0])
            return max_key, [[rest[o]] for o in offsets if o < len(rest)]

    @staticmethod
    def _between(keys: list[int], after: list | None, upto: int) -> list[int]:
        lo = bisect.bisect_right(keys, after[0]) if after else 0
        return keys[lo : bisect.bisect_right(keys, upto)]

    def snapshot_reader(self) -> MemoryReader:
        if self.refuse_readers:
            raise ConnectionError("FATAL: sorry, too many clients already")
        with self.lock:
            self.open_readers += 1
            self.readers_made += 1
        return MemoryReader(self)

    def read_chunks(self, pending: list[TableSnapshot], max_rows: int, chunk_size: Any) -> list[ChunkRead]:
        return read_budgeted(pending, self.data, max_rows, chunk_size, self.read_chunk)

    def read_chunk(self, snap: TableSnapshot, after: list | None, limit: int) -> ChunkRead:
        with self.lock:
            self.reads += 1
            if self.fail_on is not None and self.reads == self.fail_on:
                raise RuntimeError("connection lost reading a chunk")
            keys = self.data[snap.table]
            if snap.max_key is None:
                snap.max_key = [keys[-1]] if keys else []
            if self.insert_every and keys and self.reads % self.insert_every == 0:
                # a concurrent insert just above the range's start: its boundary was found before
                new = (after[0] if after else keys[0] - 2) + 1
                if new not in keys and (not snap.max_key or new < snap.max_key[0]):
                    bisect.insort(keys, new)
                    self.inserted.append((snap.table, new))
            rows = self._between(keys, after, snap.max_key[0])[:limit] if snap.max_key else []
            watermark = next(self.clock)
        time.sleep(0.001)  # let the other reader take a range meanwhile
        data = pa.table({"c0": pa.array(rows, pa.int64())})
        last = len(rows) < limit or (bool(rows) and [rows[-1]] == snap.max_key) or not snap.max_key
        return ChunkRead(snap, ["id"], data, [0], watermark, last)


class MemoryReader(MemorySource):
    def __init__(self, parent: MemorySource) -> None:
        self.__dict__ = parent.__dict__  # same tables, counters and lock

    def close(self) -> None:
        with self.lock:
            self.open_readers -= 1


def run_all(
    source: MemorySource, pending: list[TableSnapshot], max_rows: int, threads: int, span: int
) -> list[tuple[list[ChunkRead], list[int]]]:
    """Runs until no snapshot is pending, advancing cursors as the capture's reconciliation does."""
    runs = []
    while pending:
        chunks, groups = read_side_by_side(
            SimpleNamespace(source=source), pending, max_rows, threads, span, span
        )
        runs.append((chunks, groups))
        for chunk in chunks:
            snap = chunk.snapshot
            snap.last_key = chunk.next_cursor()
            snap.rows += chunk.data.num_rows
            if chunk.last:
                pending.remove(snap)
        assert len(runs) < 500
    return runs


def keys_of(chunks: list[ChunkRead], table: str) -> list[int]:
    return [k for c in chunks if c.snapshot.table == table for k in c.data.column(0).to_pylist()]


@pytest.mark.parametrize("threads", [2, 3, 5])
@pytest.mark.parametrize(("span", "max_rows"), [(7, 50), (10, 10), (64, 1000), (1, 9), (100, 30)])
def test_every_key_read_once_in_order_across_runs(threads, span, max_rows):
    tables = {"a": list(range(0, 2000, 3)), "b": [5], "c": [], "d": list(range(-500, 500, 7))}
    source = MemorySource(tables)
    expected = {t: list(k) for t, k in source.data.items()}
    pending = [TableSnapshot(t) for t in tables]
    runs = run_all(source, pending, max_rows, threads, span)
    every = [c for chunks, _ in runs for c in chunks]
    for table, keys in expected.items():
        assert keys_of(every, table) == keys
    for chunks, groups in runs:
        # the run's budget holds (no inserts here), and is used up unless the snapshot ends
        assert sum(max(c.data.num_rows, 1) for c in chunks) <= max_rows
        # a reader's chunks are listed in its read order (ChunkTracker groups)
        for reader in set(groups):
            marks = [c.watermark for c, g in zip(chunks, groups, strict=True) if g == reader]
            assert marks == sorted(marks)
    assert sum(1 for chunks, _ in runs for c in chunks if c.last) == len(tables)
    assert source.open_readers == 0


@pytest.mark.parametrize("threads", [2, 4])
def test_rows_inserted_into_a_range_after_its_boundary_are_read(threads):
    source = MemorySource({"t": list(range(0, 5000, 10))}, insert_every=3)
    pending = [TableSnapshot("t")]
    runs = run_all(source, pending, 120, threads, 25)
    assert source.inserted, "the scenario inserted nothing"
    got = keys_of([c for chunks, _ in runs for c in chunks], "t")
    assert got == sorted(set(got)) == source.data["t"]


def test_a_surrogate_key_table_is_read_by_the_capture_connection():
    source = MemorySource({"a": list(range(30)), "s": list(range(100, 140)), "z": list(range(10))})
    surrogate = TableSnapshot("s", surrogate_key="id")
    pending = [TableSnapshot("a"), surrogate, TableSnapshot("z")]
    chunks, groups = read_side_by_side(SimpleNamespace(source=source), pending, 50, 2, 8, 8)
    assert keys_of(chunks, "a") == list(range(30))
    assert keys_of(chunks, "s") == list(range(100, 120))  # the rest of the budget, 8 rows per chunk
    assert {g for c, g in zip(chunks, groups, strict=True) if c.snapshot.table == "s"} == {2}
    assert {g for c, g in zip(chunks, groups, strict=True) if c.snapshot.table == "a"} <= {0, 1}


def test_tables_no_longer_captured_are_skipped(caplog):
    source = MemorySource({"a": list(range(10))})
    chunks, _ = read_side_by_side(
        SimpleNamespace(source=source), [TableSnapshot("gone"), TableSnapshot("a")], 100, 2, 4, 4
    )
    assert keys_of(chunks, "a") == list(range(10)) and chunks[-1].last
    assert "snapshot of gone skipped" in caplog.text


def test_a_failed_reader_fails_the_run_and_every_connection_is_closed():
    source = MemorySource({"t": list(range(1000))}, fail_on=4)
    with pytest.raises(RuntimeError, match="connection lost"):
        read_side_by_side(SimpleNamespace(source=source), [TableSnapshot("t")], 1000, 3, 10, 10)
    assert source.readers_made == 3 and source.open_readers == 0


def test_a_reader_without_a_connection_names_the_setting(caplog):
    source = MemorySource({"t": list(range(100))})
    source.refuse_readers = True
    with pytest.raises(ConnectionError, match="too many clients"):
        read_side_by_side(SimpleNamespace(source=source), [TableSnapshot("t")], 100, 2, 10, 10)
    assert "snapshot.max.threads" in caplog.text


def test_long_reads_show_progress(caplog, monkeypatch):
    from airflow_cdc.core import snapshot_readers

    monkeypatch.setattr(snapshot_readers, "PROGRESS_SECONDS", 0.0)
    source = MemorySource({"t": list(range(200))})
    with caplog.at_level("INFO", logger="airflow_cdc.core.snapshot_readers"):
        read_side_by_side(SimpleNamespace(source=source), [TableSnapshot("t")], 150, 2, 10, 10)
    lines = [r.getMessage() for r in caplog.records if "snapshot readers:" in r.getMessage()]
    assert len(lines) >= 10 and "of up to 150 rows read (now in t)" in lines[0] and "rows/s" in lines[-1]

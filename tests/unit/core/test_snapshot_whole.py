"""Snapshots of tables read whole (no key columns): which ones, how many per run, their booking."""

from __future__ import annotations

from airflow_cdc.core import snapshot_whole
from airflow_cdc.core.snapshot import SnapshotContext


class FakeSource:
    """Tables named ``k*`` have key columns; ``read_whole`` stages ``rows[table]`` rows."""

    def __init__(self, rows: dict[str, int]) -> None:
        self.rows, self.read = rows, []

    def snapshot_whole(self, table: str) -> bool:
        return not table.startswith("k")

    def read_whole(self, snap, writer) -> int:
        self.read.append(snap.table)
        return self.rows[snap.table]


def test_split_keeps_order_and_refuses_conditions():
    ctx = SnapshotContext()
    ctx.add(["a", "k1", "b", "k2"], "initial")
    ctx.add(["c"], "adhoc", conditions={"c": "x > 1"})
    notes: list[str] = []
    whole, chunked = snapshot_whole.split(FakeSource({}), ctx.pending, notes)
    assert [s.table for s in whole] == ["a", "b"]
    assert [s.table for s in chunked] == ["k1", "k2"]
    assert len(notes) == 1 and "snapshot of c with additional-conditions refused" in notes[0]


def test_read_stops_once_the_row_budget_is_spent_but_reads_one_table_at_least():
    ctx = SnapshotContext()
    ctx.add(["a", "b", "c"], "initial")
    source = FakeSource({"a": 500, "b": 10, "c": 10})
    reads = snapshot_whole.read(source, None, ctx.pending, max_rows=100)
    assert source.read == ["a"] and reads.rows == 500
    source = FakeSource({"a": 5, "b": 10, "c": 10})
    reads = snapshot_whole.read(source, None, ctx.pending, max_rows=100)
    assert source.read == ["a", "b", "c"] and reads.rows == 25


def test_book_finishes_the_snapshots_read():
    ctx = SnapshotContext()
    ctx.add(["a", "b"], "initial")
    reads = snapshot_whole.read(FakeSource({"a": 3, "b": 4}), None, ctx.pending[:1], max_rows=100)
    counts: dict[str, int] = {"a": 1}
    notes: list[str] = []
    assert snapshot_whole.book(ctx, reads, counts, notes) == 3
    assert [s.table for s in ctx.pending] == ["b"]
    assert counts == {"a": 4} and ctx.completed[-1]["table"] == "a" and ctx.completed[-1]["rows"] == 3
    assert notes == ["snapshot of a complete: 3 rows, read whole (no key columns)"]

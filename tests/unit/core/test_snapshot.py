import pyarrow as pa
import pytest

from airflow_cdc.core.snapshot import ChunkRead, ChunkTracker, SnapshotContext, TableSnapshot


def _chunk(table, keys, watermark):
    data = pa.table({"c0": pa.array([str(k) for k in keys]), "c1": pa.array(["v"] * len(keys))})
    return ChunkRead(TableSnapshot(table), ["id", "v"], data, [0], watermark, last=False)


def reflects(watermark, xid):
    return xid in watermark


def test_rows_touched_by_unreflected_transactions_are_dropped():
    a = _chunk("t", [1, 2, 3], watermark={10})
    b = _chunk("t", [4, 5], watermark={10, 11})
    tracker = ChunkTracker([a, b], reflects)
    tracker.observe("t", ("1",), 10)  # reflected by chunk a: keep
    tracker.observe("t", ("2",), 11)  # not reflected by a: drop
    tracker.observe("t", ("4",), 11)  # reflected by b: keep
    tracker.observe("t", ("5",), 12)  # not reflected by b: drop
    tracker.observe("t", ("9",), 12)  # not in any chunk
    tracker.observe("other", ("1",), 12)
    assert tracker.survivors(a).column(0).to_pylist() == ["1", "3"]
    assert tracker.survivors(b).column(0).to_pylist() == ["4"]


def test_dropped_rows_are_pre_images_of_their_first_unreflected_change_when_it_left_values_unsent():
    a = _chunk("t", [1, 2, 3, 4], watermark={10})
    b = _chunk("t", [5, 6], watermark={10, 11})
    tracker = ChunkTracker([a, b], reflects)
    tracker.observe("t", ("1",), 11, pre_image=b"P11")  # first unreflected change, values unsent
    tracker.observe("t", ("1",), 12, pre_image=b"P12")  # later: the batch already has key 1's row
    tracker.observe("t", ("2",), 11)  # sends every value: the log version is complete
    tracker.observe("t", ("2",), 12, pre_image=b"P12")  # ... and fills this one
    tracker.observe("t", ("3",), 10, pre_image=b"P10")  # reflected by a: the row survives
    tracker.observe("t", ("4",), 12, pre_image=b"P12")
    tracker.observe("t", ("5",), 11, pre_image=b"P11")  # reflected by b
    tracker.observe("t", ("6",), 12, pre_image=b"P12")
    got = [(at, t.column(0).to_pylist()) for at, t in tracker.pre_images(a)]
    assert got == [(b"P11", ["1"]), (b"P12", ["4"])]
    assert [(at, t.column(0).to_pylist()) for at, t in tracker.pre_images(b)] == [(b"P12", ["6"])]
    assert tracker.survivors(a).column(0).to_pylist() == ["3"]
    tracker.observe_truncate("t", 12)
    assert tracker.pre_images(a) == [] and tracker.pre_images(b) == []


def test_an_empty_chunk_with_a_composite_key_and_touched_keys_has_no_survivors():
    """A chunk read after every row of its range was deleted is empty; the window's changes to
    its table then leave nothing to drop (the mask of no rows is a boolean array, not null-typed)."""
    empty = pa.table({"c0": pa.array([], pa.string()), "c1": pa.array([], pa.string())})
    chunk = ChunkRead(TableSnapshot("t"), ["a", "b"], empty, [0, 1], {10}, last=True)
    tracker = ChunkTracker([chunk], reflects)
    tracker.observe("t", ("1", "x"), 11)
    assert tracker.survivors(chunk).num_rows == 0 and tracker.pre_images(chunk) == []


def test_truncate_drops_every_unreflecting_chunk():
    a = _chunk("t", [1, 2], watermark={10})
    b = _chunk("t", [3], watermark={10, 11})
    tracker = ChunkTracker([a, b], reflects)
    tracker.observe_truncate("t", 11)
    assert tracker.survivors(a).num_rows == 0 and tracker.survivors(b).num_rows == 1


def test_context_round_trip_and_restart():
    ctx = SnapshotContext()
    ctx.add(["s.a", "s.b"], "initial")
    ctx.pending[0].last_key = ["5"]
    again = SnapshotContext.from_json(ctx.to_json())
    assert [p.table for p in again.pending] == ["s.a", "s.b"] and again.pending[0].last_key == ["5"]
    again.add(["s.a"], "adhoc", {"s.a": "x > 1"})
    assert [p.table for p in again.pending] == ["s.b", "s.a"] and again.pending[1].last_key is None
    assert again.stop(["s.b"]) == ["s.b"] and [p.table for p in again.pending] == ["s.a"]
    again.finish(again.pending[0])
    assert again.pending == [] and again.completed[-1]["table"] == "s.a"


def test_read_when_visible_retries_then_names_table_and_what_stayed_hidden():
    from airflow_cdc.core.errors import ServerMisconfigured
    from airflow_cdc.core.snapshot import read_when_visible

    answers = iter([(None, "xid 7 hidden"), (None, "xid 7 hidden"), ("chunk", "")])
    assert read_when_visible("public.t", lambda: next(answers), "hint", timeout=5) == "chunk"
    with pytest.raises(ServerMisconfigured, match=r"snapshot chunk of public\.t: xid 9 hidden for 0s"):
        read_when_visible("public.t", lambda: (None, "xid 9 hidden"), "check the standby", timeout=0.05)


def test_chunk_sizer_grows_towards_the_target_and_keeps_its_bounds():
    from airflow_cdc.core.snapshot import ChunkSizer

    sizer = ChunkSizer(1024, 2.0, most=100_000)
    sizer.observe(1024, 0.01, 1024)  # 102k rows/s: 204k rows would take 2 s; at most x4 per chunk
    assert sizer.size == 4096
    sizer.observe(4096, 0.04, 4096)
    assert sizer.size == 16_384
    sizer.observe(100, 0.001, 16_384)  # a short last chunk says nothing
    assert sizer.size == 16_384
    for _ in range(5):
        sizer.observe(sizer.size, sizer.size / 102_400, sizer.size)
    assert sizer.size == 100_000  # capped
    sizer.observe(100_000, 100.0, 100_000)  # a slow table: 1000 rows/s -> 2000 rows
    assert sizer.size == 2000
    sizer.observe(2000, 60.0, 2000)  # slower still: never below the start size
    assert sizer.size == 1024


def test_read_budgeted_with_a_sizer_asks_growing_chunks_within_the_budget():
    import pyarrow as pa

    from airflow_cdc.core.snapshot import ChunkRead, ChunkSizer, TableSnapshot, read_budgeted

    asked: list[int] = []

    def read(snap, cursor, limit):
        asked.append(limit)
        start = int(cursor[0]) if cursor else 0
        n = min(limit, 50_000 - start)
        data = pa.table({"id": pa.array([str(start + i + 1) for i in range(n)], pa.string())})
        return ChunkRead(snap, ["id"], data, [0], None, start + n >= 50_000)

    chunks = read_budgeted([TableSnapshot("t")], ["t"], 30_000, ChunkSizer(1000, 10.0), read)
    assert asked[:3] == [1000, 4000, 16_000] and sum(c.data.num_rows for c in chunks) == 30_000
    assert asked[-1] == 30_000 - 21_000  # the budget's rest

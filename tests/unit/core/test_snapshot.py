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

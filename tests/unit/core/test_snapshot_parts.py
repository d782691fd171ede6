"""Snapshot parts without a server: per-reader reconciliation groups, refusals, stored MySQL rows."""

from decimal import Decimal
from types import SimpleNamespace

import pyarrow as pa
import pytest

from airflow_cdc.core.errors import ConfigError, SchemaError
from airflow_cdc.core.snapshot import ChunkRead, ChunkTracker, TableSnapshot
from airflow_cdc.core.snapshot_parts import plan_parts
from airflow_cdc.core.source import Capabilities
from airflow_cdc.sources.mysql import parts as my_parts
from airflow_cdc.sources.mysql.snapshot import MySqlChunk, Watermark


def _chunk(keys, watermark):
    data = pa.table({"c0": pa.array([str(k) for k in keys]), "c1": pa.array(["v"] * len(keys))})
    return ChunkRead(TableSnapshot("t"), ["id", "v"], data, [0], watermark, last=False)


def reflects(watermark, xid):
    return xid in watermark


def test_chunks_of_parallel_readers_are_reconciled_per_reader():
    # key order a, b (reader 0, read one after the other), c (reader 1, read between a and b)
    a, b, c = _chunk([1, 2], {10}), _chunk([3, 4], {10, 11, 12}), _chunk([5, 6], {10, 11})
    tracker = ChunkTracker([a, b, c], reflects, groups=[0, 0, 1])
    tracker.observe("t", ("1",), 11)  # a does not see 11: drop
    tracker.observe("t", ("3",), 12)  # b sees 12: keep
    tracker.observe("t", ("5",), 12)  # c does not see 12 although b, listed before it, does: drop
    tracker.observe("t", ("6",), 11)  # c sees 11: keep
    assert tracker.survivors(a).column(0).to_pylist() == ["2"]
    assert tracker.survivors(b).column(0).to_pylist() == ["3", "4"]
    assert tracker.survivors(c).column(0).to_pylist() == ["6"]
    # one group (a single reader's order) would wrongly keep key 5: the groups matter
    single = ChunkTracker([a, b, c], reflects)
    single.observe("t", ("5",), 12)
    assert "5" in single.survivors(c).column(0).to_pylist()


def test_truncate_and_pre_images_per_reader():
    a, b, c = _chunk([1], {10}), _chunk([2], {10, 11, 12}), _chunk([3, 4], {10, 11})
    tracker = ChunkTracker([a, b, c], reflects, groups=[0, 0, 1])
    tracker.observe("t", ("4",), 12, pre_image=b"P12")
    assert [(at, t.column(0).to_pylist()) for at, t in tracker.pre_images(c)] == [(b"P12", ["4"])]
    tracker.observe_truncate("t", 12)
    assert tracker.survivors(b).num_rows == 1 and tracker.survivors(c).num_rows == 0
    assert tracker.survivors(a).num_rows == 0


@pytest.mark.parametrize(
    ("capabilities", "needle"),
    [
        (Capabilities(chunked_snapshots=False), "snapshots natively"),
        (Capabilities(), "without an upper key bound"),
    ],
)
def test_sources_that_cannot_split_a_snapshot_are_refused(capabilities, needle):
    from airflow_cdc.core.source import ChangeSource

    source = SimpleNamespace(kind="vitess", capabilities=capabilities)
    source_type = type("Native", (SimpleNamespace,), {"snapshot_bounds": ChangeSource.snapshot_bounds})
    capture = SimpleNamespace(source=source_type(**vars(source)), config={"name": "shop"})
    with pytest.raises(ConfigError, match=f"airflow.snapshot_tasks.*{needle}"):
        plan_parts(capture, 3)
    with pytest.raises(ConfigError, match="at least 1 part"):
        plan_parts(capture, 0)


def test_mysql_chunk_rows_round_trip_exactly():
    rows = [
        (1, -(2**63), 0.1, 1e308, Decimal("-12.340000"), "ä'x", b"\x00\xff", None),
        (2, 2**64 - 1, float("-0.0"), 5e-324, Decimal("0"), "", b"", True),
    ]
    data = pa.table({"k": pa.array(["1", "2"]), "__row": pa.array([0, 1], pa.int64())})
    chunk = MySqlChunk(TableSnapshot("d.t"), ["k", "__row"], data, [0], Watermark(5, 7), False, None, rows)
    table, width = my_parts.chunk_to_table(chunk)
    back_data, back_rows = my_parts.rows_of(table, width)
    assert back_data.equals(data)
    assert back_rows == [(*rows[0],), (*rows[1][:-1], 1)]
    assert [type(v) for v in back_rows[1][:-1]] == [type(v) for v in rows[1][:-1]]
    assert str(back_rows[0][4]) == "-12.340000" and str(back_rows[1][2]) == "-0.0"
    bad = MySqlChunk(TableSnapshot("d.t"), ["k"], data, [0], Watermark(5, 7), False, None, [(object(),)])
    with pytest.raises(SchemaError, match="d.t"):
        my_parts.chunk_to_table(bad)

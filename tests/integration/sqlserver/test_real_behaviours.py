"""What a real SQL Server does that a friendlier stand-in would not, through the whole capture path.

Run against the emulator here and, unchanged, against a real server by
``tests/integration/sqlserver_real/test_real_behaviours_real.py`` (``AIRFLOW_CDC_SQLSERVER_URL``):

1. deferred updates: a delete and an insert sharing one commit LSN *and* one ``__$seqval``;
2. a new capture instance whose ``start_lsn`` is NULL until the capture job's next scan;
3. ``cdc.lsn_time_mapping`` in the server's local time, and filler rows (``tran_id = 0x00``);
4. large values NULL in deletes and before-images, computed columns NULL in every change row.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import pytest

from airflow_cdc.core.pipeline import build_config, build_store
from airflow_cdc.sources.sqlserver.source import SqlServerSource
from tests.integration.sqlserver.targets import Column, Target
from tests.support.pipeline import assert_rows_equal, replay, run_capture, snapshot_pending

pytestmark = pytest.mark.integration


def drain(config: dict[str, Any]) -> None:
    """Capture until the snapshot is done and a run finds nothing more."""
    for _ in range(20):
        result = run_capture(config)
        if not snapshot_pending(config) and not result.events and not result.snapshot_rows:
            return
    raise AssertionError("captures did not settle")


def streamed(target: Target, config: dict[str, Any], table: str) -> list[dict[str, Any]]:
    return [e for e in target.staged_events(config, table) if e["op"] != "r"]


def source_rows(target: Target, table: str, columns: list[str]) -> dict[tuple, dict[str, Any]]:
    return {(r[0],): dict(zip(columns, r, strict=True)) for r in target.rows(table, columns)}


def test_deferred_updates_get_distinct_positions_and_converge(target: Target) -> None:
    """A key change (and, where the server logs it so, an update of a unique column) is a delete
    and an insert at one change position: Debezium numbers them 1 and 2, so the insert is newer."""
    t, table, cols = target, "dbo.acct", ["id", "code", "v"]
    t.create_table(table, [Column("id", "int"), Column("code", "nvarchar(20)"), Column("v", "int")],
                   ["id"], unique=[["code"]])  # fmt: skip
    t.enable(table)
    t.write(*[f"INSERT INTO dbo.acct (id, code, v) VALUES ({i}, 'c{i}', {i})" for i in range(1, 11)])
    t.run_capture_job()
    config = t.config(**{"incremental.snapshot.chunk.size": 4})
    drain(config)
    t.write("UPDATE dbo.acct SET id = 100 WHERE id = 1",
            "UPDATE dbo.acct SET code = 'moved', v = 0 WHERE id = 2",
            "DELETE FROM dbo.acct WHERE id = 5",
            "UPDATE dbo.acct SET id = 5, v = 55 WHERE id = 6",
            "UPDATE dbo.acct SET v = v + 1 WHERE id = 7")  # fmt: skip
    t.write("UPDATE dbo.acct SET id = 6 WHERE id = 5", "UPDATE dbo.acct SET id = 200 WHERE id = 8")
    t.run_capture_job()
    drain(config)
    events = streamed(t, config, table)
    positions = [e["__position"] for e in events]
    assert len(set(positions)) == len(positions), "two events share a position: silver's choice is arbitrary"
    at: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        at[(e["source"]["commit_lsn"], e["source"]["change_lsn"])].append(e)
    pairs = [g for g in at.values() if len(g) > 1]
    assert pairs, "no deferred update (delete + insert at one change position) was logged"
    for group in pairs:
        assert [e["op"] for e in group] == ["d", "c"]
        assert [e["source"]["event_serial_no"] for e in group] == [1, 2]
        assert group[0]["__position"] < group[1]["__position"]
    assert_rows_equal(table, source_rows(t, table, cols), replay(config).rows(t.staged(table)))


def test_capture_instance_without_start_lsn_loses_nothing(target: Target) -> None:
    """Between ``sys.sp_cdc_enable_table`` and the capture job's next scan the new instance's start
    is NULL: the older instance still covers the window, and the start that appears later is no
    purge."""
    t, table = target, "dbo.items"
    t.create_table(table, [Column("id", "int"), Column("v", "nvarchar(40)")], ["id"])
    t.enable(table)
    t.write(*[f"INSERT INTO dbo.items (id, v) VALUES ({i}, 'v{i}')" for i in range(1, 6)])
    t.run_capture_job()
    config = t.config()
    drain(config)
    t.write("UPDATE dbo.items SET v = 'before the new instance' WHERE id = 1")
    t.run_capture_job()
    t.add_column(table, "note", "nvarchar(20)")
    t.enable(table, capture_instance="dbo_items_v2")
    assert t.start_lsn("dbo_items_v2") is None  # not established until the capture job scans
    run_capture(config)
    cfg = build_config(config)
    stored = build_store(cfg).load(cfg.state_name)
    assert stored is not None and "dbo_items_v2" not in stored.data["offset"]["capture_instance_starts"]
    t.run_capture_job()
    assert t.start_lsn("dbo_items_v2") is not None
    t.write("UPDATE dbo.items SET v = 'new instance', note = 'n' WHERE id = 2")
    t.run_capture_job()
    drain(config)  # no OffsetUnavailable: the instance's start was never stored as 0
    rows = replay(config).rows(t.staged(table))
    assert rows[(1,)]["v"] == "before the new instance"
    assert (rows[(2,)]["v"], rows[(2,)]["note"]) == ("new instance", "n")
    assert [(k[0], r["v"]) for k, r in sorted(rows.items())] == sorted(t.rows(table, ["id", "v"]))


def test_commit_times_are_utc_and_filler_rows_wake_nothing(target: Target) -> None:
    """``tran_end_time`` is the server's local clock: ``source.ts_ms`` is UTC all the same.  A scan
    that found nothing writes a filler row that moves ``fn_cdc_get_max_lsn()``: no change for the
    sensor."""
    t, table = target, "dbo.clock"
    t.create_table(table, [Column("id", "int"), Column("v", "int")], ["id"])
    t.enable(table)
    t.write("INSERT INTO dbo.clock (id, v) VALUES (1, 0)")
    t.run_capture_job()
    config = t.config()
    drain(config)
    before = time.time()
    t.write("UPDATE dbo.clock SET v = 1 WHERE id = 1")
    after = time.time()
    t.run_capture_job()
    drain(config)
    (event,) = streamed(t, config, table)
    # generous bounds for a real server's clock skew; a zone offset is 30 minutes or more
    assert before * 1000 - 60_000 <= event["source"]["ts_ms"] <= after * 1000 + 60_000
    t.run_capture_job()  # nothing captured: at most a filler row
    t.run_capture_job()
    cfg = build_config(config)
    stored = build_store(cfg).load(cfg.state_name)
    assert stored is not None
    source = SqlServerSource(cfg)
    source.open()
    try:
        assert not source.changes_after(stored.data["offset"])
    finally:
        source.close()
    t.write("UPDATE dbo.clock SET v = 2 WHERE id = 1")
    t.run_capture_job()
    source.open()
    try:
        assert source.changes_after(stored.data["offset"])
    finally:
        source.close()


DOCS = [Column("id", "int"), Column("qty", "int"), Column("total", "int", ("[qty] * 2", "qty * 2")),
        Column("t", "text"), Column("nt", "ntext"), Column("img", "image"), Column("big", "nvarchar(max)"),
        Column("vb", "varbinary(max)"), Column("small", "nvarchar(10)")]  # fmt: skip
DATA = [c.name for c in DOCS if c.name != "total"]
LOBS = ("t", "nt", "img", "big", "vb")


def test_large_values_and_computed_columns(target: Target) -> None:
    """text/ntext/image NULL in deletes and before-images, unchanged (max) values NULL in
    before-images, computed columns NULL everywhere -- snapshot rows too, so silver does not flip."""
    t, table = target, "dbo.docs"
    t.create_table(table, DOCS, ["id"])
    t.enable(table)

    def insert(i: int) -> str:
        blob = t.binary(bytes([i]) * 300)
        return (f"INSERT INTO dbo.docs (id, qty, t, nt, img, big, vb, small) VALUES ({i}, {i}, 'text {i}',"
                f" 'ntext {i}', {blob}, {t.repeat(f'b{i}', 3000)}, {blob}, 's{i}')")  # fmt: skip

    t.write(*[insert(i) for i in range(1, 7)])
    t.run_capture_job()
    config = t.config(**{"incremental.snapshot.chunk.size": 4})
    drain(config)
    t.write("UPDATE dbo.docs SET qty = 11, small = 'x' WHERE id = 1",
            f"UPDATE dbo.docs SET big = {t.repeat('z', 5000)} WHERE id = 2",
            "DELETE FROM dbo.docs WHERE id = 3")  # fmt: skip
    t.write("UPDATE dbo.docs SET id = 40 WHERE id = 4", insert(7))
    t.run_capture_job()
    drain(config)
    events = {(e["op"], (e["after"] or e["before"])["id"]): e for e in streamed(t, config, table)}
    plain = events[("u", 1)]
    assert all(plain["before"][c] is None for c in LOBS), plain["before"]
    assert plain["before"]["qty"] == 1 and plain["after"]["t"] == "text 1" and plain["after"]["big"]
    changed = events[("u", 2)]
    assert changed["before"]["big"] == "b2" * 3000 and changed["before"]["t"] is None
    deleted = events[("d", 3)]
    assert deleted["before"]["t"] is None and deleted["before"]["nt"] is None and deleted["before"]["img"] is None
    assert deleted["before"]["big"] == "b3" * 3000 and deleted["before"]["vb"] == bytes([3]) * 300
    replayed = replay(config).rows(t.staged(table))
    assert all(r["total"] is None for r in replayed.values())  # snapshot rows (5, 6) as change rows
    expected = {k: dict(r, total=None) for k, r in source_rows(t, table, DATA).items()}
    for r in expected.values():
        r["img"], r["vb"] = bytes(r["img"]), bytes(r["vb"])
    assert_rows_equal(table, expected, replayed)

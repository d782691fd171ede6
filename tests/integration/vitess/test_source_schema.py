"""VitessSource schema and table changes through the capture core: a DDL (new FIELD event) starts a
new part with the new columns, a table created mid-stream is streamed and then copied, and the
sensor's cheap check compares VGTIDs."""

from __future__ import annotations

from pathlib import Path

from airflow_cdc.core.pipeline import build_config, build_source
from tests.integration.vitess.capture_support import SCHEMA, order_values, shard_rows, vitess_props
from tests.support.pipeline import assert_rows_equal, replay, run_capture

INSERT = "INSERT INTO orders VALUES (%s, %s, %s, %s, %s, %s, %s)"


def test_ddl_new_table_and_sensor_check(vtgate, shard_servers, keyspace, tmp_path: Path):
    ks = keyspace
    vtgate.add_keyspace(ks, {"0": shard_servers[0]}, SCHEMA)
    props = vitess_props(vtgate, ks, tmp_path)
    source = build_source(build_config(props))
    assert source.changes_after(None)
    first = run_capture(props)
    assert not source.changes_after(first.to_offset), "nothing written since the commit"
    vtgate.execute(ks, INSERT, order_values(1))
    assert source.changes_after(first.to_offset)
    vtgate.execute_all(ks, "ALTER TABLE orders ADD COLUMN extra INT NULL")
    vtgate.execute(ks, "INSERT INTO orders (id, item, extra) VALUES (2, 'x', 7)")
    vtgate.execute_all(ks, "CREATE TABLE later (k INT PRIMARY KEY, v VARCHAR(5))")
    vtgate.execute(ks, "INSERT INTO later VALUES (1, 'a'), (2, 'b')")
    second = run_capture(props)
    # the new table is listed at the run's start: copied in this run (the copy drops its binlog rows)
    assert second.tables[f"{ks}.orders"] == {"c": 2} and second.tables[f"{ks}.later"] == {"r": 2}
    assert any("later" in n and "snapshot scheduled" in n for n in second.notes)
    vtgate.execute(ks, "UPDATE later SET v = 'z' WHERE k = 2")
    third = run_capture(props)
    assert third.snapshot_rows == 0 and third.tables[f"{ks}.later"] == {"u": 1}
    assert not source.changes_after(third.to_offset)
    oracle = replay(props)
    assert oracle.rows(f"{ks}.later") == {(1,): {"k": 1, "v": "a"}, (2,): {"k": 2, "v": "z"}}
    got = oracle.rows(f"{ks}.orders")
    assert got[(2,)]["extra"] == 7 and "extra" not in got[(1,)]
    assert_rows_equal("orders", shard_rows(vtgate, ks), got, lenient_columns=True)


def test_adhoc_snapshot_signal_recopies_one_table(vtgate, shard_servers, keyspace, tmp_path: Path):
    ks = keyspace
    vtgate.add_keyspace(ks, {"-80": shard_servers[1], "80-": shard_servers[2]},
                        [*SCHEMA, "CREATE TABLE other (id BIGINT PRIMARY KEY)"])  # fmt: skip
    for i in range(1, 11):
        vtgate.execute(ks, INSERT, order_values(i), key=i)
        vtgate.execute(ks, "INSERT INTO other VALUES (%s)", (i,), key=i)
    props = vitess_props(vtgate, ks, tmp_path, **{"run.max.events": 6})
    # every shard done: a table still copying on one shard is copied again on the others (vtgate's
    # tables_to_copy names it for the whole call)
    while any(g.get("table_p_ks") for g in run_capture(props).to_offset["vgtid"]):
        pass
    vtgate.execute(ks, "DELETE FROM orders WHERE id = 3", key=3)
    signal = {"execute-snapshot": {"data-collections": [f"{ks}.orders"]}}
    results = [run_capture(props, signals=[signal])]
    while any(g.get("table_p_ks") for g in results[-1].to_offset["vgtid"]):
        results.append(run_capture(props))
    assert len(results) >= 2, "the ad hoc copy spread over runs"
    assert sum(r.snapshot_rows for r in results) == 9
    assert all(f"{ks}.other" not in r.tables or "r" not in r.tables[f"{ks}.other"] for r in results)
    assert any(f"snapshot of {ks}.orders complete: 9 rows" in n for r in results for n in r.notes)
    assert_rows_equal("orders", shard_rows(vtgate, ks), replay(props).rows(f"{ks}.orders"))

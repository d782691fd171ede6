"""VitessSource end to end through the capture core: the copy phase as the snapshot, spread over many
runs while writers run on two shards; every op; the envelope and ``source`` block; offsets."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.pipeline import build_config, build_store
from tests.integration.vitess.capture_support import SCHEMA, order_values, shard_rows, vitess_props
from tests.support.pipeline import assert_rows_equal, replay, run_capture

INSERT = "INSERT INTO orders VALUES (%s, %s, %s, %s, %s, %s, %s)"


@pytest.fixture
def sharded(vtgate, shard_servers, keyspace):
    vtgate.add_keyspace(keyspace, {"-80": shard_servers[1], "80-": shard_servers[2]}, SCHEMA)
    for i in range(1, 41):
        vtgate.execute(keyspace, INSERT, order_values(i), key=i)
    return keyspace


def _writer(vtgate, ks, seed, stop, errors):
    rng = random.Random(seed)
    version = 0
    try:
        while not stop.is_set():
            key, action, version = rng.randrange(1, 70), rng.random(), version + 1
            if action < 0.4:
                vtgate.execute(
                    ks,
                    INSERT + " ON DUPLICATE KEY UPDATE item = VALUES(item), qty = VALUES(qty)",
                    order_values(key, version),
                    key=key,
                )
            elif action < 0.8:
                vtgate.execute(
                    ks,
                    "UPDATE orders SET qty = qty + 1, note = %s WHERE id = %s",
                    (f"v{version}", key),
                    key=key,
                )
            else:
                vtgate.execute(ks, "DELETE FROM orders WHERE id = %s", (key,), key=key)
            time.sleep(0.005)  # two shared cores: leave the capture some
    except BaseException as e:  # surfaced by the test
        errors.append(e)


def test_copy_phase_over_many_runs_with_concurrent_writers(vtgate, sharded, tmp_path: Path):
    ks = sharded
    props = vitess_props(vtgate, ks, tmp_path, **{"run.max.events": 15})
    stop, errors = threading.Event(), []
    writers = [threading.Thread(target=_writer, args=(vtgate, ks, s, stop, errors)) for s in (1, 2)]
    for w in writers:
        w.start()
    runs, copying_runs = 0, 0
    try:
        while runs < 60:
            runs += 1
            result = run_capture(props)
            if any(g.get("table_p_ks") for g in result.to_offset["vgtid"]):
                copying_runs += 1
            elif copying_runs:
                break
    finally:
        stop.set()
        for w in writers:
            w.join()
    assert not errors
    assert copying_runs >= 3, "the copy was not spread over several runs"
    store = build_store(build_config(props))
    state = store.load(props["name"]).data
    assert state["snapshot"]["pending"] == [] and state["snapshot"]["initial_done"]
    assert [c["table"] for c in state["snapshot"]["completed"]] == [f"{ks}.orders"]
    while run_capture(props).events:  # drain what the writers left
        pass
    oracle = replay(props)
    assert_rows_equal("orders", shard_rows(vtgate, ks), oracle.rows(f"{ks}.orders"))


def test_every_op_and_the_source_block(vtgate, shard_servers, keyspace, tmp_path: Path):
    ks = keyspace
    vtgate.add_keyspace(ks, {"0": shard_servers[0]}, SCHEMA)
    vtgate.execute(ks, INSERT, order_values(1))
    props = vitess_props(vtgate, ks, tmp_path, **{"provide.transaction.metadata": True})
    first = run_capture(props)
    assert first.snapshot_rows == 1 and first.events == 0
    vtgate.execute(ks, INSERT, order_values(2))
    vtgate.execute(ks, "UPDATE orders SET qty = 99 WHERE id = 2")
    vtgate.execute(ks, "UPDATE orders SET id = 3 WHERE id = 2")  # a key change: d + c
    vtgate.execute(ks, "DELETE FROM orders WHERE id = 1")
    second = run_capture(props)
    assert second.tables[f"{ks}.orders"] == {"c": 2, "u": 1, "d": 2}
    batches = list_batches(props["staging.path"], props["name"])
    rows = [r for rb in batches[-1].iter_events(f"{ks}.orders") for r in rb.to_pylist()]
    assert [r["op"] for r in rows] == ["c", "u", "d", "c", "d"]
    src = rows[0]["source"]
    assert src["connector"] == "vitess" and src["keyspace"] == ks and src["table"] == "orders"
    assert src["shard"] == "0" and src["snapshot"] == "false" and src["db"] == ""
    assert json.loads(src["vgtid"])[0]["shard"] == "0"
    assert rows[0]["after"]["price"] == "2.00" and rows[0]["after"]["raw"] == bytes([2, 0])
    assert rows[3]["__old_key"] == {"id": 2} and rows[3]["after"]["id"] == 3
    assert rows[0]["transaction"]["id"] == src["vgtid"]
    positions = [r["__position"] for r in rows]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    snap = [r for rb in batches[0].iter_events(f"{ks}.orders") for r in rb.to_pylist()]
    assert [r["op"] for r in snap] == ["r"] and snap[0]["source"]["snapshot"] == "true"
    assert snap[0]["__position"] < positions[0]
    assert second.to_offset["vgtid"][0]["gtid"].startswith("MySQL56/")
    assert_rows_equal("orders", shard_rows(vtgate, ks), replay(props).rows(f"{ks}.orders"))


def test_uncommitted_batch_rows_are_voided(vtgate, shard_servers, keyspace, tmp_path: Path):
    """A batch published (and maybe applied) but never committed copied keys beyond the committed
    last copied key; the retry's catch-up drops their deletes, so the retry stages deletes for them."""
    ks = keyspace
    vtgate.add_keyspace(ks, {"0": shard_servers[0]}, SCHEMA)
    for i in range(1, 31):
        vtgate.execute(ks, INSERT, order_values(i))
    props = vitess_props(vtgate, ks, tmp_path, **{"run.max.events": 4})
    run_capture(props)  # committed: the copy stopped after a few rows
    orphan = run_capture(props, commit=False)  # copies further, never committed
    assert orphan.snapshot_rows >= 4
    copied = [
        r["after"]["id"]
        for rb in list_batches(props["staging.path"], props["name"])[-1].iter_events(f"{ks}.orders")
        for r in rb.to_pylist()
    ]
    gone = max(copied)
    vtgate.execute(ks, "DELETE FROM orders WHERE id = %s", (gone,))
    retry = run_capture(props)
    manifest = list_batches(props["staging.path"], props["name"])[-1].manifest
    assert retry.committed and any("void" in n for n in manifest["vitess"]["notes"])
    while (
        build_store(build_config(props)).load(props["name"]).data["snapshot"]["pending"]
        or run_capture(props).events
    ):
        run_capture(props)
    rows = replay(props).rows(f"{ks}.orders")
    assert (gone,) not in rows
    assert_rows_equal("orders", shard_rows(vtgate, ks), rows)

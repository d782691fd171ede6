"""Issue 38 on Vitess (the vtgate emulator over two shards): the connector metrics after known work
(the copy phase part-way, N events) and the guard on the committed VGTID's age."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from airflow_cdc.core.health import source_check
from airflow_cdc.core.pipeline import build_config, build_store
from tests.integration.vitess.capture_support import SCHEMA, order_values, vitess_props
from tests.support.pipeline import run_capture

INSERT = "INSERT INTO orders VALUES (%s, %s, %s, %s, %s, %s, %s)"


def test_metrics_after_known_work_and_the_position_age_guard(
    vtgate: Any, shard_servers: Any, keyspace: str, tmp_path: Path
) -> None:
    vtgate.add_keyspace(keyspace, {"-80": shard_servers[1], "80-": shard_servers[2]}, SCHEMA)
    for i in range(1, 9):
        vtgate.execute(keyspace, INSERT, order_values(i), key=i)
    props = vitess_props(
        vtgate, keyspace, tmp_path, **{"run.max.events": 4, "retained.log.max.age.ms": 600_000}
    )
    config = build_config(props)
    table = f"{keyspace}.orders"

    run = run_capture(props).metrics  # the copy phase, part-way
    snap = run.to_json()["snapshot"]
    assert (snap["TotalTableCount"], snap["RemainingTableCount"], snap["SnapshotRunning"]) == (1, 1, 1)
    assert 0 < snap["tables"][table]["RowsScanned"] == snap["TotalNumberOfEventsSeen"] < 8
    while run.get("snapshot", "SnapshotRunning"):
        run = run_capture(props).metrics
    done = run.to_json()["snapshot"]
    assert (done["RemainingTableCount"], done["SnapshotCompleted"], done["tables"][table]["RowsScanned"]) == (
        0,
        1,
        8,
    )

    vtgate.execute(keyspace, INSERT, order_values(100), key=100)  # 4 events in 4 transactions
    vtgate.execute(keyspace, INSERT, order_values(200), key=200)
    vtgate.execute(keyspace, "UPDATE orders SET qty = 0 WHERE id = %s", (1,), key=1)
    vtgate.execute(keyspace, "DELETE FROM orders WHERE id = %s", (2,), key=2)
    s = run_capture(props).metrics.to_json()["streaming"]
    assert s["TotalNumberOfEventsSeen"] == 4 and s["tables"][table]["TotalNumberOfEventsSeen"] == 4
    counts = (
        s["TotalNumberOfCreateEventsSeen"],
        s["TotalNumberOfUpdateEventsSeen"],
        s["TotalNumberOfDeleteEventsSeen"],
    )
    assert counts == (2, 1, 1) and s["Connected"] == 1
    assert 0 <= s["MilliSecondsBehindSource"] < 60_000

    stored = build_store(config).load(config.state_name)
    assert stored is not None
    rec, verdict = source_check(config, dict(stored.data))
    assert "VGTID of 2 shard(s)" in rec.get("source", "RetainedLogDetail") and not verdict.tripped
    assert rec.get("source", "RetainedLogBytes") is None  # vtgate tells no binlog sizes: the age decides
    age = rec.get("source", "PositionAgeMs")
    time.sleep(0.2)  # an idle pipeline: the committed position ages
    tight = build_config({**props, "retained.log.max.age.ms": age + 100})
    rec, verdict = source_check(tight, dict(stored.data))
    assert verdict.tripped and rec.get("source", "PositionAgeMs") >= age + 200
    assert f"retained.log.max.age.ms={age + 100}" in verdict.message

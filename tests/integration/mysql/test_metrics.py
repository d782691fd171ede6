"""Issue 38 on MariaDB: the connector metrics after known work (a snapshot part-way, N events, an
idle period with writes elsewhere), and the guard on the binlog held behind the committed offset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.core.health import source_check, status_metrics
from airflow_cdc.core.pipeline import build_capture, build_config
from tests.integration.mysql import support as my

pytestmark = pytest.mark.integration


def _state(config: Any) -> dict[str, Any]:
    stored = build_capture(config).store.load(config.state_name)
    assert stored is not None
    return dict(stored.data)


def test_metrics_after_known_work_and_the_binlog_guard(mariadb_db: Any, tmp_path: Path) -> None:
    my.execute(
        mariadb_db,
        "CREATE TABLE a (id int PRIMARY KEY, v varchar(10))",
        "CREATE TABLE b (id int PRIMARY KEY, v varchar(10))",
        "INSERT INTO a VALUES " + ",".join(f"({i}, 'a')" for i in range(1, 13)),
        "INSERT INTO b VALUES " + ",".join(f"({i}, 'b')" for i in range(1, 5)),
    )
    raw = my.pipeline(
        mariadb_db,
        tmp_path / "staging",
        **{
            "incremental.snapshot.chunk.size": 4,
            "snapshot.max.rows.per.run": 8,
            "retained.log.max.bytes": 400_000,
            "custom.metric.tags": "env=ci",
        },
    )
    config = build_config(raw)

    first = my.run_capture(raw)  # a snapshot part-way: two chunks of a
    snap = first.metrics.to_json()["snapshot"]
    assert (snap["TotalTableCount"], snap["RemainingTableCount"], snap["SnapshotRunning"]) == (2, 2, 1)
    assert snap["TotalNumberOfEventsSeen"] == 8 and snap["tables"][f"{mariadb_db.name}.a"]["RowsScanned"] == 8
    assert (snap["ChunkFrom"], snap["ChunkTo"], snap["TableTo"]) == ("4", "8", "12")
    while my.run_capture(raw).metrics.get("snapshot", "SnapshotRunning"):
        pass

    my.execute(  # N = 5 events in 3 transactions
        mariadb_db,
        "INSERT INTO a VALUES (100, 'n'), (101, 'n')",
        "UPDATE b SET v = 'u' WHERE id IN (1, 2)",
        "DELETE FROM a WHERE id = 100",
    )
    work = my.run_capture(raw).metrics
    s = work.to_json()["streaming"]
    assert (s["TotalNumberOfEventsSeen"], s["NumberOfCommittedTransactions"]) == (5, 3)
    assert (s["TotalNumberOfCreateEventsSeen"], s["TotalNumberOfUpdateEventsSeen"], s["TotalNumberOfDeleteEventsSeen"]) == (
        2, 2, 1,
    )  # fmt: skip
    assert s["tables"][f"{mariadb_db.name}.b"]["TotalNumberOfUpdateEventsSeen"] == 2
    assert 0 <= s["MilliSecondsBehindSource"] < 60_000 and s["Connected"] == 1
    assert s["LastTransactionId"]  # the GTID set at the end offset
    assert {p.tags["env"] for p in work.points()} == {"ci"}

    # -- idle captured database, writes elsewhere on the server: the binlog grows behind the offset
    other = mariadb_db.server.create_database(f"{mariadb_db.name}_x")
    try:
        mariadb_db.server.execute("CREATE TABLE filler (id int PRIMARY KEY, pad text)", database=other)
        for statement in (
            "INSERT INTO filler SELECT seq, REPEAT('x', 1000) FROM seq_1_to_200",
            "UPDATE filler SET pad = REPEAT('y', 1000)",
            "UPDATE filler SET pad = REPEAT('z', 1000)",
        ):
            mariadb_db.server.execute(statement, database=other)
            mariadb_db.server.execute("FLUSH BINARY LOGS")
    finally:
        mariadb_db.server.drop_database(other)
    rec, verdict = source_check(config, _state(config))
    assert rec.get("source", "RetainedLogFiles") >= 4  # the committed file and three rotations
    assert rec.get("source", "RetainedLogBytes") >= 400_000 and rec.get("source", "BehindBytes") >= 400_000
    assert verdict.tripped and "retained.log.max.bytes=400000" in verdict.message
    assert "binlog file(s) from" in verdict.message and rec.get("source", "RetainedLogLimitAgeMs") == 0

    idle = my.run_capture(raw).metrics  # nothing captured, but the offset moves to the head
    assert idle.get("streaming", "TotalNumberOfEventsSeen") == 0
    state = _state(config)
    rec, verdict = source_check(config, state)
    assert not verdict.tripped and rec.get("source", "RetainedLogFiles") == 1
    assert rec.get("source", "BehindBytes") < 10_000
    live = status_metrics(config, state)
    assert live["now"]["streaming"]["Connected"] == 1 and live["guard"]["tripped"] is False
    assert live["last"]["commit"]["metrics"]["staging"]["BatchesNotApplied"] == 0

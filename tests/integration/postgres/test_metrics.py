"""Issue 38: the connector metrics after known work on PostgreSQL, the retained-WAL guard, and
``heartbeat.action.query`` on an idle captured database.

One database per test (``pg_db``); the session server is shared.  Values are read back the three
ways a user reads them: the run's recorder (what is exported to Airflow), the metrics file
(``status --offline``) and ``status --json`` with live queries.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_cdc import cli
from airflow_cdc.core.batch import Batch
from airflow_cdc.core.errors import RetainedLogExceeded
from airflow_cdc.core.health import source_check
from airflow_cdc.core.pipeline import build_capture, build_config
from airflow_cdc.sources.postgres.source import PostgresSource
from tests.integration.postgres import support as pg

pytestmark = pytest.mark.integration


def _exec(db: Any, *statements: str) -> None:
    with db.connect(autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _status(config: dict[str, Any], tmp_path: Path, capsys: Any, *extra: str) -> dict[str, Any]:
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(config))
    capsys.readouterr()
    assert cli.main(["status", "--config", str(path), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)["metrics"]


def _write_elsewhere(db: Any, megabytes: int) -> None:
    """WAL from another database of the same server: nothing the connector captures."""
    other = db.server.create_database(f"{db.name}_x")
    try:
        pg.execute(
            other,
            "CREATE TABLE filler (id int, pad text)",
            f"INSERT INTO filler SELECT g, repeat('x', 1000) FROM generate_series(1, {megabytes * 1000}) g",
        )
    finally:
        db.server.drop_database(f"{db.name}_x")


def test_metrics_after_snapshot_part_way_known_events_and_an_idle_period(pg_db, tmp_path, capsys):
    _exec(
        pg_db,
        "CREATE TABLE a (id int PRIMARY KEY, v text)",
        "CREATE TABLE b (id int PRIMARY KEY, v text)",
        "CREATE TABLE c (id int PRIMARY KEY, v text)",
        "INSERT INTO a SELECT g, 'a' FROM generate_series(1, 20) g",
        "INSERT INTO b SELECT g, 'b' FROM generate_series(1, 20) g",
        "INSERT INTO c SELECT g, 'c' FROM generate_series(1, 5) g",
    )
    config = pg.pipeline(
        pg_db,
        tmp_path / "staging",
        **{
            "incremental.snapshot.chunk.size": 5,
            "snapshot.max.rows.per.run": 25,
            "statistics.metrics.enabled": True,
            "custom.metric.tags": "env=test,team=data",
        },
    )

    # -- a snapshot part-way: a's 20 rows and b's first chunk
    first = pg.run_capture(config)
    snap = first.metrics.to_json()["snapshot"]
    assert first.snapshot_rows == snap["TotalNumberOfEventsSeen"] == 25
    assert (snap["TotalTableCount"], snap["RemainingTableCount"]) == (3, 2)
    assert (snap["SnapshotRunning"], snap["SnapshotCompleted"], snap["SnapshotAborted"]) == (1, 0, 0)
    assert snap["tables"]["public.a"]["RowsScanned"] == 20 and snap["tables"]["public.b"]["RowsScanned"] == 5
    assert snap["ChunkTo"] == "5" and snap["ChunkFrom"] == "" and snap["TableTo"] == "20"
    assert snap["ChunkId"].endswith("-1") and snap["LastEvent"].startswith("public.b key (5) at position")
    points = {p.name: p for p in first.metrics.points()}
    remaining = points["airflow_cdc.snapshot.RemainingTableCount"]
    assert remaining.value == 2
    assert remaining.tags == {
        "connector": config["name"], "server": config["name"], "context": "snapshot", "env": "test", "team": "data",
    }  # fmt: skip

    while pg.run_capture(config).metrics.get("snapshot", "SnapshotRunning"):
        pass
    done = build_capture(config).run(commit=True).metrics.to_json()["snapshot"]
    assert (done["TotalTableCount"], done["RemainingTableCount"], done["SnapshotCompleted"]) == (3, 0, 1)
    assert {t: v["RowsScanned"] for t, v in done["tables"].items()} == {
        "public.a": 20, "public.b": 20, "public.c": 5,
    }  # fmt: skip

    # -- known work: 3 creates, 2 updates, 1 delete in 4 transactions on one table
    _exec(
        pg_db,
        "INSERT INTO a VALUES (21, 'n'), (22, 'n')",
        "INSERT INTO a VALUES (23, 'n')",
        "UPDATE a SET v = 'u' WHERE id IN (1, 2)",
        "DELETE FROM a WHERE id = 3",
    )
    work = pg.run_capture(config)
    s = work.metrics.to_json()["streaming"]
    assert (s["TotalNumberOfEventsSeen"], s["NumberOfCommittedTransactions"]) == (6, 4)
    assert (s["TotalNumberOfCreateEventsSeen"], s["TotalNumberOfUpdateEventsSeen"]) == (3, 2)
    assert s["TotalNumberOfDeleteEventsSeen"] == 1 and s["tables"]["public.a"]["TotalNumberOfEventsSeen"] == 6
    assert s["Connected"] == 1 and s["LastEvent"].startswith("public.a at position")
    assert 0 <= s["MilliSecondsBehindSource"] < 60_000 and 0 <= s["MilliSecondsSinceLastEvent"] < 60_000
    assert s["MilliSecondsBehindSourceMinValue"] <= s["MilliSecondsBehindSourceP50"]
    assert s["MilliSecondsBehindSourceP99"] <= s["MilliSecondsBehindSourceMaxValue"]
    assert s["SourceEventPosition"] == PostgresSource(build_config(config)).describe_offset(work.to_offset)
    assert s["LastTransactionId"] == work.to_offset["txId"]

    saved = _status(config, tmp_path, capsys, "--offline")
    assert saved["last"]["capture"]["batch_id"] == work.batch_id
    assert saved["last"]["capture"]["metrics"]["streaming"]["TotalNumberOfEventsSeen"] == 6
    assert saved["last"]["capture"]["metrics"]["capture"]["DurationMs"] > 0
    commit = saved["last"]["commit"]["metrics"]
    assert commit["commit"]["DurationMs"] > 0 and commit["source"]["RetainedLogGuardTripped"] == 0
    assert commit["staging"]["BatchesNotApplied"] == 0 and "live_error" not in saved and "guard" not in saved

    # -- an idle period with writes in another database: the slot keeps their WAL until a run
    _write_elsewhere(pg_db, 2)
    held = _status(config, tmp_path, capsys)
    assert held["now"]["streaming"]["Connected"] == 1
    assert held["now"]["source"]["BehindBytes"] >= 2_000_000
    assert held["now"]["source"]["RetainedLogBytes"] >= held["now"]["source"]["BehindBytes"]
    assert held["now"]["source"]["PositionAgeMs"] >= 0 and held["guard"]["tripped"] is False
    idle = pg.run_capture(config)
    assert idle.metrics.get("streaming", "TotalNumberOfEventsSeen") == 0
    assert idle.metrics.get("streaming", "MilliSecondsBehindSource") is None  # no event, no lag to tell
    released = _status(config, tmp_path, capsys)["now"]["source"]
    assert released["BehindBytes"] < 100_000, released


def test_guard_fails_once_the_slot_holds_too_much_wal(pg_db, tmp_path):
    """The slot held behind (no run commits) while writes continue: the guard trips at the limit."""
    _exec(pg_db, "CREATE TABLE t (id int PRIMARY KEY, pad text)")
    config = pg.pipeline(pg_db, tmp_path / "staging", **{"retained.log.max.bytes": 3_000_000})
    pg.run_capture(config)
    built = build_config(config)
    state = build_capture(built).store.load(built.state_name)
    assert state is not None
    rec, verdict = source_check(built, state.data)
    assert not verdict.tripped and rec.get("source", "RetainedLogLimitBytes") == 3_000_000
    _exec(pg_db, "INSERT INTO t SELECT g, repeat('x', 1000) FROM generate_series(1, 4000) g")  # ~4.5 MB WAL
    rec, verdict = source_check(built, state.data)
    assert verdict.tripped and rec.get("source", "RetainedLogGuardTripped") == 1
    assert rec.get("source", "RetainedLogBytes") >= 3_000_000
    with pytest.raises(
        RetainedLogExceeded, match=r"keeps .* of log for the connector, over the limit"
    ) as err:
        _raise(built, state.data)
    assert config["slot.name"] in str(err.value) and "retained.log.max.bytes=3000000" in str(err.value)
    assert err.value.hint.startswith("get the pipeline committing again")
    pg.run_capture(config)  # the pipeline commits again: confirmed_flush_lsn moves to the head ...
    # ... and restart_lsn follows at the next running-transactions record decoded past it (a
    # checkpoint logs one; PostgreSQL frees WAL in such steps, as Debezium's docs say)
    _exec(pg_db, "CHECKPOINT")
    pg.run_capture(config)
    state = build_capture(built).store.load(built.state_name)
    assert state is not None and not source_check(built, state.data)[1].tripped


def _raise(config: Any, state: dict[str, Any]) -> None:
    """What the sensor does with the verdict."""
    _rec, verdict = source_check(config, state)
    if verdict.tripped:
        raise RetainedLogExceeded(verdict.message)


def test_idle_captured_database_heartbeat_releases_wal_written_elsewhere(pg_db, tmp_path):
    """Debezium's "WAL disk space consumption" case: the captured database is idle while another
    database of the server writes.  The slot sensor sees no published change, so no run moves the
    slot and its WAL grows; ``heartbeat.action.query`` writes a captured row, which the slot check
    sees, and the run that stages it commits the slot past everything written elsewhere."""
    _exec(
        pg_db,
        "CREATE TABLE heartbeat (id int PRIMARY KEY, ts timestamptz)",
        "INSERT INTO heartbeat VALUES (1, now())",
    )
    config = pg.pipeline(
        pg_db,
        tmp_path / "staging",
        **{"heartbeat.action.query": "UPDATE heartbeat SET ts = now() WHERE id = 1"},
    )
    pg.run_capture(config)
    built = build_config(config)
    store = build_capture(built).store
    _write_elsewhere(pg_db, 2)
    state = store.load(built.state_name)
    assert state is not None
    source = PostgresSource(built)
    assert not source.changes_after(state.data["offset"], "slot")  # idle: the sensor would never fire
    grown = source_check(built, state.data)[0].get("source", "RetainedLogBytes")
    assert grown >= 2_000_000
    beat = build_capture(built).run(commit=False)  # a run's heartbeat: one captured update
    assert beat.metrics.get("streaming", "TotalNumberOfUpdateEventsSeen") == 1
    assert source.changes_after(state.data["offset"], "slot")  # now the slot check fires
    build_capture(built).commit(Batch(beat.batch_path))
    state = store.load(built.state_name)
    assert state is not None
    assert source_check(built, state.data)[0].get("source", "BehindBytes") < 100_000  # confirmed at the head
    # the slot's restart_lsn (what the server keeps) moves at the next running-transactions record
    # decoded past it: a checkpoint logs one, and the next heartbeat run decodes and commits past it
    _exec(pg_db, "CHECKPOINT")
    pg.run_capture(config)
    state = store.load(built.state_name)
    assert state is not None
    assert source_check(built, state.data)[0].get("source", "RetainedLogBytes") < 1_000_000 < grown

"""Capture from a read-only MariaDB replica (``read.only=true``, Debezium's read-only incremental
snapshots): a GTID replica with ``log_slave_updates`` and ``read_only=ON``, a connector user with only
SELECT, REPLICATION SLAVE and REPLICATION CLIENT, writers and ALTER TABLE on the primary.  A chunked
initial snapshot over many runs, ad hoc snapshots asked by a signal-table row (inserted on the
primary, arriving through replication) and by an ``execute-snapshot`` run signal, SIGKILLs at random
points, replication stopped or lagging mid-snapshot: the replayed batches equal the primary row by
row, and the replica's general log and binlog show that the connector wrote nothing.  A writing
``heartbeat.action.query`` fails the run, even for a user whose privileges pass ``read_only=ON``."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.errors import ConfigError
from tests.integration.mysql.replica_support import PrimaryDb, ReplicaPair
from tests.integration.mysql.support import execute, replay, run_capture, source_rows
from tests.integration.mysql.test_convergence import ODD_NAME, Writers, schema
from tests.support.pipeline import CrashRuns, assert_rows_equal, snapshot_pending

pytestmark = pytest.mark.integration
ROWS, ODD_ROWS = 12_000, 6_000
SIGNAL_DDL = "CREATE TABLE dbz_signal (id varchar(64) PRIMARY KEY, type varchar(32), data varchar(2048))"
FAILPOINTS = "after_batch_write:0.25,after_state_commit:0.25,mid_window:0.1"


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicaPair]:
    servers = ReplicaPair()
    try:
        yield servers
    finally:
        servers.stop()


class SignalCrashRuns(CrashRuns):
    """Crash runs that deliver ``signal`` (an ``execute-snapshot`` run signal, as a DAG run's conf
    gives it) with every run until one completes cleanly, as Airflow retries a failed run."""

    signal: dict[str, Any] | None = None

    def start(self) -> subprocess.Popen:
        if self.signal is None:
            return super().start()
        env = dict(os.environ, AIRFLOW_CDC_FAILPOINTS=self.failpoints if self.armed else "")
        argv = ["capture", "--config", str(self.config_path), "--commit", "--signal", json.dumps(self.signal)]
        return subprocess.Popen(
            [sys.executable, "-m", "airflow_cdc.cli", *argv],
            env={**env, "PYTHONFAULTHANDLER": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def wait(self, proc: subprocess.Popen) -> None:
        clean = self.clean
        super().wait(proc)
        if self.clean > clean:
            self.signal = None


class ReplicationFlapper:
    """Stops the replica's SQL thread now and then (lag, then catching up) while runs go on."""

    def __init__(self, pair: ReplicaPair, rng: random.Random) -> None:
        self.pair, self.rng, self.stop = pair, rng, threading.Event()
        self.thread = threading.Thread(target=self._flap, daemon=True)
        self.stops = 0

    def _flap(self) -> None:
        while not self.stop.wait(1 + 3 * self.rng.random()):
            self.pair.replica.execute("STOP SLAVE SQL_THREAD")
            self.stops += 1
            self.stop.wait(0.5 + 2 * self.rng.random())
            self.pair.replica.execute("START SLAVE SQL_THREAD")

    def __enter__(self) -> ReplicationFlapper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.pair.replica.execute("START SLAVE")


def _notes(config: dict[str, Any]) -> list[str]:
    return [n for b in list_batches(config["staging.path"], config["name"]) for n in b.manifest["notes"]]


def _assert_equals_primary(pair: ReplicaPair, config: dict[str, Any], tables: list[str]) -> None:
    """The replayed batches equal the primary's rows (the replica synchronised first)."""
    oracle, primary = replay(config), pair.primary_config(config)
    for table in tables:
        assert_rows_equal(table, source_rows(primary, table), oracle.rows(table), lenient_columns=True)


def _finish(pair: ReplicaPair, config: dict[str, Any]) -> None:
    """Catch the replica up, then capture until no snapshot is pending, plus one run."""
    pair.sync()
    runs = 0
    while snapshot_pending(config):
        run_capture(config)
        runs += 1
        assert runs < 40, "snapshot did not finish"
    run_capture(config)


@pytest.mark.slow
def test_converges_with_snapshots_signals_writers_lag_and_sigkills(pair, tmp_path):
    db = pair.create_database()
    user = pair.connector_user()
    execute(db, *schema(ROWS, ODD_ROWS), SIGNAL_DDL)
    pair.sync()
    items, odd, signals = f"{db.name}.items", f"{db.name}.{ODD_NAME}", f"{db.name}.dbz_signal"
    config = pair.config(
        db,
        user,
        tmp_path / "staging",
        **{
            "incremental.snapshot.chunk.size": 1000,
            "snapshot.max.rows.per.run": 3000,
            "run.max.events": 20_000,
            "signal.data.collection": signals,
            "staging.retention.batches": 100_000,
        },
    )
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(config))
    rng = random.Random(7)
    runs = SignalCrashRuns(path, FAILPOINTS, rng, 0.35, 1.0)
    with Writers(db, rows=ROWS), ReplicationFlapper(pair, rng) as flapper:
        while snapshot_pending(config) or runs.clean < 2:  # the initial snapshot
            runs.run()
        initial_runs = runs.runs
        # an ad hoc snapshot asked on the primary: the row reaches the capture through replication
        ask = {"data-collections": [odd], "type": "incremental"}
        execute(
            db,
            f"INSERT INTO dbz_signal VALUES ('ro-1', 'execute-snapshot', '{json.dumps(ask, ensure_ascii=False)}')",
        )
        runs.signal = {"type": "execute-snapshot", "data": {"data-collections": [items]}}
        while runs.signal is not None or runs.clean < initial_runs // 2 + 4:
            runs.run()
    _finish(pair, config)
    assert runs.kills >= 5 and flapper.stops >= 2, (runs.kills, flapper.stops)
    assert initial_runs >= 5, "the initial snapshot should be spread over many runs"
    notes = _notes(config)
    assert any("signal 'ro-1' from" in n and "execute-snapshot: queued" in n for n in notes), notes
    assert any(n == f"execute-snapshot: queued ['{items}']" for n in notes), notes
    assert sum(n.startswith(f"snapshot of {odd} complete") for n in notes) >= 2  # initial + ad hoc
    assert sum(n.startswith(f"snapshot of {items} complete") for n in notes) >= 2
    _assert_equals_primary(pair, config, [items, odd, signals])
    assert pair.assert_read_only(user) > 100


def test_replication_stopped_or_lagging_mid_snapshot_loses_nothing(pair, tmp_path, caplog):
    db = pair.create_database()
    user, monitor = pair.connector_user(), pair.connector_user("SLAVE MONITOR")
    execute(
        db,
        "CREATE TABLE s (id int PRIMARY KEY, v varchar(40))",
        "INSERT INTO s SELECT seq, concat('v', seq) FROM seq_1_to_3000",
    )
    pair.sync()
    table = f"{db.name}.s"
    props = {"incremental.snapshot.chunk.size": 250, "snapshot.max.rows.per.run": 750}
    config = pair.config(db, user, tmp_path / "staging", **props)
    run_capture(config)  # the snapshot's first chunks
    caplog.set_level(logging.INFO, logger="airflow_cdc.sources.mysql.replica")
    pair.replica.execute("STOP SLAVE")
    try:
        _change(db, 0)
        for _ in range(2):  # the snapshot goes on, reading the replica as it is
            assert run_capture(config).snapshot_rows == 750
        stopped = [r.getMessage() for r in caplog.records if "replication is stopped" in r.getMessage()]
        assert len(stopped) == 2 and "SQL thread: No" in stopped[0] and "grant SLAVE MONITOR" in stopped[0]
        caplog.clear()
        pair.replica.execute("START SLAVE IO_THREAD")  # the changes queue in the relay log: lag
        _change(db, 1)
        run_capture({**config, "database.user": monitor})
        assert "(I/O thread: Yes, SQL thread: No)" in caplog.text, caplog.text
    finally:
        pair.replica.execute("START SLAVE")
    caplog.clear()
    _finish(pair, config)
    assert "capturing from a replica (replication running" in caplog.text
    _assert_equals_primary(pair, config, [table])
    pair.assert_read_only(user)
    pair.assert_read_only(monitor)


def _change(db: PrimaryDb, round_: int) -> None:
    """Inserts, updates and deletes across the key range of ``s`` (on the primary)."""
    base = 10_000 * (round_ + 1)
    execute(
        db,
        f"INSERT INTO s SELECT seq + {base}, 'new' FROM seq_1_to_50",
        f"UPDATE s SET v = concat(v, '-{round_}') WHERE id % 7 = {round_}",
        f"DELETE FROM s WHERE id % 11 = {round_}",
        f"UPDATE s SET id = id + {base + 500} WHERE id BETWEEN {100 * round_ + 1} AND {100 * round_ + 20}",
    )


def test_writing_heartbeat_fails_the_run_under_read_only(pair, tmp_path):
    db = pair.create_database()
    user = pair.connector_user()
    execute(db, "CREATE TABLE hb (ts datetime(6))", "CREATE TABLE a (id int PRIMARY KEY)")
    pair.sync()
    insert = f"INSERT INTO `{db.name}`.hb VALUES (now(6))"
    # root passes read_only=ON on the server (SUPER, READ_ONLY ADMIN): read.only=true still refuses
    root = {
        **pair.config(db, user, tmp_path / "a", heartbeat__action__query=insert),
        "database.user": pair.replica.superuser,
        "database.password": pair.replica.password,
    }
    with pytest.raises(ConfigError, match="read.only=true makes every connection of the connector read-only"):
        run_capture(root)
    with pytest.raises(pymysql.err.MySQLError, match="READ ONLY"):
        run_capture({**root, "heartbeat.action.query": None, "database.initial.statements": insert})
    # the capture user without read.only: the read-only replica refuses it too (Debezium stops on it)
    other = pair.connector_user()
    plain = pair.config(db, other, tmp_path / "b", read__only="false", heartbeat__action__query=insert)
    with pytest.raises(ConfigError, match="'heartbeat.action.query': the server refused it"):
        run_capture(plain)
    reading = pair.config(db, user, tmp_path / "c", heartbeat__action__query="SELECT 1")
    run_capture(reading)
    assert pair.replica.execute(f"SELECT count(*) FROM `{db.name}`.hb")[0][0] == 0
    pair.assert_read_only(user)

"""Capture from a streaming standby (logical decoding on a standby, PostgreSQL 16+): writers on
the primary; the slot, the chunked snapshot and a signalled incremental snapshot on the standby
(a read-only server: the signal row is written on the primary and reaches the standby through
replication); capture runs SIGKILLed at random points; the replayed batches equal the PRIMARY's
tables row by row.  Older standbys and what a standby cannot do are clear errors."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_cdc.core.errors import ConfigError, ServerMisconfigured
from airflow_cdc.core.pipeline import build_config, build_store
from airflow_cdc.testing.servers import PostgresServer
from tests.conftest import PgDatabase
from tests.integration.postgres.support import execute, pipeline, replay, run_capture, source_rows
from tests.integration.postgres.test_convergence import SCHEMA, TABLES, Writers
from tests.support.pipeline import CrashRuns, assert_rows_equal, snapshot_pending

pytestmark = pytest.mark.slow

SIGNALS = "public.dbz_signal"


class Pair:
    """A primary and its streaming standby, one database on both."""

    def __init__(self, version: int) -> None:
        self.primary = PostgresServer(version=version).start()
        try:
            self.primary.execute("CREATE DATABASE shop")
            self.standby = self.primary.start_standby()
        except BaseException:
            self.primary.stop()
            raise
        self.on_primary = PgDatabase("shop", self.primary.dsn("shop"), self.primary)
        self.on_standby = PgDatabase("shop", self.standby.dsn("shop"), self.standby)
        self._stop = threading.Event()
        # a slot created on a standby waits for the primary's next running-transactions record
        # (logged every 15 s while it writes): ask for one often, so tests do not wait for it
        self._logger = threading.Thread(target=self._log_snapshots, daemon=True)
        self._logger.start()

    def _log_snapshots(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.primary.execute("SELECT pg_log_standby_snapshot()")
            except psycopg.Error:
                pass

    def caught_up(self, timeout: float = 60.0) -> None:
        """Wait until the standby has replayed everything the primary has flushed."""
        (target,) = self.primary.execute("SELECT pg_current_wal_flush_lsn()::text")[0]
        deadline = time.monotonic() + timeout
        while not self.standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,))[0][0]:
            assert time.monotonic() < deadline, "the standby did not catch up"
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._logger.join(timeout=10)
        self.standby.stop()
        self.primary.stop()


@pytest.fixture(params=[16, 17, 18], ids=lambda v: f"pg{v}")
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    pair = Pair(request.param)
    try:
        yield pair
    finally:
        pair.stop()


def test_capture_from_a_standby_converges_with_the_primary(pair: Pair, tmp_path: Path) -> None:
    execute(pair.on_primary.dsn, SCHEMA,
          f"CREATE TABLE {SIGNALS} (id varchar(64) PRIMARY KEY, type varchar(32), data varchar(2048))")  # fmt: skip
    config = pipeline(pair.on_standby, tmp_path / "staging", **{
        "incremental.snapshot.chunk.size": 1000, "snapshot.max.rows.per.run": 12_000, "run.max.events": 20_000,
        "signal.data.collection": SIGNALS, "table.include.list": ",".join([*TABLES, SIGNALS]).replace(".", "\\."),
    })  # fmt: skip
    # the publication lives on the primary (a standby is read-only); all_tables finds it there
    execute(pair.on_primary.dsn, f'CREATE PUBLICATION "{config["publication.name"]}" FOR ALL TABLES')
    pair.caught_up()
    config_path = tmp_path / "pipeline.json"
    rng = random.Random(16)
    runs = CrashRuns(config_path, "after_batch_write:0.25,after_state_commit:0.25,mid_window:0.1", rng, 0.35, 1.5)
    signalled = False
    with Writers(pair.on_primary.dsn) as writers:
        while snapshot_pending(config) or runs.clean < 3 or not _adhoc_done(config):
            if not snapshot_pending(config):
                writers.free_moves.set()
                if not signalled:  # an incremental snapshot of a table, asked for on the primary
                    data = json.dumps({"data-collections": ["public.items"], "type": "incremental"})
                    execute(pair.on_primary.dsn, f"INSERT INTO {SIGNALS} VALUES ('adhoc-1', 'execute-snapshot', '{data}')")
                    signalled = True
            mode = rng.choice(["peek", "stream"])
            config_path.write_text(json.dumps({**config, "window.reader": mode, "snapshot.max.threads": rng.choice([1, 2])}))
            runs.run()
    assert runs.kills >= 5, f"only {runs.kills} kills happened"
    pair.caught_up()
    while snapshot_pending(config):
        run_capture(config)
    run_capture(config)
    oracle = replay(config)
    primary = {**config, "database.port": pair.primary.port}  # compared with the PRIMARY's rows
    for table in TABLES:
        assert_rows_equal(table, source_rows(primary, table), oracle.rows(table))
    assert len(oracle.rows("public.items")) > 90_000


def _adhoc_done(config: dict[str, Any]) -> bool:
    """Whether the signalled snapshot of items has finished (read while the writers ran)."""
    stored = build_store(build_config(config)).load(config["name"])
    completed = stored.data["snapshot"]["completed"] if stored else []
    return any(c["table"] == "public.items" and c["origin"] == "adhoc" for c in completed)


def test_what_a_standby_cannot_do(pair: Pair, tmp_path: Path) -> None:
    """A publication the standby would have to create or a replica identity it would have to set:
    errors naming the primary; a failover slot: refused (PostgreSQL allows none on a standby)."""
    execute(pair.on_primary.dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'a')")
    pair.caught_up()
    config = pipeline(pair.on_standby, tmp_path / "staging")
    with pytest.raises(ServerMisconfigured, match="must be created or changed, and the server is a standby") as err:
        run_capture(config)
    assert "on the primary" in (err.value.hint or "")
    execute(pair.on_primary.dsn, f'CREATE PUBLICATION "{config["publication.name"]}" FOR ALL TABLES')
    pair.caught_up()
    with pytest.raises(ServerMisconfigured, match="REPLICA IDENTITY FULL on table public.t: the server is a standby"):
        run_capture({**config, "replica.identity.autoset.values": "public.t:FULL"})
    with pytest.raises(ConfigError, match="slot.failover.*standby"):
        run_capture({**config, "slot.failover": True})
    run_capture(config)
    execute(pair.on_primary.dsn, "UPDATE t SET v = 'b'")
    pair.caught_up()
    run_capture(config)
    assert_rows_equal("public.t", source_rows({**config, "database.port": pair.primary.port}, "public.t"),
                      replay(config).rows("public.t"))  # fmt: skip


def test_a_standby_older_than_16_is_refused(tmp_path: Path) -> None:
    primary = PostgresServer(version=15).start()
    try:
        primary.execute("CREATE DATABASE shop")
        standby = primary.start_standby()
        try:
            db = PgDatabase("shop", standby.dsn("shop"), standby)
            with pytest.raises(ServerMisconfigured, match="standby running PostgreSQL 15.*needs PostgreSQL 16"):
                run_capture(pipeline(db, tmp_path / "staging"))
        finally:
            standby.stop()
    finally:
        primary.stop()

"""Issue 11, edge 6: the replication slot left behind the committed offset.

A crash between the state commit and the slot advance (failpoint ``after_state_commit``) leaves
the slot's ``confirmed_flush_lsn`` below the stored offset: the next peek starts with transactions
the offset already covers.  Before the fix, (a) ``check: slot`` looked at the first of those and
never fired, (b) ``run.max.events`` was used up by those skipped rows (no progress) and (c) a window
bounded inside them ended below its start, moving the offset backwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.core.pipeline import build_config, build_store
from airflow_cdc.sources.postgres.position import parse_pg_lsn
from airflow_cdc.sources.postgres.source import PostgresSource
from tests.integration.postgres import support as pg

pytestmark = pytest.mark.integration
TABLE = "public.items"
COVERED = 12  # transactions committed in the state but not acknowledged to the slot


def _slot_lsn(db: Any, config: dict[str, Any]) -> int:
    rows = db.server.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (config["slot.name"],)
    )
    return parse_pg_lsn(rows[0][0])


def _offset(config: dict[str, Any]) -> dict[str, Any]:
    stored = build_store(build_config(config)).load(config["name"])
    assert stored is not None
    return dict(stored.data["offset"])


def _offset_lsn(config: dict[str, Any]) -> int:
    return parse_pg_lsn(_offset(config)["lsn"])


def _updates(db: Any, first: int, count: int) -> None:
    """``count`` single-row transactions (one event each)."""
    with db.connect(autocommit=True) as conn:
        for i in range(first, first + count):
            conn.execute("UPDATE items SET n = n + 1 WHERE id = %s", (i % 5 + 1,))


def _slot_behind(db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A snapshotted table, then ``COVERED`` transactions committed in the state but not in the slot."""
    with db.connect(autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, n int)")
        conn.execute("INSERT INTO items SELECT g, 0 FROM generate_series(1, 5) g")
    config = pg.pipeline(db, tmp_path / "staging")
    pg.run_capture(config)
    _updates(db, 0, COVERED)
    with monkeypatch.context() as m:  # the crash: state committed, slot never advanced
        m.setattr(PostgresSource, "acknowledge", lambda self, offset: None)
        crashed = pg.run_capture(config)
    assert crashed.events == COVERED
    assert _slot_lsn(db, config) < _offset_lsn(config), "the slot is not behind the offset"
    return config


def _changes(config: dict[str, Any]) -> bool:
    return PostgresSource(build_config(config)).changes_after(_offset(config), "slot")


def test_check_slot_fires_after_a_crash_before_the_slot_advance(pg_db: Any, tmp_path: Path) -> None:
    """The crash is real here: the CLI is SIGKILLed at the failpoint after the state commit."""
    with pg_db.connect(autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, n int)")
        conn.execute("INSERT INTO items SELECT g, 0 FROM generate_series(1, 5) g")
    config = pg.pipeline(pg_db, tmp_path / "staging")
    pg.run_capture(config)
    assert not _changes(config)
    _updates(pg_db, 0, COVERED)
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(config))
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_cdc.cli", "capture", "--config", str(path), "--commit"],
        env=dict(os.environ, AIRFLOW_CDC_FAILPOINTS="after_state_commit:1"),
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert _slot_lsn(pg_db, config) < _offset_lsn(config)
    _updates(pg_db, 100, 1)  # a change past the offset: the sensor must let capture run
    assert _changes(config), "check: slot missed a change past the offset (it peeked a covered one)"
    run = pg.run_capture(config)
    assert run.events == 1
    assert _slot_lsn(pg_db, config) == _offset_lsn(config)
    assert not _changes(config), "check: slot fires with nothing past the offset"
    _updates(pg_db, 200, 1)
    assert _changes(config)
    pg.run_capture(config)
    pg.assert_converged(config, [TABLE])


def test_small_run_max_events_counts_only_events_after_the_offset(
    pg_db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _slot_behind(pg_db, tmp_path, monkeypatch)
    config["run.max.events"] = 4  # lowered after the crash, below the covered transactions
    _updates(pg_db, 0, 5)
    counts = []
    while len(counts) < 10:
        run = pg.run_capture(config)
        if not run.events:
            break
        counts.append(run.events)
    assert counts and counts[0] > 0, "the first run made no progress: the covered rows used up run.max.events"
    assert sum(counts) == 5, f"events per run {counts}: only the 5 changes after the offset count"
    assert len(counts) > 1, f"run.max.events=4 did not bound the windows: {counts}"
    pg.assert_converged(config, [TABLE])


@pytest.mark.parametrize("max_events", [1, 3])
def test_offset_never_moves_backwards(
    pg_db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_events: int
) -> None:
    """Lowering ``run.max.events`` after the crash: every run's offset is at or past its start."""
    config = _slot_behind(pg_db, tmp_path, monkeypatch)
    config["run.max.events"] = max_events
    _updates(pg_db, 0, 3)
    lsns = [_offset_lsn(config)]
    for _ in range(8):
        run = pg.run_capture(config)
        lsns.append(_offset_lsn(config))
        assert parse_pg_lsn(run.to_offset["lsn"]) >= parse_pg_lsn(run.from_offset["lsn"])
    assert lsns == sorted(lsns), f"the offset moved backwards: {lsns}"
    assert lsns[-1] > lsns[0], "no progress"
    pg.assert_converged(config, [TABLE])


def test_flush_log_makes_written_wal_durable(pg_db: Any, tmp_path: Path) -> None:
    """A chunk's closing watermark is the insert LSN, and capture waits until the server has flushed
    it.  WAL that no commit follows waits for the WAL writer's next whole page or asynchronous
    commit; ``flush_log`` supplies such a commit, so the wait ends within ``wal_writer_delay`` (a
    busy CI machine once failed the 10 s wait without it).  The record is written until another
    session's commit does not flush it first."""
    source = PostgresSource(build_config(pg.pipeline(pg_db, tmp_path / "staging")))
    source.open()
    try:
        with pg_db.connect(autocommit=True) as conn:
            for _ in range(20):
                conn.execute("SELECT pg_logical_emit_message(false, 'airflow-cdc-test', 'x')")
                row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
                written = parse_pg_lsn(row[0])
                if source.head() < written:
                    break
            else:
                pytest.skip("the shared server kept flushing on its own")
        source.flush_log()  # an asynchronous commit: the WAL writer flushes it within wal_writer_delay
        deadline = time.monotonic() + 5
        while source.head() < written and time.monotonic() < deadline:
            time.sleep(0.02)
        assert source.head() >= written
    finally:
        source.close()

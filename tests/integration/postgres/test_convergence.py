"""Convergence under concurrency: chunked snapshot over many runs while writers insert, update,
delete and change keys; with and without SIGKILLs; replayed batches must equal the source."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import psycopg
import pytest

from airflow_cdc.core.table_sink import PART_ROWS_ENV
from tests.integration.postgres import toast_scenario
from tests.integration.postgres.support import assert_converged, every_version, pipeline, run_capture
from tests.support.pipeline import CrashRuns, WriterThreads, snapshot_pending

pytestmark = pytest.mark.slow

ODD_SCHEMA = "Odd Schema"
ODD_TABLE = 'we"ird.tbl ü'
ODD = f'"{ODD_SCHEMA}"."{ODD_TABLE.replace(chr(34), chr(34) * 2)}"'
TABLES = ["public.items", f"{ODD_SCHEMA}.{ODD_TABLE}"]

TOASTED = 100  # every 100th item (every 200th: also a bytea) holds values stored out of line
SCHEMA = f"""
CREATE TABLE items (
    id bigint PRIMARY KEY, qty int NOT NULL, price numeric(12,2), name text, created timestamptz,
    day date, payload jsonb, flag boolean, ratio double precision, blob bytea, uid uuid, tags text[],
    small smallint, at_time time, local_ts timestamp(3), span interval, addr inet, r real, note text, doc bytea);
INSERT INTO items
SELECT g, g % 97, (g * 1.37)::numeric(12,2), 'name ' || g || repeat('x', g % 40),
       timestamptz '2024-01-01 00:00:00+00' + g * interval '17 seconds', date '2020-01-01' + (g % 3000),
       jsonb_build_object('g', g, 'even', g % 2 = 0), g % 3 = 0, g / 7.0, decode(md5(g::text), 'hex'),
       md5(g::text)::uuid, ARRAY['t' || (g % 5), NULL, 'q"uote'], (g % 30000)::smallint,
       time '00:00' + g * interval '1 second', timestamp '2023-05-06 07:08:09.123' + g * interval '1 ms',
       g * interval '1 minute', ('10.0.' || (g % 250) || '.' || (g % 200))::inet, g / 3.0,
       CASE WHEN g % {TOASTED} = 0 THEN {toast_scenario.BIG_TEXT} END,
       CASE WHEN g % {TOASTED * 2} = 0 THEN {toast_scenario.BIG_BYTES} END
FROM generate_series(1, 100000) g;
CREATE SCHEMA "{ODD_SCHEMA}";
CREATE TABLE {ODD} (k1 int, "k 2" text, val text, n numeric, note text, PRIMARY KEY (k1, "k 2"));
INSERT INTO {ODD} SELECT g / 4, 'k' || (g % 4), 'v' || g, g * 0.5,
       CASE WHEN (g / 4) % 50 = 0 THEN {toast_scenario.BIG_TEXT} END
FROM generate_series(1, 20000) g;
"""


def _writer(dsn: str, stop: threading.Event, seed: int, next_id: list[int], lock: threading.Lock,
            free_moves: threading.Event) -> None:
    rng = random.Random(seed)
    with psycopg.connect(dsn, autocommit=False) as conn:
        while not stop.is_set():
            try:
                with conn.transaction():
                    for _ in range(rng.randint(1, 4)):
                        _one_change(conn, rng, next_id, lock, free_moves.is_set())
            except (psycopg.errors.UniqueViolation, psycopg.errors.DeadlockDetected,
                    psycopg.errors.SerializationFailure):
                pass
            time.sleep(rng.random() * 0.004)


def _one_change(conn: psycopg.Connection, rng: random.Random, next_id: list[int], lock: threading.Lock,
                free_moves: bool) -> None:
    """One random change; TOASTed rows change keys only once ``free_moves`` (snapshot done): a
    row moved with its TOAST values unsent before its chunk is read is the gap of
    test_key_change_ahead_of_the_snapshot_keeps_toast_values."""
    untoasted = "" if free_moves else " AND note IS NULL AND doc IS NULL"
    op = rng.random()
    # a third of the changes hit rows with TOASTed values, which updates and key changes leave unsent
    target = rng.randint(1, next_id[0]) if rng.random() < 0.7 else rng.randint(1, 1000) * TOASTED
    if op < 0.3:
        with lock:
            next_id[0] += 1
            new = next_id[0]
        big = rng.randbytes(6000).hex() if rng.random() < 0.2 else None
        conn.execute("INSERT INTO items (id, qty, price, name, created, payload, tags, note) "
                     "VALUES (%s, %s, %s, %s, now(), %s, %s, %s)",
                     (new, rng.randint(0, 9), rng.randint(0, 10**6) / 100, f"new {new}",
                      json.dumps({"n": new}), ["a", None], big))
    elif op < 0.6:
        conn.execute("UPDATE items SET qty = qty + 1, price = %s, name = name || '!' WHERE id = %s",
                     (rng.randint(0, 10**6) / 100, target))
    elif op < 0.75:
        conn.execute("DELETE FROM items WHERE id = %s", (target,))
    elif op < 0.85:
        with lock:
            next_id[0] += 1
            new = next_id[0]
        conn.execute("UPDATE items SET id = %s WHERE id = %s" + untoasted, (new, target))
    elif op < 0.95:
        conn.execute(f"UPDATE {ODD} SET val = val || '+', n = n + 1 WHERE k1 = %s", (target % 5000,))
    else:
        k1 = target % 5000 if rng.random() < 0.5 else rng.randint(0, 99) * 50
        conn.execute(f'UPDATE {ODD} SET "k 2" = "k 2" || \'m\' WHERE k1 = %s AND "k 2" = %s'
                     + untoasted.replace(" AND doc IS NULL", ""), (k1, f"k{target % 4}"))


class Writers(WriterThreads):
    def __init__(self, dsn: str, n: int = 2) -> None:
        super().__init__()
        self.free_moves = threading.Event()
        lock, next_id = threading.Lock(), [100_000]
        self.threads = [threading.Thread(target=_writer, args=(dsn, self.stop, i, next_id, lock, self.free_moves),
                                         daemon=True) for i in range(n)]




def _setup(pg_db, tmp_path: Path, reader: str = "peek", threads: int = 1) -> dict:
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    return pipeline(pg_db, tmp_path / "staging", **{"incremental.snapshot.chunk.size": 1000,
                                                     "snapshot.max.rows.per.run": 12_000,
                                                     "run.max.events": 20_000, "window.reader": reader,
                                                     "snapshot.max.threads": threads})


@pytest.mark.parametrize(("reader", "threads"), [("stream", 1), ("peek", 1), ("peek", 3)],
                         ids=["stream", "peek", "peek-three-readers"])
def test_converges_under_concurrent_writes(pg_db, tmp_path, monkeypatch, reader, threads):
    """Three snapshot readers (snapshot.max.threads) on two cores: ranges of 1,000 rows read side
    by side while the writers insert into them, move keys across them and delete from them."""
    config = _setup(pg_db, tmp_path, reader, threads)
    monkeypatch.setenv(PART_ROWS_ENV, "2500")  # a table's snapshot rows of a run span parts
    runs = 0
    with Writers(pg_db.dsn) as writers:
        while snapshot_pending(config) or runs < 3:
            run_capture(config)
            runs += 1
            assert runs < 60, "snapshot did not finish"
        writers.free_moves.set()
        for _ in range(2):
            time.sleep(0.5)
            run_capture(config)
    run_capture(config)
    assert runs >= 8, "snapshot should be spread over many runs"
    oracle = assert_converged(config, TABLES)
    assert len(oracle.rows("public.items")) > 90_000



@every_version
def test_converges_with_sigkill_at_random_points(pg_db, tmp_path, monkeypatch):
    """Each run reads its snapshot rows with one, two or three readers (snapshot.max.threads,
    drawn per run): killed runs leave ranges read by readers side by side, the next run may read
    them with another count."""
    config = _setup(pg_db, tmp_path, "stream")  # peek: test_crash_between_state_commit_and_slot_advance
    monkeypatch.setenv(PART_ROWS_ENV, "2500")  # a kill may land while a writer thread closes a part
    config_path = tmp_path / "pipeline.json"
    rng = random.Random(42)
    runs = CrashRuns(config_path, "after_batch_write:0.25,after_state_commit:0.25,mid_window:0.1", rng, 0.35, 1.5)
    with Writers(pg_db.dsn) as writers:
        while snapshot_pending(config) or runs.clean < 3:
            if not snapshot_pending(config):
                writers.free_moves.set()
            config_path.write_text(json.dumps({**config, "snapshot.max.threads": rng.choice([1, 2, 3])}))
            runs.run()
    assert runs.kills >= 5, f"only {runs.kills} kills happened"
    run_capture(config)
    assert_converged(config, TABLES)


def test_truncate_during_chunked_snapshot(pg_db, tmp_path):
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE tt (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO tt SELECT g, 'a' || g FROM generate_series(1, 5000) g")
    config = pipeline(pg_db, tmp_path / "staging", **{"incremental.snapshot.chunk.size": 400,
                                                       "snapshot.max.rows.per.run": 1200,
                                                       "skipped.operations": "none"})
    run_capture(config)
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute("BEGIN; TRUNCATE tt; INSERT INTO tt SELECT g, 'b' || g FROM generate_series(1, 4000, 3) g; "
                     "COMMIT")
    while snapshot_pending(config):
        run_capture(config)
    run_capture(config)
    assert_converged(config, ["public.tt"])


@pytest.mark.parametrize("identity", ["default", "full"])
def test_unchanged_toast_values_exact_in_every_path(pg_db, tmp_path, monkeypatch, identity):
    """Key changes (chained too), chunk rows dropped by reconciliation and later updates that leave
    TOASTed text/bytea unchanged: every replayed column equals the source (toast_scenario)."""
    writers = toast_scenario_run(pg_db, tmp_path, monkeypatch, identity)
    assert writers.touched > 300
    assert_converged(config_of(tmp_path), toast_scenario.TABLES)


def config_of(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "pipeline.json").read_text())


def toast_scenario_run(pg_db, tmp_path: Path, monkeypatch, identity: str) -> toast_scenario.ChunkWriters:
    """Run the scenario to the end (snapshot while chunk rows change, then streamed key changes)."""
    toast_scenario.setup(pg_db.dsn, identity)
    config = pipeline(pg_db, tmp_path / "staging", **{"incremental.snapshot.chunk.size": 100,
                                                       "snapshot.max.rows.per.run": 300})
    (tmp_path / "pipeline.json").write_text(json.dumps(config))
    writers = toast_scenario.ChunkWriters(pg_db.dsn, monkeypatch)
    try:
        runs = 0
        while snapshot_pending(config):
            run_capture(config)
            runs += 1
            assert runs < 20, "snapshot did not finish"
        writers.streamed_changes()
        run_capture(config)
    finally:
        writers.close()
    return writers


@pytest.mark.xfail(strict=True, reason="known gap: a row moved to a key beyond the snapshot's end before "
                   "its chunk is read, leaving TOAST values unsent, never gets them (Debezium has it too)")
def test_key_change_ahead_of_the_snapshot_keeps_toast_values(pg_db, tmp_path):
    toast_scenario.setup(pg_db.dsn, "default")
    config = pipeline(pg_db, tmp_path / "staging", **{"incremental.snapshot.chunk.size": 100,
                                                       "snapshot.max.rows.per.run": 100})
    run_capture(config)  # rows 1-100 read
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute("UPDATE docs SET id = 100250 WHERE id = 250")  # not read yet; beyond the end
    while snapshot_pending(config):
        run_capture(config)
    assert_converged(config, ["public.docs"])

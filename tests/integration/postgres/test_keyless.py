"""Tables without a primary key: captured, not refused.  ``REPLICA IDENTITY FULL`` tables are
mirrored exactly as multisets (duplicates, updates and deletes of one of several equal rows);
``DEFAULT`` identity ones are an append-only log, with a warning naming them at start."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from pathlib import Path

import psycopg
import pytest

from airflow_cdc.core.batch import list_batches
from tests.integration.postgres.support import (
    every_version,
    pipeline,
    replay,
    run_capture,
    source_multiset,
    source_rows,
)
from tests.support.pipeline import (
    CrashRuns,
    WriterThreads,
    assert_multiset_equal,
    assert_rows_equal,
    snapshot_pending,
)

#: one occurrence of the row ``t`` picks (``ctid``: equal rows are told apart by their place)
ONE = "(SELECT ctid FROM {t} WHERE {where} LIMIT 1)"


def _exec(db, *statements):
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def assert_mirrored(config, table):
    oracle = replay(config)
    assert oracle.keyless[table].anomalies == 0
    assert_multiset_equal(table, source_multiset(config, table), oracle.multiset(table))
    return oracle


@every_version
def test_full_identity_table_is_a_multiset(pg_db, tmp_path):
    _exec(
        pg_db,
        "CREATE TABLE h (a int, b text, n numeric, j jsonb, arr int[])",
        "ALTER TABLE h REPLICA IDENTITY FULL",
        "INSERT INTO h SELECT g % 7, 'b' || (g % 3), NULL, '{\"x\": 1}', ARRAY[g % 2, NULL] "
        "FROM generate_series(1, 300) g",
        "INSERT INTO h VALUES (NULL, NULL, NULL, NULL, NULL), (NULL, NULL, NULL, NULL, NULL)",
    )
    config = pipeline(pg_db, tmp_path / "staging", **{"snapshot.max.rows.per.run": 50})
    run_capture(config)
    assert not snapshot_pending(config), "a keyless table is read whole in one run"
    batch = list_batches(config["staging.path"], config["name"])[-1]
    assert batch.table_info("public.h")["keyless"] == "multiset"
    assert batch.table_info("public.h")["key_columns"] == []
    assert_mirrored(config, "public.h")
    _exec(
        pg_db,
        f"DELETE FROM h WHERE ctid = {ONE.format(t='h', where='a = 1')}",
        f"UPDATE h SET n = 5 WHERE ctid = {ONE.format(t='h', where='a = 2')}",
        f"DELETE FROM h WHERE ctid = {ONE.format(t='h', where='a IS NULL')}",
        "INSERT INTO h VALUES (1, 'b1', NULL, '{\"x\": 1}', ARRAY[1, NULL])",
        "UPDATE h SET b = 'z' WHERE a = 3",
        "BEGIN; DELETE FROM h WHERE a = 4; INSERT INTO h VALUES (4, 'back', 1, NULL, NULL); COMMIT",
    )
    run_capture(config)
    assert_mirrored(config, "public.h")


def test_default_identity_table_is_an_append_log_with_a_warning(pg_db, tmp_path, caplog):
    _exec(
        pg_db,
        "CREATE TABLE hist (tid int, delta int, at text)",
        "INSERT INTO hist VALUES (1, 5, 'x'), (1, 5, 'x')",
    )
    config = pipeline(pg_db, tmp_path / "staging")
    with caplog.at_level(logging.WARNING):
        run_capture(config)
    warned = [r.getMessage() for r in caplog.records if "public.hist" in r.getMessage()]
    assert warned and "append-only" in warned[0] and "REPLICA IDENTITY FULL" in warned[0]
    _exec(pg_db, "INSERT INTO hist VALUES (2, 7, 'y')")
    run_capture(config)
    batches = list_batches(config["staging.path"], config["name"])
    assert {b.table_info("public.hist")["keyless"] for b in batches if "public.hist" in b.tables()} == {
        "append"
    }
    log = replay(config).keyless["public.hist"].log
    assert [op for op, _ in log] == ["r", "r", "c"]


KEYLESS_SCHEMA = """
CREATE TABLE ev (grp int, val text, qty int, note text);
ALTER TABLE ev REPLICA IDENTITY FULL;
INSERT INTO ev SELECT g % 300, 'v' || (g % 7), g % 3, CASE WHEN g % 11 = 0 THEN NULL ELSE 'n' END
FROM generate_series(1, 30000) g;
CREATE TABLE keyed (id int PRIMARY KEY, v text);
INSERT INTO keyed SELECT g, 'k' || g FROM generate_series(1, 6000) g;
"""
TABLES = ("public.ev", "public.keyed")


def _keyless_change(conn: psycopg.Connection, rng: random.Random) -> None:
    """One random change, mostly to one of several equal rows of ``ev`` (picked by ``ctid``)."""
    grp, op = rng.randrange(320), rng.random()
    one = ONE.format(t="ev", where="grp = %s")
    if op < 0.25:  # one more copy of a row that exists (or a new one)
        conn.execute("INSERT INTO ev SELECT grp, val, qty, note FROM ev WHERE grp = %s LIMIT 1", (grp,))
        conn.execute("INSERT INTO ev VALUES (%s, 'new', 0, NULL)", (grp,))
    elif op < 0.45:
        conn.execute(f"DELETE FROM ev WHERE ctid = {one}", (grp,))
    elif op < 0.7:
        conn.execute(f"UPDATE ev SET qty = qty + 1 WHERE ctid = {one}", (grp,))
    elif op < 0.8:
        conn.execute("UPDATE ev SET val = val || '+' WHERE grp = %s AND qty = %s", (grp, rng.randrange(3)))
    elif op < 0.85:
        conn.execute("DELETE FROM ev WHERE grp = %s AND note IS NULL", (grp,))
    elif op < 0.95:
        conn.execute("UPDATE keyed SET v = v || '!' WHERE id = %s", (rng.randint(1, 6000),))
    else:
        conn.execute("DELETE FROM keyed WHERE id = %s", (rng.randint(1, 6000),))


def _writer(dsn: str, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    with psycopg.connect(dsn, autocommit=False) as conn:
        while not stop.is_set():
            try:
                with conn.transaction():
                    for _ in range(rng.randint(1, 3)):
                        _keyless_change(conn, rng)
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                pass
            time.sleep(rng.random() * 0.004)


class KeylessWriters(WriterThreads):
    def __init__(self, dsn: str, n: int = 2) -> None:
        super().__init__()
        self.threads = [
            threading.Thread(target=_writer, args=(dsn, self.stop, i), daemon=True) for i in range(n)
        ]


def keyless_setup(pg_db, tmp_path: Path) -> dict:
    _exec(pg_db, KEYLESS_SCHEMA)
    config = pipeline(
        pg_db,
        tmp_path / "staging",
        **{"incremental.snapshot.chunk.size": 500, "snapshot.max.rows.per.run": 1500},
    )
    (tmp_path / "pipeline.json").write_text(json.dumps(config))
    return config


def keyless_crash_runs(pg_db, tmp_path: Path, config: dict, seed: int = 7) -> CrashRuns:
    """Captures in child processes, SIGKILLed at random points (mid window, mid whole-table read,
    after publishing, after the state commit), while writers change ``ev`` and ``keyed``; half
    way, an ad hoc snapshot of ``ev`` is asked for (read whole again while they write)."""
    rng = random.Random(seed)
    failpoints = "after_batch_write:0.25,after_state_commit:0.25,mid_window:0.1,whole_read:0.3"
    runs = CrashRuns(tmp_path / "pipeline.json", failpoints, rng, 0.35, 1.0, budget=8)
    signalled = False
    with KeylessWriters(pg_db.dsn):
        while snapshot_pending(config) or runs.clean < 4 or runs.kills < 3:  # kills are random: go on until 3
            runs.run()
            if runs.runs >= 4 and not signalled:
                run_capture(config, signals=[{"execute-snapshot": {"data-collections": ["public.ev"]}}])
                signalled = True
    run_capture(config)
    return runs


@pytest.mark.slow
def test_keyless_converges_with_sigkills(pg_db, tmp_path):
    config = keyless_setup(pg_db, tmp_path)
    runs = keyless_crash_runs(pg_db, tmp_path, config)
    assert runs.kills >= 3, f"only {runs.kills} kills happened"
    assert_mirrored(config, "public.ev")
    assert_rows_equal(
        "public.keyed", source_rows(config, "public.keyed"), replay(config).rows("public.keyed")
    )
    assert len(source_multiset(config, "public.ev")) > len(
        {repr(r) for r in source_multiset(config, "public.ev")}
    )


def test_full_identity_update_leaving_toasted_values_unchanged(pg_db, tmp_path):
    """An update that leaves a TOASTed value unchanged sends it only in the old row: the new row
    takes it from there, so the image removed and the image added are whole."""
    big = "(SELECT string_agg(md5(g::text || '{seed}'), '') FROM generate_series(1, 400) g)"
    _exec(
        pg_db,
        "CREATE TABLE docs (n int, body text, blob bytea)",
        "ALTER TABLE docs REPLICA IDENTITY FULL",
        f"INSERT INTO docs VALUES (1, {big.format(seed='a')}, decode({big.format(seed='b')}, 'hex'))",
        f"INSERT INTO docs VALUES (1, {big.format(seed='a')}, decode({big.format(seed='b')}, 'hex'))",
    )
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    _exec(pg_db, f"UPDATE docs SET n = 2 WHERE ctid = {ONE.format(t='docs', where='n = 1')}")
    run_capture(config)
    batch = list_batches(config["staging.path"], config["name"])[-1]
    events = [r for rb in batch.iter_events("public.docs") for r in rb.to_pylist()]
    assert [e["op"] for e in events] == ["u"] and not events[0]["__unavailable"]
    assert events[0]["after"]["body"] == events[0]["before"]["body"]
    assert_mirrored(config, "public.docs")


def test_replica_identity_index_is_the_key(pg_db, tmp_path):
    """No primary key but ``REPLICA IDENTITY USING INDEX``: the index (unique, NOT NULL) keys it."""
    _exec(
        pg_db,
        "CREATE TABLE ri (a int NOT NULL, b text NOT NULL, v text)",
        "CREATE UNIQUE INDEX ri_ab ON ri (b, a)",
        "ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_ab",
        "INSERT INTO ri SELECT g, 'b' || g, 'v' FROM generate_series(1, 50) g",
    )
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    _exec(
        pg_db,
        "UPDATE ri SET v = 'w' WHERE a < 10",
        "DELETE FROM ri WHERE a > 45",
        "UPDATE ri SET a = 100 WHERE a = 1",
    )
    run_capture(config)
    batch = list_batches(config["staging.path"], config["name"])[-1]
    assert batch.table_info("public.ri")["key_columns"] == ["b", "a"]
    assert "keyless" not in batch.table_info("public.ri")
    assert_rows_equal("public.ri", source_rows(config, "public.ri"), replay(config).rows("public.ri"))

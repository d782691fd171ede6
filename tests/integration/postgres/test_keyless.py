"""Tables without a primary key: captured, not refused.  ``REPLICA IDENTITY FULL`` tables are
mirrored exactly as multisets (duplicates, updates and deletes of one of several equal rows);
``DEFAULT`` identity ones are an append-only log, with a warning naming them at start."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import psycopg
import pytest

from airflow_cdc.core.batch import list_batches
from tests.integration.postgres.support import (
    every_version,
    execute,
    pipeline,
    replay,
    run_capture,
    source_multiset,
    source_rows,
)
from tests.support import keyless
from tests.support.pipeline import CrashRuns, assert_rows_equal, snapshot_pending

#: one occurrence of the row ``t`` picks (``ctid``: equal rows are told apart by their place)
ONE = "(SELECT ctid FROM {t} WHERE {where} LIMIT 1)"

assert_mirrored = partial(keyless.assert_mirrored, source_multiset=source_multiset)


@every_version
def test_full_identity_table_is_a_multiset(pg_db, tmp_path):
    execute(
        pg_db.dsn,
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
    execute(
        pg_db.dsn,
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
    execute(
        pg_db.dsn,
        "CREATE TABLE hist (tid int, delta int, at text)",
        "INSERT INTO hist VALUES (1, 5, 'x'), (1, 5, 'x')",
    )
    config = pipeline(pg_db, tmp_path / "staging")
    with caplog.at_level(logging.WARNING):
        run_capture(config)
    warned = [r.getMessage() for r in caplog.records if "public.hist" in r.getMessage()]
    assert warned and "append-only" in warned[0] and "REPLICA IDENTITY FULL" in warned[0]
    execute(pg_db.dsn, "INSERT INTO hist VALUES (2, 7, 'y')")
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


_ONE_EV = ONE.format(t="ev", where="grp = %s")
#: the random changes of the crash scenario (:func:`keyless.random_change`)
CHANGES = keyless.ChangeSql(
    copy_row="INSERT INTO ev SELECT grp, val, qty, note FROM ev WHERE grp = %s LIMIT 1",
    insert_new="INSERT INTO ev VALUES (%s, 'new', 0, NULL)",
    delete_one=f"DELETE FROM ev WHERE ctid = {_ONE_EV}",
    bump_one=f"UPDATE ev SET qty = qty + 1 WHERE ctid = {_ONE_EV}",
    extend_val="UPDATE ev SET val = val || '+' WHERE grp = %s AND qty = %s",
    delete_nulls="DELETE FROM ev WHERE grp = %s AND note IS NULL",
    touch_keyed="UPDATE keyed SET v = v || '!' WHERE id = %s",
    delete_keyed="DELETE FROM keyed WHERE id = %s",
)
RETRY = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


def keyless_setup(pg_db, tmp_path: Path) -> dict:
    execute(pg_db.dsn, KEYLESS_SCHEMA)
    return pipeline(
        pg_db,
        tmp_path / "staging",
        **{"incremental.snapshot.chunk.size": 500, "snapshot.max.rows.per.run": 1500},
    )


def keyless_crash_runs(pg_db, tmp_path: Path, config: dict, seed: int = 7) -> CrashRuns:
    """The crash scenario (:func:`keyless.keyless_crash_runs`) on ``ev`` and ``keyed``."""
    writers = keyless.KeylessWriters(lambda: psycopg.connect(pg_db.dsn, autocommit=False), CHANGES, RETRY)
    return keyless.keyless_crash_runs(config, tmp_path / "pipeline.json", writers, "public.ev", seed)


@pytest.mark.slow
def test_keyless_converges_with_sigkills(pg_db, tmp_path):
    config = keyless_setup(pg_db, tmp_path)
    runs = keyless_crash_runs(pg_db, tmp_path, config)
    keyless.assert_crash_runs_converged(
        config, runs, "public.ev", "public.keyed", source_multiset, source_rows
    )


def test_full_identity_update_leaving_toasted_values_unchanged(pg_db, tmp_path):
    """An update that leaves a TOASTed value unchanged sends it only in the old row: the new row
    takes it from there, so the image removed and the image added are whole."""
    big = "(SELECT string_agg(md5(g::text || '{seed}'), '') FROM generate_series(1, 400) g)"
    execute(
        pg_db.dsn,
        "CREATE TABLE docs (n int, body text, blob bytea)",
        "ALTER TABLE docs REPLICA IDENTITY FULL",
        f"INSERT INTO docs VALUES (1, {big.format(seed='a')}, decode({big.format(seed='b')}, 'hex'))",
        f"INSERT INTO docs VALUES (1, {big.format(seed='a')}, decode({big.format(seed='b')}, 'hex'))",
    )
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    execute(pg_db.dsn, f"UPDATE docs SET n = 2 WHERE ctid = {ONE.format(t='docs', where='n = 1')}")
    run_capture(config)
    batch = list_batches(config["staging.path"], config["name"])[-1]
    events = [r for rb in batch.iter_events("public.docs") for r in rb.to_pylist()]
    assert [e["op"] for e in events] == ["u"] and not events[0]["__unavailable"]
    assert events[0]["after"]["body"] == events[0]["before"]["body"]
    assert_mirrored(config, "public.docs")


def test_replica_identity_index_is_the_key(pg_db, tmp_path):
    """No primary key but ``REPLICA IDENTITY USING INDEX``: the index (unique, NOT NULL) keys it."""
    execute(
        pg_db.dsn,
        "CREATE TABLE ri (a int NOT NULL, b text NOT NULL, v text)",
        "CREATE UNIQUE INDEX ri_ab ON ri (b, a)",
        "ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_ab",
        "INSERT INTO ri SELECT g, 'b' || g, 'v' FROM generate_series(1, 50) g",
    )
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    execute(
        pg_db.dsn,
        "UPDATE ri SET v = 'w' WHERE a < 10",
        "DELETE FROM ri WHERE a > 45",
        "UPDATE ri SET a = 100 WHERE a = 1",
    )
    run_capture(config)
    batch = list_batches(config["staging.path"], config["name"])[-1]
    assert batch.table_info("public.ri")["key_columns"] == ["b", "a"]
    assert "keyless" not in batch.table_info("public.ri")
    assert_rows_equal("public.ri", source_rows(config, "public.ri"), replay(config).rows("public.ri"))

"""Tables without a key through Spark: a ``REPLICA IDENTITY FULL`` table's silver is the source as
a multiset (duplicates, deletes and updates of one of several equal rows, truncates, a second
snapshot); re-applied batches and a window captured again in another batch change nothing; a
``DEFAULT`` identity table's silver is an append-only log."""

from __future__ import annotations

import json
import shutil

import psycopg
import pytest

from airflow_cdc.core.batch import list_batches
from spark_jobs.cdc_apply import delta_log
from spark_jobs.cdc_apply.job import ApplySettings, apply_batch, apply_batches
from spark_jobs.cdc_apply.layout import table_path
from tests.integration.mysql import support as mysql_support
from tests.integration.mysql import test_keyless as mysql_keyless
from tests.integration.postgres.support import pipeline, replay, run_capture, source_multiset, source_rows
from tests.integration.postgres.test_keyless import ONE, keyless_crash_runs, keyless_setup
from tests.integration.spark.support import (
    diff,
    normalised_list,
    normalised_rows,
    semantic_names,
    silver_multiset,
    silver_rows,
)
from tests.support.pipeline import assert_multiset_equal

pytestmark = pytest.mark.spark

TABLE = "public.h"


def _exec(db, *statements):
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def apply_all(spark, config, target):
    for batch in list_batches(config["staging.path"], config["name"]):
        apply_batch(spark, str(batch.path), target, ApplySettings())


def assert_silver_multiset(spark, config, target, table=TABLE):
    names = semantic_names(config, table)
    got = silver_multiset(spark, target, config, table)
    assert_multiset_equal(table, normalised_list(source_multiset(config, table), names), got)
    oracle = replay(config)
    assert oracle.keyless[table].anomalies == 0
    assert_multiset_equal(table, normalised_list(oracle.multiset(table), names), got)


def _version(path):
    return delta_log.replay(path).version


def test_multiset_silver_through_changes_truncate_and_resnapshot(spark, pg_db, tmp_path):
    _exec(
        pg_db,
        "CREATE TABLE h (a int, b text, n numeric(6,2), ts timestamptz, arr text[], by bytea)",
        "ALTER TABLE h REPLICA IDENTITY FULL",
        "INSERT INTO h SELECT g % 5, 'b' || (g % 2), NULL, '2024-01-01 00:00+00', ARRAY['x', NULL], '\\x00' "
        "FROM generate_series(1, 60) g",
        "INSERT INTO h VALUES (NULL, NULL, NULL, NULL, NULL, NULL), (NULL, NULL, NULL, NULL, NULL, NULL)",
    )
    config = pipeline(pg_db, tmp_path / "staging")
    target = str(tmp_path / "delta")
    run_capture(config)
    _exec(
        pg_db,
        f"DELETE FROM h WHERE ctid = {ONE.format(t='h', where='a = 1')}",
        f"UPDATE h SET n = 1.5 WHERE ctid = {ONE.format(t='h', where='a = 2')}",
        f"DELETE FROM h WHERE ctid = {ONE.format(t='h', where='a IS NULL')}",
        "INSERT INTO h VALUES (1, 'b1', NULL, '2024-01-01 00:00+00', ARRAY['x', NULL], '\\x00')",
        "BEGIN; DELETE FROM h WHERE a = 4; INSERT INTO h (a, b) VALUES (4, 'back'), (4, 'back'); COMMIT",
    )
    run_capture(config)
    apply_all(spark, config, target)
    assert_silver_multiset(spark, config, target)
    silver = table_path(target, "silver", config["name"], TABLE)
    info = delta_log.last_commit_info(silver)
    assert info is not None and "through" in info["userMetadata"]
    _exec(
        pg_db,
        "UPDATE h SET b = 'z' WHERE a = 3",
        "BEGIN; TRUNCATE h; INSERT INTO h (a) VALUES (7), (7), (8); COMMIT",
        f"UPDATE h SET a = 9 WHERE ctid = {ONE.format(t='h', where='a = 7')}",
    )
    run_capture(config)
    _exec(pg_db, "INSERT INTO h (a) VALUES (7)")
    run_capture(config, signals=[{"execute-snapshot": {"data-collections": [TABLE]}}])
    _exec(pg_db, f"DELETE FROM h WHERE ctid = {ONE.format(t='h', where='a = 7')}")
    run_capture(config)
    apply_all(spark, config, target)
    assert_silver_multiset(spark, config, target)
    # applying every batch again writes nothing
    version = _version(silver)
    apply_all(spark, config, target)
    assert _version(silver) == version
    # the last window captured again in another batch (a capture that died before its commit
    # published it first): every event is at or below what silver holds, nothing changes
    last = list_batches(config["staging.path"], config["name"])[-1]
    again = last.path.parent / "20991231T000000000000Z-0000aa"
    shutil.copytree(last.path, again)
    manifest = json.loads((again / "manifest.json").read_text())
    (again / "manifest.json").write_text(json.dumps({**manifest, "batch_id": again.name}))
    rows = sorted(map(repr, silver_multiset(spark, target, config, TABLE)))
    apply_batch(spark, str(again), target, ApplySettings())
    assert sorted(map(repr, silver_multiset(spark, target, config, TABLE))) == rows
    assert_silver_multiset(spark, config, target)


def test_default_identity_silver_is_an_append_log(spark, pg_db, tmp_path):
    _exec(pg_db, "CREATE TABLE hist (tid int, delta int)", "INSERT INTO hist VALUES (1, 5), (1, 5)")
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    _exec(pg_db, "INSERT INTO hist VALUES (2, 7)")
    run_capture(config)
    target = str(tmp_path / "delta")
    apply_all(spark, config, target)
    apply_all(spark, config, target)
    silver = spark.read.format("delta").load(table_path(target, "silver", config["name"], "public.hist"))
    got = sorted((r["__op"], r["tid"], r["delta"]) for r in silver.collect())
    assert got == [("c", 2, 7), ("r", 1, 5), ("r", 1, 5)]


@pytest.mark.slow
def test_keyless_convergence_with_sigkills_through_spark(spark, pg_db, tmp_path):
    """The SIGKILL scenario of ``postgres/test_keyless`` (equal rows, one of them updated or
    deleted, whole-table snapshots repeated by kills and an ad hoc snapshot, windows captured
    again after a kill) applied by Spark, every published batch in order, orphans included:
    silver equals the source as a multiset, and the keyed table beside it as rows."""
    config = keyless_setup(pg_db, tmp_path)
    runs = keyless_crash_runs(pg_db, tmp_path, config, seed=11)
    assert runs.kills >= 3, f"only {runs.kills} kills happened"
    batches = list_batches(config["staging.path"], config["name"])
    target = str(tmp_path / "delta")
    half = len(batches) // 2  # two jobs: a backlog, then the rest
    for part in (batches[:half], batches[half:]):
        apply_batches(spark, [str(b.path) for b in part], target, ApplySettings())
    assert_silver_multiset(spark, config, target, "public.ev")
    source = source_multiset(config, "public.ev")
    assert len(source) > len({repr(r) for r in source}), "the table should hold equal rows"
    names = semantic_names(config, "public.keyed")
    got = silver_rows(spark, target, config, "public.keyed", ["id"])
    assert not (problem := diff(normalised_rows(source_rows(config, "public.keyed"), names), got)), problem


@pytest.mark.slow
def test_mariadb_keyless_convergence_with_sigkills_through_spark(spark, mariadb_db, tmp_path):
    """The MariaDB SIGKILL scenario (``mysql/test_keyless``) applied by Spark, every published
    batch in order, orphans included: silver equals the source as a multiset."""
    config, runs = mysql_keyless.keyless_crash_runs(mariadb_db, tmp_path, seed=9)
    assert runs.kills >= 3, f"only {runs.kills} kills happened"
    batches = list_batches(config["staging.path"], config["name"])
    target = str(tmp_path / "delta")
    apply_batches(spark, [str(b.path) for b in batches], target, ApplySettings())
    ev, keyed = f"{mariadb_db.name}.ev", f"{mariadb_db.name}.keyed"
    names = semantic_names(config, ev)
    got = silver_multiset(spark, target, config, ev)
    assert_multiset_equal(ev, normalised_list(mysql_support.source_multiset(config, ev), names), got)
    assert replay(config).keyless[ev].anomalies == 0
    names = semantic_names(config, keyed)
    got_keyed = silver_rows(spark, target, config, keyed, ["id"])
    expected = normalised_rows(mysql_support.source_rows(config, keyed), names)
    assert not (problem := diff(expected, got_keyed)), problem

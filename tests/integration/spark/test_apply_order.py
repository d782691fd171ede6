"""Exactly-once and ordering: re-applied, out-of-order and crashed applies end in the same silver."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from airflow_cdc.apply.submit import build_apply_job
from airflow_cdc.core.batch import list_batches
from spark_jobs.cdc_apply import delta_log
from spark_jobs.cdc_apply.job import ApplySettings, apply_batch
from spark_jobs.cdc_apply.layout import app_id, table_path
from tests.integration.postgres.support import pipeline, run_capture
from tests.integration.spark.test_apply_basic import _exec, assert_silver_matches

pytestmark = pytest.mark.spark

ALWAYS_MERGE = ApplySettings(rewrite_ratio=0)
ALWAYS_REWRITE = ApplySettings(rewrite_ratio=1e-9)  # any batch rewrites a table that has rows
BIG = "".join(f"{i:08x}" for i in range(4000))  # 32 kB: TOASTed out of line


def _history(pg_db, tmp_path):
    """Five batches: snapshot, updates + key change + deletes, truncate + refill, TOAST, more deletes."""
    _exec(
        pg_db,
        "CREATE TABLE o (id int PRIMARY KEY, v text, big text, n int)",
        "INSERT INTO o SELECT g, 'v' || g, CASE WHEN g % 10 = 0 THEN %s END, g FROM generate_series(1, 300) g".replace(
            "%s", f"'{BIG}'"
        ),
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 50) g",
    )
    config = pipeline(pg_db, tmp_path / "staging", **{"skipped.operations": "none"})
    run_capture(config)
    _exec(
        pg_db,
        "UPDATE o SET v = 'u1' WHERE id <= 100",
        "UPDATE o SET id = id + 1000 WHERE id BETWEEN 101 AND 109",
        "DELETE FROM o WHERE id BETWEEN 200 AND 220",
        "INSERT INTO o VALUES (210, 'back', NULL, 0)",
    )
    run_capture(config)
    _exec(
        pg_db,
        "BEGIN; TRUNCATE t; INSERT INTO t SELECT g, 'b' FROM generate_series(40, 60) g; COMMIT",
        "UPDATE t SET v = 'c' WHERE id = 45",
    )
    run_capture(config)
    _exec(pg_db, "UPDATE o SET n = n + 1 WHERE id % 10 = 0", "UPDATE o SET v = 'toast' WHERE id = 30")
    run_capture(config)
    _exec(
        pg_db,
        "DELETE FROM o WHERE id % 7 = 0",
        "DELETE FROM t WHERE id > 55",
        "INSERT INTO o VALUES (7, 'again', NULL, 7)",
    )
    run_capture(config)
    return config


def assert_bronze_exact(spark, target, config, batches):
    """Bronze holds every staged event exactly once: per batch, the manifest's row count."""
    for table in ("public.o", "public.t"):
        bronze = spark.read.format("delta").load(table_path(target, "bronze", config["name"], table))
        got = {r[0]: r[1] for r in bronze.groupBy("__batch_id").count().collect()}
        want = {
            b.batch_id: b.manifest["tables"][table]["rows"] for b in batches if table in b.manifest["tables"]
        }
        assert got == want, table


def _state(spark, target, config, table):
    frame = spark.read.format("delta").load(table_path(target, "silver", config["name"], table))
    # __pending records which older events filled a value: it differs between apply orders
    return sorted(tuple(r) for r in frame.drop("__batch_id", "__pending").collect())


def test_out_of_order_and_repeated_applies_converge(spark, pg_db, tmp_path):
    config = _history(pg_db, tmp_path)
    batches = list_batches(config["staging.path"], config["name"])
    assert len(batches) == 5
    in_order = str(tmp_path / "in_order")
    ways = [
        apply_batch(spark, str(b.path), in_order, ALWAYS_MERGE)["tables"].get("public.o", {}) for b in batches
    ]
    assert "merged" in {w.get("silver") for w in ways}
    for table in ("public.o", "public.t"):
        assert_silver_matches(spark, config, in_order, table, ["id"])
    shuffled = str(tmp_path / "shuffled")
    # older after newer (the snapshot after the TOAST batch, 1 after 4, 2 after 3) and repeats:
    # unchanged-TOAST placeholders for keys silver has not seen yet stay pending until the older
    # batch fills them; and through the other silver write: a rewrite of the table instead of MERGE
    ways = [
        apply_batch(spark, str(batches[i].path), shuffled, ALWAYS_REWRITE)["tables"].get("public.o", {})
        for i in (3, 4, 1, 0, 2, 3, 0, 1)
    ]
    assert "rewritten" in {w.get("silver") for w in ways}
    for table in ("public.o", "public.t"):
        assert _state(spark, shuffled, config, table) == _state(spark, in_order, config, table), table
    # the MERGE fills pending columns from older batches the same way
    merged = str(tmp_path / "shuffled_merge")
    for i in (3, 1, 0):
        apply_batch(spark, str(batches[i].path), merged, ALWAYS_MERGE)
    rows = {r["id"]: r for r in spark.read.format("delta").load(
        table_path(merged, "silver", config["name"], "public.o")).collect()}
    assert rows[30]["big"] == BIG and rows[40]["big"] == BIG and rows[40]["__pending"] is not None
    assert rows[30]["v"] == "toast" and rows[31]["big"] is None and rows[31]["__pending"] is None
    big = spark.read.format("delta").load(table_path(in_order, "silver", config["name"], "public.o"))
    assert big.where("id = 30").collect()[0]["big"] == BIG, "unchanged TOAST value must be kept"
    assert_bronze_exact(spark, shuffled, config, batches)


def test_soft_delete_keeps_flagged_rows(spark, pg_db, tmp_path):
    _exec(
        pg_db,
        "CREATE TABLE s (id int PRIMARY KEY, v text)",
        "INSERT INTO s SELECT g, 'x' FROM generate_series(1, 20) g",
    )
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    _exec(pg_db, "DELETE FROM s WHERE id <= 5", "INSERT INTO s VALUES (3, 'revived')")
    run_capture(config)
    states = []
    for ratio in (ALWAYS_MERGE.rewrite_ratio, ALWAYS_REWRITE.rewrite_ratio):
        target = str(tmp_path / f"delta-{ratio}")
        for b in list_batches(config["staging.path"], config["name"]):
            apply_batch(spark, str(b.path), target, ApplySettings(delete_mode="soft", rewrite_ratio=ratio))
        states.append(_state(spark, target, config, "public.s"))
        rows = {
            r["id"]: r
            for r in spark.read.format("delta")
            .load(table_path(target, "silver", config["name"], "public.s"))
            .collect()
        }
        assert len(rows) == 20
        assert [i for i, r in rows.items() if r["__deleted"]] == [1, 2, 4, 5]
        assert rows[3]["v"] == "revived" and rows[3]["__deleted"] is False
    assert states[0] == states[1], "MERGE and rewrite must give the same silver"


def test_sigkill_mid_apply_then_rerun(spark, pg_db, tmp_path):
    config = _history(pg_db, tmp_path)
    batches = list_batches(config["staging.path"], config["name"])
    target = str(tmp_path / "delta")
    for b in batches[:-1]:
        apply_batch(spark, str(b.path), target)
    job = build_apply_job(batches[-1].path, target)
    env = dict(os.environ, **job.env, AIRFLOW_CDC_FAILPOINTS="apply_after_tombstones")
    proc = subprocess.run(
        job.command("local[1]"), env=env, start_new_session=True, capture_output=True, timeout=600
    )
    assert proc.returncode == -signal.SIGKILL, (proc.stdout + proc.stderr).decode()[-3000:]
    bronze_last = table_path(target, "bronze", config["name"], "public.o")
    assert delta_log.has_applied(bronze_last, app_id(config["name"], batches[-1].batch_id)), (
        "killed too early"
    )
    assert not delta_log.has_applied(
        table_path(target, "silver", config["name"], "public.o"), app_id(config["name"], batches[-1].batch_id)
    ), "killed too late"
    apply_batch(spark, str(batches[-1].path), target)
    apply_batch(spark, str(batches[-1].path), target)
    for table in ("public.o", "public.t"):
        assert_silver_matches(spark, config, target, table, ["id"])
    assert_bronze_exact(spark, target, config, batches)

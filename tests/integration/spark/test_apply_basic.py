"""Apply captured PostgreSQL batches to Delta: silver equals the source and the reference applier."""

from __future__ import annotations

import psycopg
import pytest

from airflow_cdc.core.batch import list_batches
from spark_jobs.cdc_apply import delta_log
from spark_jobs.cdc_apply.job import ApplySettings, apply_batch
from spark_jobs.cdc_apply.layout import app_id, table_path
from tests.integration.postgres.support import pipeline, replay, run_capture, source_rows
from tests.integration.spark.support import diff, normalised_rows, semantic_names, silver_rows

pytestmark = pytest.mark.spark

TYPES_DDL = """CREATE TABLE v (id int PRIMARY KEY, b bool, i2 smallint, i8 bigint, r real, f float8,
    n numeric(10,2), nv numeric, d date, ts timestamp(6), ts3 timestamp(3), tstz timestamptz,
    t time, iv interval, j jsonb, u uuid, by bytea, arr int[], m money, txt text, tsa timestamp[])"""
ROW = """(%s, true, -2, 9007199254740993, 1.5, 0.1, 12.34, 3.14159, '2018-06-20',
    '2018-06-20 15:13:16.945104', '2018-06-20 15:13:16.945', '2018-06-20 15:13:16.945104+02',
    '15:13:16.945104', '1 day 2 hours', '{"a": [1, 2]}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
    '\\x0102ff', '{1,NULL,3}', 12.5, 'x', ARRAY['1999-01-08 04:05:06.5'::timestamp])"""


def _exec(db, *statements):
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def apply_all(spark, config, target, **settings):
    for batch in list_batches(config["staging.path"], config["name"]):
        apply_batch(spark, str(batch.path), target, ApplySettings(**settings))


def assert_silver_matches(spark, config, target, table, keys):
    names = semantic_names(config, table)
    got = silver_rows(spark, target, config, table, keys)
    expected = normalised_rows(source_rows(config, table), names)
    assert not (problem := diff(expected, got)), f"silver vs source: {problem}"
    oracle = normalised_rows(replay(config).rows(table), names)
    assert not (problem := diff(oracle, got)), f"silver vs reference applier: {problem}"


def test_types_ops_and_key_changes(spark, pg_db, tmp_path):
    _exec(pg_db, TYPES_DDL, "INSERT INTO v VALUES " + ROW % 1, "INSERT INTO v VALUES " + ROW % 2)
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    _exec(
        pg_db,
        "INSERT INTO v VALUES " + ROW % 3,
        "UPDATE v SET txt = 'y', n = 99.99 WHERE id = 1",
        "UPDATE v SET id = 20 WHERE id = 2",
        "DELETE FROM v WHERE id = 3",
        "INSERT INTO v (id, nv, tstz) VALUES (4, -12345678901234567890.123456789, '1970-01-01 00:00:00+00')",
    )
    run_capture(config)
    target = str(tmp_path / "delta")
    apply_all(spark, config, target)
    assert_silver_matches(spark, config, target, "public.v", ["id"])
    silver = spark.read.format("delta").load(table_path(target, "silver", config["name"], "public.v"))
    types = {f.name: f.dataType.simpleString() for f in silver.schema.fields}
    assert types["d"] == "date" and types["ts"] == "timestamp_ntz" and types["tstz"] == "timestamp"
    assert types["n"] == "decimal(10,2)" and types["j"] == "string" and types["by"] == "binary"
    assert types["t"] == "string" and types["arr"] == "array<int>" and types["tsa"] == "array<timestamp_ntz>"
    bronze = spark.read.format("delta").load(table_path(target, "bronze", config["name"], "public.v"))
    assert bronze.count() == sum(
        b.manifest["tables"].get("public.v", {}).get("rows", 0)
        for b in list_batches(config["staging.path"], config["name"])
    )


def test_reapply_changes_nothing(spark, pg_db, tmp_path):
    _exec(
        pg_db,
        "CREATE TABLE k (id int PRIMARY KEY, v text)",
        "INSERT INTO k SELECT g, 'v' || g FROM generate_series(1, 50) g",
    )
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    _exec(pg_db, "UPDATE k SET v = 'new' WHERE id < 10", "DELETE FROM k WHERE id > 45")
    run_capture(config)
    target = str(tmp_path / "delta")
    apply_all(spark, config, target)
    silver = table_path(target, "silver", config["name"], "public.k")
    bronze = table_path(target, "bronze", config["name"], "public.k")
    versions = (_version(spark, silver), _version(spark, bronze))
    apply_all(spark, config, target)
    assert (_version(spark, silver), _version(spark, bronze)) == versions
    batch = list_batches(config["staging.path"], config["name"])[-1]
    assert delta_log.has_applied(silver, app_id(config["name"], batch.batch_id))
    info = delta_log.last_commit_info(silver)
    assert info is not None and batch.batch_id in info["userMetadata"]
    assert_silver_matches(spark, config, target, "public.k", ["id"])


def test_stale_fence_stops_apply_before_writing(spark, pg_db, tmp_path):
    """A run whose lease was taken over (older fencing token) writes nothing a newer run wrote."""
    _exec(pg_db, "CREATE TABLE f (id int PRIMARY KEY, v text)", "INSERT INTO f VALUES (1, 'a'), (2, 'b')")
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    _exec(pg_db, "UPDATE f SET v = 'z' WHERE id = 1")
    run_capture(config)
    first, second = list_batches(config["staging.path"], config["name"])
    target = str(tmp_path / "delta")
    apply_batch(spark, str(first.path), target, ApplySettings(fence=5))
    silver = table_path(target, "silver", config["name"], "public.f")
    assert delta_log.newest_fence(silver) == 5
    before = _version(spark, silver)
    with pytest.raises(delta_log.StaleFence, match="newer than this run's 4"):
        apply_batch(spark, str(second.path), target, ApplySettings(fence=4))
    assert _version(spark, silver) == before
    apply_batch(spark, str(second.path), target, ApplySettings(fence=6))
    assert delta_log.newest_fence(silver) == 6
    assert_silver_matches(spark, config, target, "public.f", ["id"])


def _version(spark, path):
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, path).history(1).collect()[0]["version"]


def test_cli_apply_commit_and_verify_with_message_key_columns(pg_db, tmp_path):
    """`airflow-cdc apply --commit` (spark-submit) then `airflow-cdc verify`, on a table keyed by
    ``message.key.columns`` (no primary key).  Three batches wait (two committed by their capture,
    one not), then a fourth captured from the same state as the third (the third's run died
    after publishing it; this is its retry): one job applies them, each table's stretch in one
    pass, and commits the retry, not the overtaken third."""
    import json
    import os
    import subprocess
    import sys

    from airflow_cdc.core.pipeline import build_config, build_store

    _exec(
        pg_db,
        "CREATE TABLE nk (code text NOT NULL, v int)",
        "ALTER TABLE nk REPLICA IDENTITY FULL",
        "INSERT INTO nk SELECT 'c' || g, g FROM generate_series(1, 30) g",
    )
    config = pipeline(
        pg_db,
        tmp_path / "staging",
        **{"message.key.columns": "public.nk:code", "delta.root": str(tmp_path / "lake")},
    )
    run_capture(config)
    _exec(
        pg_db,
        "UPDATE nk SET v = v + 100 WHERE code IN ('c1', 'c2')",
        "DELETE FROM nk WHERE code = 'c5'",
        "INSERT INTO nk VALUES ('c99', 99)",
    )
    run_capture(config)
    _exec(pg_db, "UPDATE nk SET v = 7 WHERE code = 'c2'", "DELETE FROM nk WHERE code = 'c99'")
    run_capture(config, commit=False)
    _exec(pg_db, "UPDATE nk SET v = 8 WHERE code = 'c4'")
    run_capture(config, commit=False)  # the retry: it reads the third one's changes again
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(config))
    cli = [sys.executable, "-m", "airflow_cdc.cli"]
    done = subprocess.run(
        [*cli, "apply", "--config", str(path), "--commit"],
        capture_output=True,
        timeout=900,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    text = done.stdout.decode()  # the job's own report line, then the command's JSON
    out = json.loads(text[text.rfind("\n{\n") + 1 :])
    assert len(out["applied"]) == 4 and not out["without_spark"], out
    assert "(4 batches)" in done.stderr.decode(), "one job for the four batches"
    stored = build_store(build_config(config)).load(config["name"])
    assert stored is not None, "apply --commit must commit"
    assert stored.data["last_batch"] == out["applied"][-1], "the retry is committed"
    assert f"batch {out['applied'][2]} is not committed" in done.stderr.decode()
    _exec(pg_db, "UPDATE nk SET v = -1 WHERE code = 'c3'")
    check = subprocess.run([*cli, "verify", "--config", str(path)], capture_output=True, timeout=900)
    report = json.loads(check.stdout)
    nk = report["tables"]["public.nk"]
    assert check.returncode == 1 and (nk["different"], nk["missing"], nk["extra"]) == (1, 0, 0), report

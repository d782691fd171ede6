"""Bronze at the cost of a file copy: the staged parts go into bronze unchanged where Delta reads
them as Spark reads the parts, and the DataFrame append takes over everywhere else."""

from __future__ import annotations

import datetime as dt
import os

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.sources.postgres import tables
from spark_jobs.cdc_apply import bronze_copy, delta_log
from spark_jobs.cdc_apply.job import ApplySettings, apply_batch, apply_batches
from spark_jobs.cdc_apply.layout import table_path
from spark_jobs.cdc_apply.staged import StagedBatch
from tests.integration.postgres.support import pipeline, run_capture
from tests.integration.spark.test_apply_basic import ROW, TYPES_DDL, assert_silver_matches

pytestmark = pytest.mark.spark


def _exec(db, *statements):
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _bronze(spark, target, config, table):
    return spark.read.format("delta").load(table_path(target, "bronze", config["name"], table))


def _staged_rows(spark, batch, table):
    """Every staged event of ``table`` in ``batch`` as Spark reads the parts, plus its batch id."""
    staged = StagedBatch(str(batch.path))
    files = [f for t in staged.tables() if t.name == table for g in t.groups for f in g.files]
    frames = [spark.read.parquet(f) for f in files]
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame, allowMissingColumns=True)
    return out


def _plain(value):
    """A row value with struct fields that are null dropped: a part written before a column was
    added has no such field; bronze, evolved since, reads it as null."""
    if hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict().items() if v is not None}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _rows(frame, columns):
    return sorted(repr(_plain(r)) for r in frame.select(*columns).collect())


def _assert_bronze_is_staged(spark, target, config, table):
    bronze = _bronze(spark, target, config, table)
    for batch in list_batches(config["staging.path"], config["name"]):
        if table not in batch.manifest["tables"]:
            continue
        staged = _staged_rows(spark, batch, table)
        got = bronze.where(bronze["__batch_id"] == batch.batch_id)
        assert got.count() == batch.manifest["tables"][table]["rows"]
        assert _rows(got, staged.columns) == _rows(staged, staged.columns), batch.batch_id
        dates = {r[0] for r in got.selectExpr("to_date(timestamp_millis(ts_ms)) = __date").collect()}
        assert dates == {True}


def _log_paths(path):
    return sorted(delta_log.replay(path).files)


def test_bronze_adds_the_staged_files_unchanged(spark, pg_db, tmp_path):
    _exec(pg_db, TYPES_DDL, "INSERT INTO v VALUES " + ROW % 1, "INSERT INTO v VALUES " + ROW % 2)
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    _exec(
        pg_db,
        "INSERT INTO v VALUES " + ROW % 3,
        "UPDATE v SET txt = 'y' WHERE id = 1",
        "DELETE FROM v WHERE id = 2",
    )
    run_capture(config)
    target = str(tmp_path / "delta")
    batches = list_batches(config["staging.path"], config["name"])
    ways = [apply_batch(spark, str(b.path), target)["tables"]["public.v"]["bronze"] for b in batches]
    assert ways == ["copied"] * len(batches)
    _assert_bronze_is_staged(spark, target, config, "public.v")
    assert_silver_matches(spark, config, target, "public.v", ["id"])
    path = table_path(target, "bronze", config["name"], "public.v")
    files = _log_paths(path)
    assert files and all(f.startswith("__date=") and "/__batch_id=" in f for f in files)
    # the table's files are the staged parts themselves (hard links on one filesystem)
    staged_inodes = {
        os.stat(f).st_ino
        for b in batches
        for t in StagedBatch(str(b.path)).tables()
        for g in t.groups
        for f in g.files
    }
    assert {os.stat(os.path.join(path, f)).st_ino for f in files} <= staged_inodes
    version = delta_log.replay(path)
    for b in batches:  # re-applied: nothing new
        assert apply_batch(spark, str(b.path), target)["tables"]["public.v"].get("bronze") is None
    assert delta_log.replay(path).files == version.files


def test_new_columns_reencode_once_then_copy_again(spark, pg_db, tmp_path):
    _exec(pg_db, "CREATE TABLE e (id int PRIMARY KEY, a text)", "INSERT INTO e VALUES (1, 'x'), (2, 'y')")
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    _exec(pg_db, "ALTER TABLE e ADD COLUMN b numeric(8,3)", "INSERT INTO e VALUES (3, 'z', 1.5)")
    run_capture(config)
    _exec(pg_db, "UPDATE e SET b = 2.25 WHERE id = 1", "DELETE FROM e WHERE id = 2")
    run_capture(config)
    target = str(tmp_path / "delta")
    batches = list_batches(config["staging.path"], config["name"])
    ways = [apply_batch(spark, str(b.path), target)["tables"]["public.e"]["bronze"] for b in batches]
    assert ways == ["copied", "appended", "copied"]
    _assert_bronze_is_staged(spark, target, config, "public.e")
    assert_silver_matches(spark, config, target, "public.e", ["id"])


def _batches_across_the_origin_fields(pg_db, tmp_path, monkeypatch):
    """Two batches staged with the ``source`` struct before Debezium 3.6's ``origin`` /
    ``origin_lsn`` (as the previous version wrote them), then two with them, one from an origin."""
    _exec(pg_db, "CREATE TABLE s (id int PRIMARY KEY, a text)", "INSERT INTO s VALUES (1, 'x')")
    config = pipeline(pg_db, tmp_path / "staging")
    before = pa.struct([f for f in tables.SOURCE_TYPE if not f.name.startswith("origin")])
    with monkeypatch.context() as m:
        m.setattr(tables, "SOURCE_TYPE", before)
        run_capture(config)
        _exec(pg_db, "INSERT INTO s VALUES (2, 'y')")
        run_capture(config)
    origin = f"{pg_db.name}_o"
    _exec(
        pg_db,
        f"SELECT pg_replication_origin_create('{origin}')",
        f"SELECT pg_replication_origin_session_setup('{origin}'); "
        "BEGIN; SELECT pg_replication_origin_xact_setup('0/12345', now()); INSERT INTO s VALUES (3, 'o'); COMMIT; "
        "SELECT pg_replication_origin_session_reset()",
        f"SELECT pg_replication_origin_drop('{origin}')",
    )
    run_capture(config)
    _exec(pg_db, "UPDATE s SET a = 'z' WHERE id = 1")
    run_capture(config)
    return config, list_batches(config["staging.path"], config["name"]), origin


def _assert_bronze_source(spark, target, config, origin):
    bronze = _bronze(spark, target, config, "public.s")
    source = bronze.schema["source"].dataType
    assert source.names[-3:] == ["xmin", "origin", "origin_lsn"]
    rows = {
        (r["op"], r["id"]): (r["origin"], r["origin_lsn"])
        for r in bronze.selectExpr("op", "coalesce(after.id, before.id) AS id", "source.*").collect()
    }
    assert rows == {("r", 1): (None, None), ("c", 2): (None, None), ("c", 3): (origin, 0x12345), ("u", 1): (None, None)}
    _assert_bronze_is_staged(spark, target, config, "public.s")
    assert_silver_matches(spark, config, target, "public.s", ["id"])


def test_a_source_struct_gaining_fields_evolves_bronze(spark, pg_db, tmp_path, monkeypatch):
    """A bronze table created before ``source`` gained ``origin`` / ``origin_lsn`` takes the new
    batches: the first one re-encoded (Delta's schema merge appends the nested fields; the older
    rows read them as null), the next ones added as files again."""
    config, batches, origin = _batches_across_the_origin_fields(pg_db, tmp_path, monkeypatch)
    target = str(tmp_path / "delta")
    ways = [apply_batch(spark, str(b.path), target)["tables"]["public.s"]["bronze"] for b in batches]
    assert ways == ["copied", "copied", "appended", "copied"]
    _assert_bronze_source(spark, target, config, origin)


def test_a_backlog_across_the_source_change_applies_alike(spark, pg_db, tmp_path, monkeypatch):
    config, batches, origin = _batches_across_the_origin_fields(pg_db, tmp_path, monkeypatch)
    target = str(tmp_path / "delta")
    apply_batches(spark, [str(b.path) for b in batches], target)
    _assert_bronze_source(spark, target, config, origin)


def test_names_delta_refuses_without_mapping_reencode(spark, pg_db, tmp_path):
    _exec(
        pg_db,
        'CREATE TABLE "odd" (id int PRIMARY KEY, "my col" text, "a,b" int)',
        "INSERT INTO odd VALUES (1, 'x', 2)",
    )
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    _exec(pg_db, "UPDATE odd SET \"my col\" = 'y'")
    run_capture(config)
    target = str(tmp_path / "delta")
    ways = [
        apply_batch(spark, str(b.path), target)["tables"]["public.odd"]["bronze"]
        for b in list_batches(config["staging.path"], config["name"])
    ]
    assert ways == ["appended", "appended"]
    layout = bronze_copy.table_layout(spark, table_path(target, "bronze", config["name"], "public.odd"))
    assert layout is not None and layout[0] == bronze_copy.PARTITIONS and layout[1] == "name"
    _assert_bronze_is_staged(spark, target, config, "public.odd")


def test_tables_of_earlier_versions_keep_their_layout(spark, pg_db, tmp_path):
    _exec(pg_db, "CREATE TABLE l (id int PRIMARY KEY, a text)", "INSERT INTO l VALUES (1, 'x')")
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    _exec(pg_db, "INSERT INTO l VALUES (2, 'y')")
    run_capture(config)
    target = str(tmp_path / "delta")
    first, second = list_batches(config["staging.path"], config["name"])
    assert (
        apply_batch(spark, str(first.path), target, ApplySettings(bronze_copy=False))["tables"]["public.l"][
            "bronze"
        ]
        == "appended"
    )
    assert apply_batch(spark, str(second.path), target)["tables"]["public.l"]["bronze"] == "appended"
    layout = bronze_copy.table_layout(spark, table_path(target, "bronze", config["name"], "public.l"))
    assert layout is not None and layout[0] == ["__date"]
    _assert_bronze_is_staged(spark, target, config, "public.l")


def test_files_placed_by_a_killed_run_are_replaced_not_added(spark, pg_db, tmp_path):
    """A run killed after placing the files and before its commit: the retry's parts take the
    same names, so the table gets each event once and no orphan file remains."""
    _exec(
        pg_db,
        "CREATE TABLE k (id int PRIMARY KEY, a text)",
        "INSERT INTO k SELECT g, 'v' FROM generate_series(1, 30) g",
    )
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    _exec(pg_db, "UPDATE k SET a = 'w' WHERE id < 10")
    run_capture(config)
    target = str(tmp_path / "delta")
    first, second = list_batches(config["staging.path"], config["name"])
    apply_batch(spark, str(first.path), target)
    path = table_path(target, "bronze", config["name"], "public.k")
    layout = bronze_copy.table_layout(spark, path)
    assert layout is not None
    table = next(t for t in StagedBatch(str(second.path)).tables() if t.name == "public.k")
    parts = bronze_copy.plan(spark, table, second.batch_id, layout[2])
    assert parts
    bronze_copy.copy_parts(parts, path)  # ... and the run dies here
    assert apply_batch(spark, str(second.path), target)["tables"]["public.k"]["bronze"] == "copied"
    _assert_bronze_is_staged(spark, target, config, "public.k")
    on_disk = {
        os.path.relpath(os.path.join(d, n), path)
        for d, _, names in os.walk(path)
        if "_delta_log" not in d
        for n in names
        if n.endswith(".parquet")
    }
    assert on_disk == set(_log_paths(path))


def test_a_part_spanning_two_dates_is_not_copied(tmp_path):
    zone = bronze_copy.ZoneInfo("UTC")
    midnight = int(dt.datetime(2026, 11, 25, tzinfo=dt.UTC).timestamp() * 1000)
    one_day = tmp_path / "one.parquet"
    two_days = tmp_path / "two.parquet"
    pq.write_table(pa.table({"ts_ms": [midnight, midnight + 5]}), one_day)
    pq.write_table(pa.table({"ts_ms": [midnight - 1, midnight + 5]}), two_days)
    assert bronze_copy._one_date(pq.read_metadata(one_day), zone) == "2026-11-25"
    assert bronze_copy._one_date(pq.read_metadata(two_days), zone) is None
    # in another session time zone the same events fall on one date
    assert (
        bronze_copy._one_date(pq.read_metadata(two_days), bronze_copy.ZoneInfo("Europe/Berlin"))
        == "2026-11-25"
    )
    no_stats = tmp_path / "nostats.parquet"
    pq.write_table(pa.table({"ts_ms": [midnight]}), no_stats, write_statistics=False)
    assert bronze_copy._one_date(pq.read_metadata(no_stats), zone) is None

"""Schema evolution: source ADD / DROP / widen between runs; an impossible change applies nothing."""

from __future__ import annotations

import pytest

from airflow_cdc.core.batch import list_batches
from spark_jobs.cdc_apply.frames import SchemaChangeError
from spark_jobs.cdc_apply.job import apply_batch
from spark_jobs.cdc_apply.layout import table_path
from tests.integration.postgres.support import pipeline, run_capture
from tests.integration.spark.test_apply_basic import _exec

pytestmark = pytest.mark.spark


def _apply_new(spark, config, target, done):
    for b in list_batches(config["staging.path"], config["name"]):
        if b.batch_id not in done:
            apply_batch(spark, str(b.path), target)
            done.add(b.batch_id)


def _versions(spark, target, config, tables):
    from delta.tables import DeltaTable

    return {
        t: DeltaTable.forPath(spark, table_path(target, layer, config["name"], t)).history(1).collect()[0][0]
        for t in tables
        for layer in ("silver", "bronze")
    }


def test_add_drop_widen_then_refuse_incompatible(spark, pg_db, tmp_path):
    _exec(
        pg_db,
        "CREATE TABLE e (id int PRIMARY KEY, n int, p numeric(6,2), gone text)",
        "INSERT INTO e SELECT g, g, g / 4.0, 'x' FROM generate_series(1, 20) g",
        "CREATE TABLE other (id int PRIMARY KEY, v text)",
        "INSERT INTO other VALUES (1, 'a')",
    )
    config = pipeline(pg_db, tmp_path / "staging")
    target, done = str(tmp_path / "delta"), set()
    run_capture(config)
    # one window spans the ALTERs: the batch holds two schema versions of e
    _exec(
        pg_db,
        "UPDATE e SET n = n + 1 WHERE id < 5",
        "ALTER TABLE e ADD COLUMN added text, DROP COLUMN gone",
        "ALTER TABLE e ALTER COLUMN n TYPE bigint, ALTER COLUMN p TYPE numeric(12,4)",
        "UPDATE e SET n = 5000000000, added = 'new', p = 12345678.1234 WHERE id = 7",
        "INSERT INTO e VALUES (30, 1, 1, 'z')",
    )
    run_capture(config)
    _apply_new(spark, config, target, done)
    silver = spark.read.format("delta").load(table_path(target, "silver", config["name"], "public.e"))
    types = {f.name: f.dataType.simpleString() for f in silver.schema.fields}
    assert types["n"] == "bigint" and types["p"] == "decimal(12,4)" and types["added"] == "string"
    rows = {r["id"]: r for r in silver.collect()}
    assert rows[7]["n"] == 5_000_000_000 and rows[7]["added"] == "new"
    assert rows[1]["added"] is None and rows[1]["gone"] == "x"  # dropped column: kept, stops changing
    assert rows[30]["gone"] is None
    # the dropped column stays in silver (null for new rows): compare the live columns
    assert_silver_matches_live(spark, config, target)
    # an incompatible change: text -> int cannot widen; nothing of the batch may land
    _exec(
        pg_db,
        "UPDATE other SET v = 'b'",
        "ALTER TABLE e ALTER COLUMN added TYPE int USING 1",
        "UPDATE e SET added = 2 WHERE id = 1",
    )
    run_capture(config)
    before = _versions(spark, target, config, ["public.e", "public.other"])
    with pytest.raises(SchemaChangeError, match=r"added.*string -> int"):
        _apply_new(spark, config, target, done)
    assert _versions(spark, target, config, ["public.e", "public.other"]) == before


def assert_silver_matches_live(spark, config, target):
    from tests.integration.postgres.support import source_rows
    from tests.integration.spark.support import normalised_rows, semantic_names, silver_rows

    names = semantic_names(config, "public.e")
    got = {
        k: {c: v for c, v in row.items() if c in names}
        for k, row in silver_rows(spark, target, config, "public.e", ["id"]).items()
    }
    expected = normalised_rows(source_rows(config, "public.e"), names)
    assert got == expected

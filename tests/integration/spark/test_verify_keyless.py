"""``verify`` of tables without key columns: a multiset silver table is compared with the source as
a multiset (copies per whole-row image, NULLs equal), on PostgreSQL and MariaDB; it passes once
converged (equal rows included) and names the image and both copy counts once silver loses one of
two equal rows or gains one.  An append-only log is reported as not compared."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from airflow_cdc.apply.verify import AS_MULTISET, BY_KEY, NOT_COMPARED, verify
from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.pipeline import build_config
from spark_jobs.cdc_apply.compare_multiset import MultisetResult, compare_multiset, stage_rows
from spark_jobs.cdc_apply.frames import all_of
from spark_jobs.cdc_apply.job import ApplySettings, apply_batches
from spark_jobs.cdc_apply.layout import table_path
from tests.integration.mysql import support as mysql
from tests.integration.postgres import support as pg
from tests.integration.postgres.test_keyless import ONE

pytestmark = pytest.mark.spark

PAIR = {"a": 100, "b": "pair", "n": Decimal("1.50")}  # two equal rows in the source
NULLS = {"a": None, "b": None, "n": None}  # two rows of NULLs
NULL_AB = {"a": None, "b": None}


def _apply(spark: Any, config: dict[str, Any], target: str) -> None:
    batches = list_batches(config["staging.path"], config["name"])
    apply_batches(spark, [str(b.path) for b in batches], target, ApplySettings())


def _same(image: dict[str, Any]) -> Any:
    """Rows whose columns equal ``image`` (NULL-safe)."""
    return all_of([F.col(c).eqNullSafe(F.lit(v)) for c, v in image.items()])


def _drop_one(spark: Any, path: str, image: dict[str, Any]) -> None:
    """Delete one of silver's equal rows ``image`` (a Delta delete takes them all: put the rest back)."""
    silver = spark.read.format("delta").load(path)
    rest = silver.where(_same(image)).collect()[1:]
    DeltaTable.forPath(spark, path).delete(_same(image))
    spark.createDataFrame(rest, silver.schema).write.format("delta").mode("append").save(path)


def _add_one(spark: Any, path: str, image: dict[str, Any]) -> None:
    """Append one more copy of silver's row ``image``."""
    silver = spark.read.format("delta").load(path)
    silver.where(_same(image)).limit(1).write.format("delta").mode("append").save(path)


def _verify(spark: Any, config: dict[str, Any], target: str) -> Any:
    """Verify every table, the source read in chunks of 7 rows (pieces, for a keyless one)."""
    return verify(build_config(config), target, spark=spark, chunk=7)


def _assert_verified(spark: Any, config: dict[str, Any], target: str, compared: dict[str, tuple]) -> Any:
    """Apply every batch; verify passes, comparing each table as ``compared`` says:
    ``{table: (how, source rows)}``."""
    _apply(spark, config, target)
    report = _verify(spark, config, target)
    assert report.ok, report.differences
    assert {t.table: (t.compared, t.source_rows) for t in report.tables} == compared
    return report


def _assert_tampering_found(spark: Any, config: dict[str, Any], target: str, table: str) -> None:
    """Silver loses one of the two ``PAIR`` rows, then gains a third row of NULLs: verify names
    each image with its copies in the source and in silver."""
    path = table_path(target, "silver", config["name"], table)
    _drop_one(spark, path, PAIR)
    report = next(t for t in _verify(spark, config, target).tables if t.table == table)
    assert not report.ok and report.compared == AS_MULTISET
    assert report.missing == [{"row": PAIR, "source": 2, "silver": 1}]
    assert (report.missing_count, report.extra_count, report.silver_rows) == (1, 0, report.source_rows - 1)
    _add_one(spark, path, NULLS)
    whole = _verify(spark, config, target)
    report = next(t for t in whole.tables if t.table == table)
    assert report.missing == [{"row": PAIR, "source": 2, "silver": 1}]
    assert report.extra == [{"row": NULLS, "source": 2, "silver": 3}]
    assert (report.missing_count, report.extra_count, report.silver_rows) == (1, 1, report.source_rows)
    listed = whole.to_json()["differences"][table]
    assert listed["counts"] == {"missing": 1, "extra": 1, "different": 0}
    assert whole.to_json()["tables"][table]["compared"] == AS_MULTISET


def test_postgres_multiset_verified(spark, pg_db, tmp_path):
    pg.execute(
        pg_db.dsn,
        "CREATE TABLE h (a int, b text, n numeric(6,2))",
        "ALTER TABLE h REPLICA IDENTITY FULL",
        "INSERT INTO h SELECT g % 5, 'b' || (g % 2), NULL FROM generate_series(1, 60) g",
        "INSERT INTO h VALUES (100, 'pair', 1.5), (100, 'pair', 1.5), (NULL, NULL, NULL), (NULL, NULL, NULL)",
        "CREATE TABLE hist (tid int, delta int)",  # DEFAULT identity: an append-only log
        "INSERT INTO hist VALUES (1, 5), (1, 5)",
        "CREATE TABLE keyed (id int PRIMARY KEY, v text)",
        "INSERT INTO keyed SELECT g, 'k' || g FROM generate_series(1, 30) g",
    )
    config = pg.pipeline(pg_db, tmp_path / "staging")
    pg.run_capture(config)
    pg.execute(
        pg_db.dsn,
        f"DELETE FROM h WHERE ctid = {ONE.format(t='h', where='a = 1')}",
        f"UPDATE h SET n = 2.5 WHERE ctid = {ONE.format(t='h', where='a = 2')}",
        "INSERT INTO h VALUES (3, 'b1', NULL), (7, 'new', NULL)",
        "INSERT INTO hist VALUES (2, 7)",
    )
    pg.run_capture(config)
    target = str(tmp_path / "delta")
    compared = {"public.h": (AS_MULTISET, 65), "public.hist": (NOT_COMPARED, 0), "public.keyed": (BY_KEY, 30)}
    report = _assert_verified(spark, config, target, compared)
    hist = report.to_json()["tables"]["public.hist"]
    assert hist["compared"] == NOT_COMPARED and "append-only log" in hist["note"]
    _assert_tampering_found(spark, config, target, "public.h")


def test_mariadb_multiset_verified(spark, mariadb_db, tmp_path):
    mysql.execute(
        mariadb_db,
        "CREATE TABLE h (a int, b varchar(10), n decimal(6,2))",
        "INSERT INTO h SELECT seq % 5, concat('b', seq % 2), NULL FROM seq_1_to_60",
        "INSERT INTO h VALUES (100, 'pair', 1.5), (100, 'pair', 1.5), (NULL, NULL, NULL), (NULL, NULL, NULL)",
        "CREATE TABLE keyed (id int PRIMARY KEY, v varchar(10))",
        "INSERT INTO keyed SELECT seq, concat('k', seq) FROM seq_1_to_30",
    )
    config = mysql.pipeline(mariadb_db, tmp_path / "staging")
    mysql.run_capture(config)
    mysql.execute(
        mariadb_db,
        "DELETE FROM h WHERE a = 1 LIMIT 1",
        "UPDATE h SET n = 2.5 WHERE a = 2 LIMIT 1",
        "INSERT INTO h VALUES (3, 'b1', NULL), (7, 'new', NULL)",
    )
    mysql.run_capture(config)
    target = str(tmp_path / "delta")
    h, keyed = f"{mariadb_db.name}.h", f"{mariadb_db.name}.keyed"
    _assert_verified(spark, config, target, {h: (AS_MULTISET, 65), keyed: (BY_KEY, 30)})
    _assert_tampering_found(spark, config, target, h)


def test_multiset_comparison_with_one_side_empty(spark, tmp_path):
    """No silver table: every source row is missing; no source rows: every silver row is extra
    (the images then take silver's own columns, not its ``__`` ones)."""
    rows = pa.table({"a": pa.array([1, 1, None], pa.int64()), "b": pa.array(["x", "x", None])})
    path = str(tmp_path / "source.parquet")
    schema = stage_rows([rows.slice(0, 2), rows.slice(2, 0), rows.slice(2)], path)
    result = compare_multiset(spark, None, schema, path)
    assert (result.source_rows, result.silver_rows, result.missing_count, result.extra_count) == (3, 0, 3, 0)
    assert result.missing == sorted(
        [{"row": {"a": 1, "b": "x"}, "source": 2, "silver": 0}, {"row": NULL_AB, "source": 1, "silver": 0}],
        key=repr,
    )
    silver = spark.createDataFrame([(None, None, "r"), (None, None, "c")], "a long, b string, __op string")
    result = compare_multiset(spark, silver, stage_rows([], str(tmp_path / "none.parquet")), path)
    assert (result.source_rows, result.silver_rows, result.missing_count, result.extra_count) == (0, 2, 0, 2)
    assert result.extra == [{"row": NULL_AB, "source": 0, "silver": 2}] and not result.missing
    assert compare_multiset(spark, None, None, path) == MultisetResult()

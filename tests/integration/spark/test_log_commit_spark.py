"""Spark and Delta read, checkpoint and keep writing a table whose versions this process wrote
(``log_commit``: the Spark Connect client's bronze commits and marks)."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import types as T

from spark_jobs.cdc_apply import delta_log, deltasql, log_commit
from spark_jobs.cdc_apply.writes import Commit

pytestmark = pytest.mark.spark

SCHEMA = T.StructType([T.StructField("a", T.LongType()), T.StructField("__date", T.StringType())])


def _place(table: str, name: str, values: list[int]) -> dict:
    """A Parquet file of ``values`` in the table's partition directory, and its ``add``."""
    folder = os.path.join(table, "__date=2026-12-04")
    os.makedirs(folder, exist_ok=True)
    pq.write_table(pa.table({"a": pa.array(values, pa.int64())}), os.path.join(folder, name))
    size = os.path.getsize(os.path.join(folder, name))
    return {
        "add": {
            "path": f"__date=2026-12-04/{name}",
            "partitionValues": {"__date": "2026-12-04"},
            "size": size,
            "modificationTime": 1_796_400_000_000,
            "dataChange": True,
            "stats": f'{{"numRecords": {len(values)}}}',
        }
    }


def test_spark_reads_checkpoints_and_honours_marks_of_client_commits(spark, tmp_path):
    table = str(tmp_path / "bronze")
    spark.conf.set("spark.databricks.delta.properties.defaults.enableTypeWidening", "true")
    try:
        deltasql.create_table(spark, table, SCHEMA, {"delta.columnMapping.mode": "none"}, ["__date"])
    finally:
        spark.conf.unset("spark.databricks.delta.properties.defaults.enableTypeWidening")
    assert log_commit.refusal(delta_log.replay(table)) is None  # Spark's own new table qualifies
    expected = []
    batch = 0
    while not log_commit.checkpoint_due(delta_log.replay(table)):
        batch += 1
        values = [batch * 100 + i for i in range(batch)]
        adds = [_place(table, f"part-{batch}.parquet", values)]
        assert log_commit.commit(table, adds, [(f"app:{batch}", 1)], f'{{"batch": {batch}}}') is True
        expected += values
    assert delta_log.replay(table).version == 9 and batch == 9
    frame = spark.read.format("delta").load(table)
    assert sorted(r.a for r in frame.collect()) == sorted(expected)
    # version 10 is Spark's: a marked append, which checkpoints
    assert log_commit.commit(table, [_place(table, "x.parquet", [1])], [("app:10", 1)], "m") is None
    spark_commit = Commit("c", "10", '{"batch": 10}')
    spark_commit.append(spark.createDataFrame([(1000, "2026-12-04")], SCHEMA), table)
    names = os.listdir(os.path.join(table, "_delta_log"))
    assert "00000000000000000010.checkpoint.parquet" in names
    expected.append(1000)
    # after the checkpoint: our replay starts from it and this process commits again
    adds = [_place(table, "part-11.parquet", [1100, 1101])]
    assert log_commit.commit(table, adds, [("app:11", 1)], '{"batch": 11}') is True
    expected += [1100, 1101]
    state = delta_log.replay(table)
    assert state.version == 11 and all(state.has_applied(f"app:{n}") for n in range(1, 10))
    assert state.has_applied(spark_commit.app_id) and state.records == len(expected)
    frame = spark.read.format("delta").load(table)
    assert sorted(r.a for r in frame.collect()) == sorted(expected)
    # Delta sees the marks this process wrote: a marked Spark write of app:3 is skipped
    Commit("c", "x", "m").append(spark.createDataFrame([(7, "2026-12-04")], SCHEMA), table)  # unmarked id
    again = spark.createDataFrame([(9999, "2026-12-04")], SCHEMA).write.format("delta").mode("append")
    again.option("txnAppId", "app:3").option("txnVersion", 1).save(table)
    values = [r.a for r in spark.read.format("delta").load(table).collect()]
    assert 9999 not in values and 7 in values
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    assert {r.userMetadata for r in history if r.version in (1, 11)} == {'{"batch": 1}', '{"batch": 11}'}

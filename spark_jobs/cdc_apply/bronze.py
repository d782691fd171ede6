"""Append a batch's events to the bronze change log: the Debezium envelope, one row per event.

One bronze Delta table per source table, partitioned by event date (UTC) so retention and
time-bounded reads prune whole directories.  Columns: the staged envelope unchanged (``op``,
``ts_ms``/``ts_us``/``ts_ns``, ``before``, ``after``, ``source``, ``transaction``,
``__position``, ``__unavailable``) plus ``__batch_id`` and ``__date``.  The append is the
batch's marked write on that table, so a re-run never duplicates events.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .staged import StagedTable
from .writes import Commit

PARTITION = "__date"


def events(spark: SparkSession, table: StagedTable, batch_id: str) -> DataFrame:
    frames = [spark.read.parquet(*g.files) for g in table.groups]
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame, allowMissingColumns=True)
    return out.withColumn("__batch_id", F.lit(batch_id)).withColumn(
        PARTITION, F.to_date(F.timestamp_millis(F.col("ts_ms")))
    )


def append_bronze(spark: SparkSession, path: str, table: StagedTable, commit: Commit) -> None:
    """Append every event of ``table`` in this batch (marked write; a re-run is a no-op)."""
    frame = events(spark, table, commit.batch_id)
    commit.append(frame, path, partition_by=[PARTITION])

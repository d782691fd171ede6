"""Append a batch's events to the bronze change log: the Debezium envelope, one row per event.

One bronze Delta table per source table, partitioned by event date (UTC, the session's time
zone) and batch id, so retention, time-bounded reads and "the events of batch X" prune whole
directories.  Columns: the staged envelope unchanged (``op``, ``ts_ms``/``ts_us``/``ts_ns``,
``before``, ``after``, ``source``, ``transaction``, ``__position``, ``__unavailable``) plus
``__batch_id`` and ``__date``.  The append is the batch's marked write on that table, so a
re-run never duplicates events.  Where it can, the append adds the staged files themselves
(``bronze_copy``); otherwise it re-encodes the events through a DataFrame write.  Tables made
by earlier versions (partitioned by ``__date`` only) keep their layout and are re-encoded.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from . import bronze_copy
from .crash import crash_point
from .staged import StagedTable
from .writes import Commit, commit_actions, create_table

PARTITION = "__date"


def events(spark: SparkSession, table: StagedTable, batch_id: str) -> DataFrame:
    frames = [spark.read.parquet(*g.files) for g in table.groups]
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame, allowMissingColumns=True)
    return out.withColumn("__batch_id", F.lit(batch_id)).withColumn(
        PARTITION, F.to_date(F.timestamp_millis(F.col("ts_ms")))
    )


def append_bronze(
    spark: SparkSession, path: str, table: StagedTable, commit: Commit, copy: bool = True
) -> str:
    """Append every event of ``table`` in this batch (marked write; a re-run is a no-op);
    returns ``copied`` (the staged files were added as they are) or ``appended``."""
    frame = events(spark, table, commit.batch_id)
    layout = bronze_copy.table_layout(spark, path)
    if layout is None and copy:
        names_ok = bronze_copy.valid_without_mapping(frame.schema)
        properties = {"delta.columnMapping.mode": "none"} if names_ok else {}
        create_table(spark, path, frame.schema, properties, partition_by=bronze_copy.PARTITIONS)
        layout = bronze_copy.table_layout(spark, path)
    if copy and layout is not None and layout[0] == bronze_copy.PARTITIONS and layout[1] == "none":
        parts = bronze_copy.plan(spark, table, commit.batch_id, layout[2])
        if parts is not None:
            adds = bronze_copy.copy_parts(parts, path)
            crash_point("apply_bronze_files_placed")
            bronze_copy.commit_files(spark, path, adds, commit)
            return "copied"
    commit.append(frame, path, partition_by=layout[0] if layout is not None else [PARTITION])
    return "appended"


def append_bronze_stretch(
    spark: SparkSession, path: str, batches: list[tuple[StagedTable, Commit]], copy: bool = True
) -> str:
    """Append several batches' events of a table (each ``(table, commit)`` not yet in bronze):
    their staged files and marks in one Delta commit when every batch can be added as files,
    else batch by batch (:func:`append_bronze`); returns how (``copied`` or ``appended``)."""
    layout = bronze_copy.table_layout(spark, path) if copy else None
    if copy and layout is None:
        first, commit = batches[0]
        frame = events(spark, first, commit.batch_id)
        names_ok = bronze_copy.valid_without_mapping(frame.schema)
        properties = {"delta.columnMapping.mode": "none"} if names_ok else {}
        create_table(spark, path, frame.schema, properties, partition_by=bronze_copy.PARTITIONS)
        layout = bronze_copy.table_layout(spark, path)
    if copy and layout is not None and layout[0] == bronze_copy.PARTITIONS and layout[1] == "none":
        planned = [bronze_copy.plan(spark, table, commit.batch_id, layout[2]) for table, commit in batches]
        if all(parts is not None for parts in planned):
            adds = [add for parts in planned for add in bronze_copy.copy_parts(parts or [], path)]
            crash_point("apply_bronze_files_placed")
            commits = [commit for _, commit in batches]
            commit_actions(spark, path, adds, commits, commits[-1])
            return "copied"
    ways = {append_bronze(spark, path, table, commit, copy) for table, commit in batches}
    return ", ".join(sorted(ways))

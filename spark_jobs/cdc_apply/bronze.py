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

import logging
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from . import bronze_copy, delta_log, deltasql, log_commit
from .crash import crash_point
from .delta_log import LogState
from .staged import StagedTable
from .writes import Commit, commit_actions, create_table

log = logging.getLogger("airflow_cdc.apply")

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
    spark: SparkSession,
    path: str,
    table: StagedTable,
    commit: Commit,
    copy: bool = True,
    state: LogState | None = None,
) -> str:
    """Append every event of ``table`` in this batch (marked write; a re-run is a no-op);
    returns ``copied`` (the staged files were added as they are) or ``appended``.  ``state``:
    the bronze log as the caller just replayed it."""
    frame = events(spark, table, commit.batch_id)
    if copy:
        layout = _layout(spark, path, lambda: frame.schema, state)
    else:
        layout = bronze_copy.table_layout(spark, path, state)
    schema = _copy_schema(layout, spark, path, state) if copy else None
    if schema is not None:
        parts = bronze_copy.plan(spark, table, commit.batch_id, schema)
        if parts is not None:
            adds = bronze_copy.copy_parts(parts, path)
            crash_point("apply_bronze_files_placed")
            if bronze_copy.commit_files(spark, path, adds, commit) is not None:
                return "copied"
    commit.append(frame, path, partition_by=layout[0] if layout is not None else [PARTITION])
    return "appended"


def append_bronze_stretch(
    spark: SparkSession,
    path: str,
    batches: list[tuple[StagedTable, Commit]],
    copy: bool = True,
    state: LogState | None = None,
) -> str:
    """Append several batches' events of a table (each ``(table, commit)`` not yet in bronze):
    their staged files and marks in one Delta commit when every batch can be added as files,
    else batch by batch (:func:`append_bronze`); returns how (``copied`` or ``appended``).
    ``state``: the bronze log as the caller just replayed it."""
    first, commit = batches[0]
    layout = None
    if copy:
        layout = _layout(spark, path, lambda: events(spark, first, commit.batch_id).schema, state)
    schema = _copy_schema(layout, spark, path, state)
    if schema is not None:
        planned = [bronze_copy.plan(spark, table, c.batch_id, schema) for table, c in batches]
        if all(parts is not None for parts in planned):
            adds = [add for parts in planned for add in bronze_copy.copy_parts(parts or [], path)]
            crash_point("apply_bronze_files_placed")
            commits = [c for _, c in batches]
            if commit_actions(spark, path, adds, commits, commits[-1]) is not None:
                return "copied"
    ways = {append_bronze(spark, path, table, c, copy) for table, c in batches}
    return ", ".join(sorted(ways))


Layout = tuple[list[str], str, T.StructType]


def _layout(
    spark: SparkSession, path: str, schema: Callable[[], T.StructType], state: LogState | None = None
) -> Layout | None:
    """The bronze table's layout, creating the table first when there is none: partitioned by
    date and batch, without column mapping where the names allow it, so files can be added."""
    layout = bronze_copy.table_layout(spark, path, state)
    if layout is None:
        columns = schema()
        names_ok = bronze_copy.valid_without_mapping(columns)
        properties = {"delta.columnMapping.mode": "none"} if names_ok else {}
        create_table(spark, path, columns, properties, partition_by=bronze_copy.PARTITIONS)
        layout = bronze_copy.table_layout(spark, path)
    return layout


def _copy_schema(
    layout: Layout | None, spark: SparkSession, path: str, state: LogState | None = None
) -> T.StructType | None:
    """The table's schema when staged files can be added to it as they are (``bronze_copy``):
    over Spark Connect, also only where this process may write the commit (``log_commit``).
    ``state``: the bronze log as the caller replayed it (read again when there was no table
    then: :func:`_layout` has just created it)."""
    if layout is None or layout[0] != bronze_copy.PARTITIONS or layout[1] != "none":
        return None
    if deltasql.connected(spark):
        if state is None or state.version < 0:
            state = delta_log.replay(path)
        why = log_commit.refusal(state) or (
            "a checkpoint version" if log_commit.checkpoint_due(state) else None
        )
        if why is not None:
            log.info("bronze %s: re-encoding the events over Spark Connect (%s)", path, why)
            return None
    return layout[2]

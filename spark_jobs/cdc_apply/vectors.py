"""The lean MERGE into a table with deletion vectors, in one scan of the stored keys.

Delta's own MERGE into a table with deletion vectors reads the target three times: a join of
every file's keys with the batch to find the touched files, a join of the touched files with the
batch to write the changed rows, and a scan of the touched files with row indexes to build the
vectors.  When every value the MERGE writes comes from the batch (the *lean* MERGE of
``silver.merge_silver``: no unchanged-TOAST column in the batch, no stored row waiting for one,
no stored column the batch does not carry), none of that needs the stored rows beyond their keys
and positions, so this does it in one pass:

1. the stored keys, positions, file paths and row indexes (``_metadata``) of the table version
   the transaction read, joined with the batch's keys (broadcast when the batch is not huge):
   the *hits*, at most one per batch key;
2. hits whose batch action is newer (delete or upsert) are marked deleted: Delta's own bitmap
   aggregator and vector writer (``DeletionVectorBitmapGenerator``) merge them with each file's
   existing vector and write one vector file;
3. the batch's upserts that win (no hit, or newer than the hit) are written as new data files by
   the transaction (``writeFiles``: column mapping, statistics, constraints as any Delta write);
4. one commit of the vectors' remove/add pairs, the new files and the batch's idempotent mark,
   recorded as a MERGE.

The rows are exactly those of the MERGE: ``tests/integration/spark/test_vector_merge.py`` checks
every column against Delta's MERGE for PostgreSQL captures of composite keys of many types.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .crash import crash_point
from .delta_log import CHANGE_FEED, LogState
from .frames import ACTION, POSITION, all_of, quoted
from .writes import Commit, lacking, mark_action, scala_object

log = logging.getLogger("airflow_cdc.apply")

VECTORS = "delta.enableDeletionVectors"
#: batches of at most this many events send their keys to every task (a broadcast join); larger
#: ones join by shuffle, which is slower but needs no driver memory for the keys
BROADCAST_EVENTS = 1_000_000
#: the rows a batch writes go to one new file per this many events at most
ROWS_PER_FILE = 250_000
_FILE, _ROW, _STORED = "__vm_file", "__vm_row", "__vm_stored"


@dataclass(frozen=True)
class Outcome:
    """What one vector MERGE changed."""

    superseded: int  # stored rows marked deleted
    written: int  # rows written to new files
    vectors: int  # files given a new or larger deletion vector (or removed when fully deleted)
    files: int  # new data files

    def __str__(self) -> str:
        return (
            f"merged by deletion vectors ({self.superseded} stored rows superseded in {self.vectors} "
            f"files, {self.written} rows written to {self.files} new files)"
        )


def applies(state: LogState, table_columns: list[str], carried: list[str]) -> bool:
    """Whether the one-scan MERGE may replace Delta's for a lean, hard-delete MERGE: the table has
    deletion vectors, no change data feed (whose change rows only Delta's MERGE writes) and no
    column the batch does not carry (an update keeps such a column's stored value)."""
    configuration = state.configuration
    return (
        configuration.get(VECTORS, "false") == "true"
        and configuration.get(CHANGE_FEED, "false") != "true"
        and set(table_columns) <= set(carried)
    )


def merge(
    spark: SparkSession,
    path: str,
    source: DataFrame,
    keys: list[str],
    rows: list[Any],
    marks: list[Commit],
    events: int,
) -> Outcome | None:
    """Apply ``source`` (one action per key: ``ACTION``, ``POSITION`` and the table's columns) to
    the silver table at ``path``.  ``rows`` are the columns of a written row in table order (as
    Column expressions over the source aliased ``s``).  ``marks`` are the batch's (first) and
    those of a stretch's earlier batches: the commit records those the table lacks.  None when the
    table already has the batch's mark (nothing written)."""
    commit = marks[0]
    jvm = spark._jvm  # type: ignore[attr-defined]
    delta = jvm.org.apache.spark.sql.delta
    jspark = spark._jsparkSession  # type: ignore[attr-defined]
    scala = jvm.scala.jdk.javaapi.CollectionConverters
    delta_log = delta.DeltaLog.forTable(jspark, path)
    txn = delta_log.startTransaction()
    if txn.txnVersion(commit.app_id) >= commit.version:
        return None
    txn.readWholeTable()
    started = time.monotonic()
    source = source.persist(StorageLevel.MEMORY_AND_DISK)
    hits = None
    try:
        probe = source.select(
            *(F.col(quoted(k)).alias(f"__vm_s{i}") for i, k in enumerate(keys)),
            F.col(POSITION).alias("__vm_s_pos"),
        )
        if events <= BROADCAST_EVENTS:
            probe = F.broadcast(probe)
        stored = spark.read.format("delta").option("versionAsOf", txn.readVersion()).load(path)
        scan = stored.select(
            *(F.col(quoted(k)).alias(f"__vm_t{i}") for i, k in enumerate(keys)),
            F.col(POSITION).alias("__vm_t_pos"),
            F.col("_metadata.file_path").alias(_FILE),
            F.col("_metadata.row_index").alias(_ROW),
        )
        on = [scan[f"__vm_t{i}"].eqNullSafe(probe[f"__vm_s{i}"]) for i in range(len(keys))]
        hits = scan.join(probe, all_of(on), "inner").persist(StorageLevel.MEMORY_AND_DISK)

        superseded = hits.where(F.col("__vm_s_pos") > F.col("__vm_t_pos")).select(_FILE, _ROW)
        snapshot = txn.snapshot()
        candidates = scala.asScala(snapshot.allFiles().collectAsList()).toSeq()
        generator = scala_object(jvm, "org.apache.spark.sql.delta.commands.DeletionVectorBitmapGenerator")
        helper = scala_object(jvm, "org.apache.spark.sql.delta.commands.DMLWithDeletionVectorsHelper")
        results = generator.buildRowIndexSetsForFilesMatchingCondition(
            jspark,
            txn,
            True,
            superseded._jdf,
            candidates,
            jvm.org.apache.spark.sql.catalyst.expressions.Literal.TrueLiteral(),
            jvm.scala.Some(F.col(_FILE)._jc),
            jvm.scala.Some(F.col(_ROW)._jc),
        )
        touched = helper.findFilesWithMatchingRows(
            txn, helper.generateCandidateFileMap(delta_log.dataPath(), candidates), results
        )
        prefix = int(spark.conf.get("spark.databricks.delta.stats.skipping.string.prefixLength", "32"))
        vector_actions = helper.processUnmodifiedData(jspark, touched, snapshot, prefix)._1()

        matched = hits.select(
            *(F.col(f"__vm_t{i}").alias(f"__vm_m{i}") for i in range(len(keys))),
            F.col("__vm_t_pos").alias(_STORED),
        )
        joined = source.alias("s").join(
            matched,
            all_of([F.col(f"s.{quoted(k)}").eqNullSafe(matched[f"__vm_m{i}"]) for i, k in enumerate(keys)]),
            "left",
        )
        wins = (F.col(f"s.{ACTION}") == "upsert") & (
            F.col(_STORED).isNull() | (F.col(f"s.{POSITION}") > F.col(_STORED))
        )
        # a file per ROWS_PER_FILE events at most (the join leaves one per shuffle partition)
        written = joined.where(wins).select(*rows).coalesce(max(1, -(-events // ROWS_PER_FILE)))
        new_files = txn.writeFiles(written._jdf)

        actions = jvm.java.util.ArrayList()
        actions.addAll(scala.asJava(vector_actions))
        actions.addAll(scala.asJava(new_files))
        for mark in lacking(txn, marks):
            actions.add(mark_action(jvm, mark))
        superseding = F.col(_STORED).isNotNull() & (F.col(f"s.{POSITION}") > F.col(_STORED))
        counts = joined.agg(
            F.count(F.lit(1)).alias("source"),
            F.count_if(wins).alias("written"),
            F.count_if(superseding & (F.col(f"s.{ACTION}") == "upsert")).alias("updated"),
            F.count_if(superseding & (F.col(f"s.{ACTION}") == "delete")).alias("deleted"),
        ).collect()[0]
        updated = int(counts["updated"])
        outcome = Outcome(
            superseded=updated + int(counts["deleted"]),
            written=int(counts["written"]),
            vectors=int(touched.size()),
            files=int(new_files.size()),
        )
        metrics = {
            "operationNumSourceRows": int(counts["source"]),
            "numTargetRowsInserted": outcome.written - updated,
            "numTargetRowsUpdated": updated,
            "numTargetRowsMatchedUpdated": updated,
            "numTargetRowsDeleted": int(counts["deleted"]),
            "numTargetRowsMatchedDeleted": int(counts["deleted"]),
            "numTargetRowsCopied": 0,
            "numTargetFilesAdded": outcome.files,
            "numTargetFilesRemoved": 0,
            "numTargetDeletionVectorsAdded": 0,
            "numTargetDeletionVectorsUpdated": 0,
            "numTargetDeletionVectorsRemoved": 0,
            "numTargetBytesAdded": sum(int(a.size()) for a in scala.asJava(new_files)),
            "executionTimeMs": int((time.monotonic() - started) * 1000),
        }
        _count_vectors(vector_actions, scala, metrics)
        _register_metrics(spark, txn, metrics)
        crash_point("apply_before_vector_commit")  # files and vectors written, nothing committed
        with commit.conf(spark, txn=False):
            txn.commit(scala.asScala(actions).toSeq(), _merge_operation(jvm, scala))
    finally:
        if hits is not None:
            hits.unpersist()
        source.unpersist()
    log.info("silver %s: %s in %.1fs", path, outcome, time.monotonic() - started)
    return outcome


def _merge_operation(jvm: Any, scala: Any) -> Any:
    """``DeltaOperations.Merge`` with no predicates recorded (the history shows a MERGE)."""
    none = jvm.scala.Option.empty()
    nothing = scala.asScala(jvm.java.util.ArrayList()).toSeq()
    merge_class = getattr(jvm.org.apache.spark.sql.delta, "DeltaOperations$Merge")
    return merge_class(none, none, none, none, nothing, nothing, nothing)


def _count_vectors(actions: Any, scala: Any, metrics: dict[str, int]) -> None:
    """Delta's file and vector metrics from the remove/add pairs: an add with a vector over a
    remove without one adds a vector, over a remove with one updates it; a remove without an add
    (every row of the file superseded) removes the file."""
    removed: dict[str, bool] = {}
    added: dict[str, bool] = {}
    for action in scala.asJava(actions):
        kind = action.getClass().getSimpleName()
        target = removed if kind == "RemoveFile" else added if kind == "AddFile" else None
        if target is not None:
            target[action.path()] = action.deletionVector() is not None
    for path, had in removed.items():
        if path in added:
            metrics["numTargetDeletionVectorsUpdated" if had else "numTargetDeletionVectorsAdded"] += 1
        else:
            metrics["numTargetFilesRemoved"] += 1
            metrics["numTargetDeletionVectorsRemoved"] += int(had)


def _register_metrics(spark: SparkSession, txn: Any, values: dict[str, int]) -> None:
    """Record ``values`` as the commit's operation metrics (``DESCRIBE HISTORY``)."""
    jvm = spark._jvm  # type: ignore[attr-defined]
    context = spark._jsparkSession.sparkContext()  # type: ignore[attr-defined]
    metrics = jvm.java.util.HashMap()
    for name, value in values.items():
        metric = jvm.org.apache.spark.sql.execution.metric.SQLMetrics.createMetric(context, name)
        metric.set(int(value))
        metrics.put(name, metric)
    entries = jvm.scala.jdk.javaapi.CollectionConverters.asScala(metrics)
    immutable = getattr(scala_object(jvm, "scala.collection.immutable.Map"), "from")(entries)
    txn.registerSQLMetrics(spark._jsparkSession, immutable)  # type: ignore[attr-defined]

"""Apply one staged batch: bronze append, then the ordered silver MERGE, per source table.

Repeating the job for a batch is safe at any point: a table whose marked write already landed
is skipped (``delta_log.has_applied``), and every other write is idempotent by position.  Type
changes are checked for every table before the first write, so an impossible change leaves
nothing half-applied.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import SparkSession

from . import bronze, compaction, delta_log, frames, history, rechunk, silver, toast
from .crash import crash_point
from .layout import table_path
from .session import size_reads
from .staged import StagedBatch, StagedTable
from .writes import Commit

log = logging.getLogger("airflow_cdc.apply")


@dataclass(frozen=True)
class ApplySettings:
    delete_mode: str = "delete"
    bronze: bool = True
    rewrite_ratio: float = 0.5  # see silver.merge_silver; 0 = always MERGE
    fence: int | None = None  # the submitter's lease token: a newer one on a table stops the job
    history: tuple[str, ...] = ()  # regexes of tables with SCD type 2 history (delta.history.enabled)
    history_except: tuple[str, ...] = ()  # regexes of <table>.<column> not tracked in history
    bronze_copy: bool = True  # add staged files to bronze as they are where Delta allows (bronze_copy)
    optimize_interval: int = 100  # OPTIMIZE silver/tombstones every N batches (compaction.py); 0 = never
    deletion_vectors: bool = False  # silver/tombstone tables created with deletion vectors


def apply_batch(
    spark: SparkSession, batch_path: str, target: str, settings: ApplySettings | None = None
) -> dict[str, Any]:
    """Apply the batch at ``batch_path`` to the Delta root ``target``; returns a small report."""
    settings = settings or ApplySettings()
    # tables this job creates (bronze included) widen column types in place on schema changes, and
    # map columns by name so source names with spaces, commas or braces are valid Delta columns
    spark.conf.set("spark.databricks.delta.properties.defaults.enableTypeWidening", "true")
    spark.conf.set("spark.databricks.delta.properties.defaults.columnMapping.mode", "name")
    staged = StagedBatch(batch_path)
    staged.verify_parts()
    commit = Commit(staged.connector, staged.batch_id, staged.commit_metadata(settings.fence))
    tables = staged.tables()
    scratch = rechunk.scratch_dir(target, staged)
    copies = rechunk.copy_oversized(staged, tables, scratch)  # parts staged before the byte limit
    try:
        return _apply_tables(spark, staged, tables, target, commit, settings)
    finally:
        if copies:
            rechunk.remove(scratch)


def _apply_tables(
    spark: SparkSession,
    staged: StagedBatch,
    tables: list[StagedTable],
    target: str,
    commit: Commit,
    settings: ApplySettings,
) -> dict[str, Any]:
    planning = time.monotonic()
    planned = []
    for table in tables:
        frame = frames.table_frame(spark, table, frames.truncate_events(spark, table))
        silver.check_evolution(spark, _path(target, "silver", staged, table), frame)
        planned.append((table, frame))
    report: dict[str, Any] = {"batch_id": staged.batch_id, "connector": staged.connector, "tables": {}}
    started, done_rows, total_rows = time.monotonic(), 0, sum(t.rows for t in tables)
    report["plan_seconds"] = round(started - planning, 3)
    for i, (table, frame) in enumerate(planned, 1):
        begun = time.monotonic()
        done = _apply_table(spark, staged, table, frame, target, commit, settings)
        layers = {layer: _path(target, layer, staged, table) for layer in ("silver", "tombstones")}
        compacted = compaction.compact_all(spark, layers, settings.optimize_interval, commit)
        if compacted:
            done["compacted"] = compacted
        report["tables"][table.name] = done
        done["seconds"] = round(time.monotonic() - begun, 3)
        done_rows += table.rows
        _progress(i, len(planned), table.name, done_rows, total_rows, started)
    report["seconds"] = round(time.monotonic() - started, 3)
    return report


def _path(target: str, layer: str, staged: StagedBatch, table: StagedTable) -> str:
    return table_path(target, layer, staged.connector, table.name)


def _apply_table(
    spark: SparkSession,
    staged: StagedBatch,
    table: StagedTable,
    frame: frames.TableFrame,
    target: str,
    commit: Commit,
    settings: ApplySettings,
) -> dict[str, Any]:
    out: dict[str, Any] = {"events": table.rows, "ops": table.ops}
    bronze_path = _path(target, "bronze", staged, table)
    for layer in ("bronze", "silver"):
        path = _path(target, layer, staged, table)
        delta_log.check_fence(path, settings.fence, staged.manifest.get("partition"))
    silver_path = _path(target, "silver", staged, table)
    replaying = time.monotonic()
    silver_log = delta_log.replay(silver_path)
    out["log_replay_seconds"] = round(time.monotonic() - replaying, 3)
    # reads hold a batch of rows of every column: size it to the widest rows (staged or stored)
    size_reads(spark, max(table.row_bytes, delta_log.row_bytes(silver_path, silver_log)))
    if settings.bronze and not delta_log.has_applied(bronze_path, commit.app_id):
        out["bronze"] = bronze.append_bronze(spark, bronze_path, table, commit, settings.bronze_copy)
        crash_point("apply_after_bronze")
    if table.key_columns and history.matches(settings.history, table.name):
        out["history"] = _apply_history(spark, staged, table, frame, target, commit, settings, silver_log)
    if silver_log.has_applied(commit.app_id):
        out["silver"] = "already applied"
        return out
    soft = settings.delete_mode == "soft"
    if not table.key_columns:
        silver.append_keyless(spark, silver_path, frame, commit)
        out["silver"] = "appended (no key)"
        return out
    actions = silver.drop_superseded(
        spark, frame.actions, _path(target, "tombstones", staged, table), table.key_columns
    )
    stored = spark.read.format("delta").load(silver_path) if silver_log.files else None
    actions = toast.fill_unavailable(replace(frame, actions=actions), stored)
    latest = frames.latest_per_key(actions, table.key_columns)
    # deletes (d; in older batches also an update that moved its key) are stored as tombstones,
    # then merged; the tombstones need only keys and positions, so they get their own narrow
    # newest-action-per-key (caching the wide one would hold whole rows -- blobs -- in the heap)
    deletes = not soft and table.may_remove and frames.has_deletes(frame)
    narrow = frames.latest_per_key(frames.key_actions(actions, table.key_columns), table.key_columns)
    try:
        silver.record_tombstones(
            spark,
            _path(target, "tombstones", staged, table),
            narrow,
            frame,
            commit,
            deletes,
            settings.deletion_vectors,
        )
        crash_point("apply_after_tombstones")
        out["silver"] = silver.merge_silver(
            spark,
            silver_path,
            latest,
            frame,
            commit,
            soft,
            silver_log,
            settings.rewrite_ratio,
            settings.deletion_vectors,
        )
    finally:
        actions.unpersist()  # kept by the TOAST fill when key changes needed it
    return out


def _apply_history(
    spark: SparkSession,
    staged: StagedBatch,
    table: StagedTable,
    frame: frames.TableFrame,
    target: str,
    commit: Commit,
    settings: ApplySettings,
    silver_log: delta_log.LogState,
) -> str:
    """Log the batch's actions (all of them: an upsert older than a stored delete is still a past
    version), then re-fold the versions of the keys it touches (``history.py``)."""
    history_path = _path(target, "history", staged, table)
    if delta_log.has_applied(history_path, commit.app_id):
        return "already applied"
    log_path = _path(target, "history_log", staged, table)
    for path in (history_path, log_path):
        delta_log.check_fence(path, settings.fence, staged.manifest.get("partition"))
    if not delta_log.has_applied(log_path, commit.app_id):
        silver_path = _path(target, "silver", staged, table)
        stored = spark.read.format("delta").load(silver_path) if silver_log.files else None
        every = frame if frame.every_action is None else replace(frame, actions=frame.every_action)
        filled = toast.fill_unavailable(every, stored)
        history.append_log(spark, log_path, frame, filled, commit, stored)
        crash_point("apply_after_history_log")
    untracked = (table.name, settings.history_except)
    keys = history.rebuild(spark, history_path, log_path, frame, commit, untracked)
    return f"rebuilt {keys} keys"


def _progress(i: int, n: int, name: str, done: int, total: int, started: float) -> None:
    elapsed = max(time.monotonic() - started, 1e-6)
    rate = done / elapsed
    eta = (total - done) / rate if rate else 0.0
    log.info(
        "applied %s (%d/%d tables): %d/%d events, %.0f events/s, ETA %.0fs",
        name,
        i,
        n,
        done,
        total,
        rate,
        eta,
    )

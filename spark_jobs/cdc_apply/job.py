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

from . import backlog, bronze, compaction, delta_log, fold, frames, history, keyless, rechunk, silver, toast
from .catalog import DEFAULT_FORMAT, CatalogNames
from .crash import crash_point
from .layout import table_path
from .session import size_reads
from .staged import StagedBatch, StagedBatchError, StagedTable
from .writes import Commit, commit_actions

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
    deletion_vectors: bool = True  # new silver/tombstone tables with deletion vectors (table_properties)
    catalog: str | None = None  # delta.catalog: register tables in this namespace (catalog.py)
    catalog_format: str = DEFAULT_FORMAT  # delta.catalog.table.format


def apply_batch(
    spark: SparkSession, batch_path: str, target: str, settings: ApplySettings | None = None
) -> dict[str, Any]:
    """Apply the batch at ``batch_path`` to the Delta root ``target``; returns a small report."""
    return apply_batches(spark, [batch_path], target, settings)


def apply_batches(
    spark: SparkSession, batch_paths: list[str], target: str, settings: ApplySettings | None = None
) -> dict[str, Any]:
    """Apply consecutive batches of one connector (partition), oldest first, to the Delta root
    ``target``: each table's stretch of them in one pass (``backlog.py``); returns a small report.
    The result is the same as applying them one by one, in any order, any number of times.

    :raises StagedBatchError: a batch is damaged, or the batches come from different connectors
        or partitions.
    """
    if not batch_paths:
        raise ValueError("no batch to apply")
    settings = settings or ApplySettings()
    # the job's own readers (staged parts, the Delta log) reach S3 with Spark's S3A settings
    delta_log.use_hadoop_conf(s3a_settings(spark))
    target = delta_log.hadoop_url(target)
    # tables this job creates (bronze included) widen column types in place on schema changes, and
    # map columns by name so source names with spaces, commas or braces are valid Delta columns
    spark.conf.set("spark.databricks.delta.properties.defaults.enableTypeWidening", "true")
    spark.conf.set("spark.databricks.delta.properties.defaults.columnMapping.mode", "name")
    batches = [StagedBatch(p) for p in batch_paths]
    sources = {(b.connector, b.manifest.get("partition")) for b in batches}
    if len(sources) > 1:
        found = ", ".join(sorted(f"{c} (partition {p})" for c, p in sources))
        raise StagedBatchError(
            f"batches of different connectors or partitions cannot be applied together: {found}"
        )
    for staged in batches:
        staged.verify_parts()
    scratches = []
    try:
        tables = []
        for staged in batches:
            found = staged.tables()
            scratch = rechunk.scratch_dir(target, staged)
            if rechunk.copy_oversized(staged, found, scratch):  # parts staged before the byte limit
                scratches.append(scratch)
            tables.append(found)
        return _apply_backlog(spark, batches, tables, target, settings)
    finally:
        for scratch in scratches:
            rechunk.remove(scratch)


def s3a_settings(spark: SparkSession) -> dict[str, str]:
    """The session's Hadoop object-store keys (S3A's ``fs.s3a.endpoint`` ..., ``fs.gs.*``,
    ``fs.azure.*``) that are set (none without a JVM in this process, e.g. a Spark Connect client:
    the environment serves then)."""
    try:
        conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - no sparkContext over Spark Connect
        return {}
    values = {key: conf.get(key) for key in delta_log.S3A_KEYS}
    found = {k: str(v) for k, v in values.items() if v}
    # the GCS connector's and hadoop-azure's keys (account-suffixed for Azure): read by pattern
    found |= {str(k): str(v) for k, v in conf.getValByRegex(r"^fs\.(gs|azure)\.").items() if v}
    return found


def _apply_backlog(
    spark: SparkSession,
    batches: list[StagedBatch],
    tables: list[list[StagedTable]],
    target: str,
    settings: ApplySettings,
) -> dict[str, Any]:
    planning = time.monotonic()
    cuts = backlog.breaks(batches)
    planned = []
    soft = settings.delete_mode == "soft"
    for name in sorted({t.name for found in tables for t in found}):
        entries = [
            backlog.Entry(i, staged, t)
            for i, (staged, found) in enumerate(zip(batches, tables, strict=True))
            for t in found
            if t.name == name
        ]
        silver_path = _path(target, "silver", entries[0].staged, entries[0].table)
        combine = len(entries) > 1 and backlog.combinable(
            entries[0].table, history.matches(settings.history, name), soft
        )
        state = delta_log.replay(silver_path) if combine else None

        def applied(staged: StagedBatch, state: delta_log.LogState | None = state) -> bool:
            return state is not None and state.has_applied(_commit(staged, settings).app_id)

        for stretch in backlog.stretches(entries, cuts, applied, combine):
            table = backlog.combined_table(stretch)
            truncates = [t for e in stretch for t in frames.truncate_events(spark, e.table)]
            frame = frames.table_frame(spark, table, truncates)
            silver.check_evolution(spark, silver_path, frame)
            planned.append((stretch, table, frame))
    report: dict[str, Any] = {"connector": batches[0].connector, "tables": {}}
    if len(batches) == 1:
        report["batch_id"] = batches[0].batch_id
    else:
        report["batches"] = [b.batch_id for b in batches]
    started, done_rows, total_rows = time.monotonic(), 0, sum(t.rows for _, t, _ in planned)
    report["plan_seconds"] = round(started - planning, 3)
    for i, (stretch, table, frame) in enumerate(planned, 1):
        begun = time.monotonic()
        last = stretch[-1].staged
        if len(stretch) == 1:
            commit = _commit(last, settings)
            done = _apply_table(spark, last, table, frame, target, commit, settings)
        else:
            commit = _commit(last, settings, [e.staged.batch_id for e in stretch])
            done = _apply_stretch(spark, stretch, table, frame, target, commit, settings)
        layers = {layer: _path(target, layer, last, table) for layer in ("silver", "tombstones")}
        compacted = compaction.compact_all(spark, layers, settings.optimize_interval, commit)
        if compacted:
            done["compacted"] = compacted
        if settings.catalog:
            done["catalog"] = _register(spark, settings, target, last, table)
        done["seconds"] = round(time.monotonic() - begun, 3)
        if table.name in report["tables"]:  # a table whose batches were applied in several stretches
            earlier = report["tables"][table.name]
            report["tables"][table.name] = {"stretches": [*earlier.get("stretches", [earlier]), done]}
        else:
            report["tables"][table.name] = done
        done_rows += table.rows
        _progress(i, len(planned), table.name, done_rows, total_rows, started)
    report["seconds"] = round(time.monotonic() - started, 3)
    return report


def _register(
    spark: SparkSession, settings: ApplySettings, target: str, staged: StagedBatch, table: StagedTable
) -> list[str]:
    """Catalog names for the table's bronze, silver and history tables that exist."""
    names = CatalogNames(settings.catalog or "", settings.catalog_format)
    out = []
    for layer in ("bronze", "silver", "history"):
        path = _path(target, layer, staged, table)
        if delta_log.table_exists(path):
            out.append(names.register(spark, layer, staged.connector, table.name, path))
    return out


def _commit(staged: StagedBatch, settings: ApplySettings, batches: list[str] | None = None) -> Commit:
    """The identity of ``staged``'s writes (``batches``: of a stretch's writes, ``staged`` last)."""
    return Commit(staged.connector, staged.batch_id, staged.commit_metadata(settings.fence, batches))


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
    silver_log = _prepare(spark, staged, table, target, settings, out)
    _bronze(spark, staged, table, target, commit, settings, out)
    if table.key_columns and history.matches(settings.history, table.name):
        out["history"] = _apply_history(spark, staged, table, frame, target, commit, settings, silver_log)
    return _apply_silver(spark, staged, table, frame, target, commit, settings, silver_log, out)


def _apply_stretch(
    spark: SparkSession,
    stretch: list[backlog.Entry],
    table: StagedTable,
    frame: frames.TableFrame,
    target: str,
    commit: Commit,
    settings: ApplySettings,
) -> dict[str, Any]:
    """A keyed table's stretch of batches (``backlog.py``): bronze in one commit of every
    batch's files and marks, then the stretch's events in one silver write marked as the last
    batch; the others' marks go into that write's commit where it is made through a transaction
    (an append, the one-scan MERGE), else into one more commit.  A crash before that commit leaves
    them unmarked: a re-run applies them again, which changes nothing (every stored row is at
    least as new)."""
    last = stretch[-1].staged
    out: dict[str, Any] = {"events": table.rows, "ops": table.ops, "batches": len(stretch)}
    silver_log = _prepare(spark, last, table, target, settings, out)
    if settings.bronze:
        bronze_path = _path(target, "bronze", last, table)
        marks = delta_log.replay(bronze_path)
        missing = [(e.table, _commit(e.staged, settings)) for e in stretch]
        missing = [(t, c) for t, c in missing if not marks.has_applied(c.app_id)]
        if missing:
            copy = settings.bronze_copy
            out["bronze"] = bronze.append_bronze_stretch(spark, bronze_path, missing, copy, marks)
            crash_point("apply_after_bronze")
    earlier = [_commit(e.staged, settings) for e in stretch[:-1]]
    _apply_silver(spark, last, table, frame, target, commit, settings, silver_log, out, tuple(earlier))
    crash_point("apply_before_stretch_marks")
    commit_actions(spark, _path(target, "silver", last, table), [], earlier, commit)
    return out


def _prepare(
    spark: SparkSession,
    staged: StagedBatch,
    table: StagedTable,
    target: str,
    settings: ApplySettings,
    out: dict[str, Any],
) -> delta_log.LogState:
    """Fencing checks, the silver log, and Spark's read sizes for the table's widest rows."""
    for layer in ("bronze", "silver"):
        path = _path(target, layer, staged, table)
        delta_log.check_fence(path, settings.fence, staged.manifest.get("partition"))
    silver_path = _path(target, "silver", staged, table)
    replaying = time.monotonic()
    silver_log = delta_log.replay(silver_path)
    out["log_replay_seconds"] = round(time.monotonic() - replaying, 3)
    # reads hold a batch of rows of every column: size it to the widest rows (staged or stored)
    size_reads(spark, max(table.row_bytes, delta_log.row_bytes(silver_path, silver_log)))
    return silver_log


def _bronze(
    spark: SparkSession,
    staged: StagedBatch,
    table: StagedTable,
    target: str,
    commit: Commit,
    settings: ApplySettings,
    out: dict[str, Any],
) -> None:
    if not settings.bronze:
        return
    bronze_path = _path(target, "bronze", staged, table)
    marks = delta_log.replay(bronze_path)
    if not marks.has_applied(commit.app_id):
        out["bronze"] = bronze.append_bronze(spark, bronze_path, table, commit, settings.bronze_copy, marks)
        crash_point("apply_after_bronze")


def _apply_silver(
    spark: SparkSession,
    staged: StagedBatch,
    table: StagedTable,
    frame: frames.TableFrame,
    target: str,
    commit: Commit,
    settings: ApplySettings,
    silver_log: delta_log.LogState,
    out: dict[str, Any],
    earlier: tuple[Commit, ...] = (),
) -> dict[str, Any]:
    silver_path = _path(target, "silver", staged, table)
    if silver_log.has_applied(commit.app_id):
        out["silver"] = "already applied"
        return out
    soft = settings.delete_mode == "soft"
    if not table.key_columns:
        mode = table.keyless or keyless.APPEND
        partition = staged.manifest.get("partition")
        out["silver"] = keyless.apply_keyless(spark, silver_path, frame, commit, mode, partition)
        return out
    tombstones = _path(target, "tombstones", staged, table)
    actions, latest = fold.newest(spark, frame, tombstones, silver_path if silver_log.files else None)
    # deletes (d; a u that moved its key) are stored as tombstones, then merged; the tombstones
    # need only keys and positions, so they get their own narrow newest-action-per-key (caching
    # the wide one would hold whole rows -- blobs -- in the heap)
    deletes = not soft and table.may_remove and fold.has_deletes(table, frame)
    narrow = frames.latest_per_key(frames.key_actions(actions, table.key_columns), table.key_columns)
    try:
        silver.record_tombstones(
            spark,
            tombstones,
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
            earlier,
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

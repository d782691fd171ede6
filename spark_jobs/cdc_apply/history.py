"""SCD type 2 history: one row per version of each key, derived from a per-table change log.

Two Delta tables per history-enabled source table:

- ``history_log`` -- every key action of every applied batch (the silver column types, after the
  batch's own unchanged-TOAST fills), plus the table's truncates.  Appended once per batch (the
  batch's marked write).  When history is enabled for a table that already has silver rows, the
  log starts with those rows as of their stored positions.
- ``history`` -- the versions: the data columns plus ``__start_at`` / ``__end_at`` (the
  positions of the event that opened the version and of the one that ended it: the next version's
  opening event, a delete or a truncate; null while current), ``__start_ts`` / ``__end_ts`` (the
  same bounds as database commit times, ``source.ts_ms``) and ``__is_current``.

The history is a pure function of the log (:func:`fold`), applied the way AUTO CDC's SCD type 2
does: per key in position order, an upsert opens a new version when the key has no current version
or a *tracked* column differs from the current version; otherwise it updates the current version
in place (``delta.history.except.columns``: AUTO CDC's ``TRACK HISTORY ON * EXCEPT``); a delete or
truncate closes the current version.  Each batch re-folds the keys it touches from their whole log,
so batches applied out of order or twice give the same history as in-order applies.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from . import deltasql
from .frames import ACTION, OP, POSITION, SOURCE_TS, UNAVAILABLE, TableFrame, quoted
from .writes import Commit, create_table, ensure_columns

START, END, START_TS, END_TS, CURRENT = "__start_at", "__end_at", "__start_ts", "__end_ts", "__is_current"
TRUNCATE = "truncate"  # a log action: every key's current version closes here
BATCH = "__batch_id"
PROPERTIES = {"delta.enableTypeWidening": "true", "delta.columnMapping.mode": "name"}
HISTORY_FIELDS = [
    T.StructField(START, T.BinaryType(), False),
    T.StructField(END, T.BinaryType(), True),
    T.StructField(START_TS, T.TimestampType(), True),
    T.StructField(END_TS, T.TimestampType(), True),
    T.StructField(CURRENT, T.BooleanType(), False),
]


def matches(patterns: Iterable[str], name: str) -> bool:
    """Whether ``name`` fully matches one of the regular expressions (case-insensitive, as
    Debezium's include lists)."""
    return any(re.fullmatch(p, name, re.IGNORECASE) for p in patterns)


def tracked_columns(
    columns: Iterable[str], keys: list[str], table: str, except_patterns: Iterable[str]
) -> list[str]:
    """Data columns whose changes open a new version: all but the key and the columns named by
    ``delta.history.except.columns`` (``<table>.<column>`` regexes)."""
    patterns = list(except_patterns)
    return [c for c in columns if c not in keys and not matches(patterns, f"{table}.{c}")]


def log_schema(frame: TableFrame) -> T.StructType:
    data = [T.StructField(n, t, True) for n, t in frame.columns.items()]
    meta = [
        T.StructField(POSITION, T.BinaryType(), False),
        T.StructField(ACTION, T.StringType(), False),
        T.StructField(OP, T.StringType(), True),
        T.StructField(SOURCE_TS, T.LongType(), True),
        T.StructField(UNAVAILABLE, T.ArrayType(T.StringType()), True),
        T.StructField(BATCH, T.StringType(), True),
    ]
    return T.StructType([*data, *meta])


def history_schema(columns: dict[str, T.DataType], keys: list[str]) -> T.StructType:
    data = [T.StructField(n, t, True) for n, t in columns.items()]  # keys too: see silver.target_schema
    return T.StructType([*data, *HISTORY_FIELDS])


LOG_META = (POSITION, ACTION, OP, SOURCE_TS, UNAVAILABLE, BATCH)


def _log_rows(spark: SparkSession, frame: TableFrame, actions: DataFrame, batch_id: str) -> DataFrame:
    """The batch's actions (and truncate) as log rows."""
    cols = [F.col(quoted(n)).alias(n) for n in frame.columns]
    rows = actions.select(*cols, POSITION, ACTION, OP, SOURCE_TS, UNAVAILABLE, F.lit(batch_id).alias(BATCH))
    if frame.truncates:
        ts = spark.createDataFrame(list(frame.truncates), f"{POSITION} binary, {SOURCE_TS} bigint")
        marker = ts.select(
            *(F.lit(None).cast(t).alias(n) for n, t in frame.columns.items()),
            POSITION,
            F.lit(TRUNCATE).alias(ACTION),
            F.lit("t").alias(OP),
            SOURCE_TS,
            F.array().cast("array<string>").alias(UNAVAILABLE),
            F.lit(batch_id).alias(BATCH),
        )
        rows = rows.unionByName(marker)
    return rows


def seed_rows(stored: DataFrame, frame: TableFrame) -> DataFrame:
    """Silver's rows as log rows at their stored positions (history enabled on a filled table)."""
    if "__deleted" in stored.columns:
        stored = stored.where(~F.coalesce(F.col("__deleted"), F.lit(False)))
    have = set(stored.columns)
    cols = [
        (F.col(quoted(n)) if n in have else F.lit(None)).cast(t).alias(n) for n, t in frame.columns.items()
    ]
    return stored.select(
        *cols,
        POSITION,
        F.lit("upsert").alias(ACTION),
        F.lit("r").alias(OP),
        F.col("__ts_ms").cast("bigint").alias(SOURCE_TS),
        F.array().cast("array<string>").alias(UNAVAILABLE),
        F.lit(None).cast("string").alias(BATCH),
    )


def append_log(
    spark: SparkSession,
    path: str,
    frame: TableFrame,
    actions: DataFrame,
    commit: Commit,
    stored: DataFrame | None,
) -> None:
    """Append the batch's actions to the table's history log (marked write), seeding a new log
    from the silver rows ``stored`` (silver before this batch)."""
    schema = log_schema(frame)
    fresh = not _exists(spark, path)
    create_table(spark, path, schema, PROPERTIES)
    current = ensure_columns(spark, path, schema)
    if fresh and stored is not None:
        with commit.conf(spark, txn=False):
            seed_rows(stored, frame).write.format("delta").mode("append").save(path)
    rows = _log_rows(spark, frame, actions, commit.batch_id)
    rows = rows.select(*(F.col(quoted(f.name)).cast(current[f.name]).alias(f.name) for f in schema.fields))
    commit.append(rows, path)


def _exists(spark: SparkSession, path: str) -> bool:
    from .delta_log import table_exists

    return table_exists(path)


def _key_cols(keys: list[str], prefix: str = "") -> list[Column]:
    return [F.col(quoted(k)).alias(f"{prefix}{k}") if prefix else F.col(quoted(k)) for k in keys]


def fold(log: DataFrame, keys: list[str], data: list[str], tracked: list[str]) -> DataFrame:
    """The versions of every key in ``log`` (rows of :func:`log_schema`, truncates already turned
    into per-key deletes), as rows of :func:`history_schema`."""
    by_key = Window.partitionBy(*_key_cols(keys)).orderBy(POSITION, ACTION)
    upto = by_key.rowsBetween(Window.unboundedPreceding, 0)
    is_delete = F.col(ACTION) != "upsert"
    events = _fill_unsent(log.dropDuplicates([*keys, POSITION, ACTION]), keys, data)
    values = F.to_json(F.struct(*(F.col(quoted(c)) for c in tracked))) if tracked else F.lit("")
    events = events.withColumn("__tracked", values)
    prev = F.lag(F.struct(F.col(ACTION).alias("a"), F.col("__tracked").alias("v"))).over(by_key)
    opens = ~is_delete & (
        prev.isNull() | (prev.getField("a") != "upsert") | (prev.getField("v") != F.col("__tracked"))
    )
    events = events.withColumn("__vid", F.sum(opens.cast("int")).over(upto)).where(F.col("__vid") > 0)
    ts = F.timestamp_millis(F.col(SOURCE_TS))
    row = F.struct(*(F.col(quoted(n)).alias(n) for n in data))
    versions = events.groupBy(*_key_cols(keys), "__vid").agg(
        F.min(POSITION).alias(START),
        F.min_by(ts, F.col(POSITION)).alias(START_TS),
        F.max_by(row, F.when(~is_delete, F.col(POSITION))).alias("__row"),
        F.min(F.when(is_delete, F.col(POSITION))).alias("__closed"),
        F.min_by(ts, F.when(is_delete, F.col(POSITION))).alias("__closed_ts"),
    )
    following = Window.partitionBy(*_key_cols(keys)).orderBy("__vid")
    end = F.coalesce(F.col("__closed"), F.lead(START).over(following))
    end_ts = F.when(F.col("__closed").isNotNull(), F.col("__closed_ts")).otherwise(
        F.lead(START_TS).over(following)
    )
    return versions.select(
        *(F.col(quoted(n)) if n in keys else F.col("__row").getField(n).alias(n) for n in data),
        F.col(START),
        end.alias(END),
        F.col(START_TS),
        end_ts.alias(END_TS),
        end.isNull().alias(CURRENT),
    )


def _fill_unsent(events: DataFrame, keys: list[str], data: list[str]) -> DataFrame:
    """Unchanged-TOAST columns the batch's own fill left (still in ``__unavailable``) take the
    key's previous upsert's value since its last delete; with none in the log they stay as they
    are (the batch's fill, or null)."""
    by_key = Window.partitionBy(*_key_cols(keys)).orderBy(POSITION, ACTION)
    is_delete = F.col(ACTION) != "upsert"
    events = events.withColumn(
        "__seg", F.sum(is_delete.cast("int")).over(by_key.rowsBetween(Window.unboundedPreceding, 0))
    )
    in_seg = Window.partitionBy(*_key_cols(keys), "__seg").orderBy(POSITION, ACTION)
    in_seg = in_seg.rowsBetween(Window.unboundedPreceding, 0)
    for name in (c for c in data if c not in keys):
        unsent = F.coalesce(F.array_contains(UNAVAILABLE, name), F.lit(False))
        known = F.when(~is_delete & ~unsent, F.struct(F.col(quoted(name)).alias("v")))
        earlier = F.last(known, ignorenulls=True).over(in_seg)
        fill = F.when(unsent & earlier.isNotNull(), earlier.getField("v"))
        events = events.withColumn(name, fill.otherwise(F.col(quoted(name))))
    return events


def _with_truncates(log: DataFrame, keys: list[str]) -> DataFrame:
    """The log's upserts and deletes, with every truncate turned into a delete of each key that
    has events before it."""
    truncates = log.where(F.col(ACTION) == TRUNCATE).select(
        F.col(POSITION).alias("__t"), F.col(SOURCE_TS).alias("__tts")
    )
    rows = log.where(F.col(ACTION) != TRUNCATE)
    first = rows.groupBy(*_key_cols(keys)).agg(F.min(POSITION).alias("__first"))
    closes = first.join(truncates, F.col("__t") > F.col("__first")).select(
        *_key_cols(keys),
        F.col("__t").alias(POSITION),
        F.lit("delete").alias(ACTION),
        F.col("__tts").alias(SOURCE_TS),
    )
    return rows.unionByName(closes, allowMissingColumns=True)


def _null_safe(keys: list[str], left: DataFrame, right: DataFrame) -> Column:
    """``left``'s keys equal ``right``'s ``__k<i>`` columns (nulls equal)."""
    cond = [left[quoted(k)].eqNullSafe(right[f"__k{i}"]) for i, k in enumerate(keys)]
    out = cond[0]
    for c in cond[1:]:
        out = out & c
    return out


def rebuild(
    spark: SparkSession,
    history_path: str,
    log_path: str,
    frame: TableFrame,
    commit: Commit,
    untracked: tuple[str, tuple[str, ...]],
) -> int:
    """Replace the versions of the keys this batch touches (every key after a truncate) with the
    fold of their whole log; the append is the batch's marked write.  Returns the keys rebuilt.

    The fold covers every column the log has (one the source dropped keeps its past values).
    Two commits: a delete of the keys' old versions, then the append.  A crash between them is
    repaired by running the batch again (the log already holds it; the fold is deterministic).

    :param untracked: the table's name and ``delta.history.except.columns``.
    """
    keys = frame.keys
    log = spark.read.format("delta").load(log_path)
    columns = {f.name: f.dataType for f in log.schema.fields if f.name not in LOG_META}
    schema = history_schema(columns, keys)
    create_table(spark, history_path, schema, PROPERTIES)
    current = ensure_columns(spark, history_path, schema)
    rows = log.where(F.col(ACTION) != TRUNCATE)
    source = rows if frame.truncate_at is not None else frame.actions
    # both writes below read it, and the second one changes what it was read from
    touched = source.select(*_key_cols(keys)).distinct().toDF(*(f"__k{i}" for i in range(len(keys))))
    touched = touched.localCheckpoint(eager=True)
    keyed = rows.join(touched, _null_safe(keys, rows, touched), "left_semi")
    tracked = tracked_columns(columns, keys, untracked[0], untracked[1])
    changes = _with_truncates(keyed.unionByName(log.where(F.col(ACTION) == TRUNCATE)), keys)
    folded = fold(changes, keys, list(columns), tracked).select(
        *(F.col(quoted(f.name)).cast(current[f.name]).alias(f.name) for f in schema.fields)
    )
    match = " AND ".join(f"t.{quoted(k)} <=> s.__k{i}" for i, k in enumerate(keys))
    with commit.conf(spark, txn=False):
        deltasql.Merge(spark, history_path, touched, match).when_matched_delete().execute()
    commit.append(folded, history_path)
    return touched.count()

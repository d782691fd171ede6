"""Silver of tables without a key: an exact multiset of the source's rows, or an append-only log.

The capture decides a keyless table's mode and records it in the manifest (``keyless``):

* ``multiset`` -- the source sends full old images (PostgreSQL ``REPLICA IDENTITY FULL``,
  MySQL/MariaDB full row images, SQL Server CDC, Vitess).  Silver holds each source row once per
  occurrence, duplicates included.  Every event counts per row image (all columns equal, NULLs
  equal to NULLs): ``c``/``r`` and an update's after image +1, ``d`` and an update's before image
  -1.  For a multiset only the end count per image matters, so a batch reduces to its net count
  per image and is written in one commit: images whose count grows get their net copies
  appended; for images whose count falls one MERGE deletes every stored occurrence and inserts
  the (stored + net) copies that remain.  A truncate, or the reset a whole-table snapshot of the
  table starts with (``op = t`` at the image's position), voids the stored rows and the batch's
  earlier events: the rows from it on replace the table in one overwrite.
* ``append`` -- the source sends no old image (PostgreSQL ``DEFAULT``/``NOTHING`` identity
  without a key), so a delete or update cannot be matched to a row: silver is an append-only log
  of row images (one row per event, its ``__op`` says which).

Replays.  A batch already applied is skipped by its mark (the Delta idempotent transaction).  A
window captured again after a crash -- the same events, at the same positions, in another batch
-- is caught by position: each write records in its commit info the greatest position it covers
(``through``) and events at or below the table's ``through`` are skipped.  So batches reach a
keyless table in order: one older than what the table holds changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import replace

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from . import delta_log, deltasql
from .frames import ACTION, BATCH, OP, POSITION, TS_MS, TableFrame, all_of, quoted
from .silver import PENDING, PENDING_TYPE, TABLE_PROPERTIES, target_schema
from .writes import Commit, create_table, ensure_columns

MULTISET, APPEND = "multiset", "append"
THROUGH = "through"  # commit-info key: the greatest position a write covers (hex)
_KIND, _NET, _META, _COPIES = "__kind", "__net", "__meta", "__copies"


def applied_through(path: str, partition: str | None = None) -> bytes | None:
    """The greatest position already applied to the keyless table at ``path`` (None: none)."""
    found = delta_log.newest_recorded(path, THROUGH, partition)
    return None if found is None else bytes.fromhex(str(found))


def recording(commit: Commit, through: bytes | None) -> Commit:
    """``commit`` whose commit info also records ``through``."""
    if through is None:
        return commit
    doc = json.loads(commit.metadata)
    doc.setdefault("airflow_cdc", {})[THROUGH] = through.hex()
    return replace(commit, metadata=json.dumps(doc, sort_keys=True, default=str))


def apply_keyless(
    spark: SparkSession, path: str, frame: TableFrame, commit: Commit, mode: str, partition: str | None
) -> str:
    """Apply a keyless table's batch to its silver table in one marked commit; returns how.

    Repeating it writes nothing new: the batch's mark, or else its positions, are already there.
    """
    through = applied_through(path, partition)
    every = frame.every_action if frame.every_action is not None else frame.actions
    newest = every.agg(F.max(POSITION)).collect()[0][0]
    stops = [p for p, _ in frame.truncates if through is None or p > through]
    ends = [bytes(p) for p in (newest, *stops, through) if p is not None]
    commit = recording(commit, max(ends) if ends else None)
    actions = every if through is None else every.where(F.col(POSITION) > F.lit(through))
    reset = max(stops) if stops else None
    if reset is not None:
        actions = actions.where(F.col(POSITION) >= F.lit(reset))
    schema = target_schema(frame, soft=False)
    create_table(spark, path, schema, TABLE_PROPERTIES)
    current = ensure_columns(spark, path, schema)
    if mode != MULTISET:
        commit.append(_log_rows(actions, frame, current), path)
        return "appended (no key)" if reset is None else "appended (no key; truncated)"
    net = _net(actions, frame.columns)
    if reset is not None:
        commit.write(_copies(net.where(F.col(_NET) > 0), _NET, frame, current), path, mode="overwrite")
        return "replaced (multiset)"
    falling = net.where(F.col(_NET) < 0).cache()
    try:
        growing = _copies(net.where(F.col(_NET) > 0), _NET, frame, current)
        if not falling.limit(1).count():
            commit.append(growing, path)
            return "appended (multiset)"
        stored = spark.read.format("delta").load(path)
        remaining = _remaining(stored, falling, frame.columns)
        _merge(spark, path, falling, remaining, growing, frame, current, commit)
    finally:
        falling.unpersist()
    return "merged (multiset)"


def _comparable(name: str, data_type: T.DataType, alias: str = "") -> Column:
    """A column's value in a form Spark can group and compare (maps: their sorted entries)."""
    column = F.col(f"{alias}.{quoted(name)}" if alias else quoted(name))
    return F.array_sort(F.map_entries(column)) if isinstance(data_type, T.MapType) else column


def _groups(columns: dict[str, T.DataType]) -> list[str]:
    return [f"__g{i}" for i in range(len(columns))]


def _net(actions: DataFrame, columns: dict[str, T.DataType]) -> DataFrame:
    """One row per distinct image the batch touches: its values, net count and newest event."""
    groups = _groups(columns)
    sign = F.when(F.col(ACTION) == "upsert", F.lit(1)).otherwise(F.lit(-1))
    meta = F.struct(*(F.col(c) for c in (POSITION, OP, TS_MS, BATCH)))
    keyed = actions.select(
        *(_comparable(n, t).alias(g) for (n, t), g in zip(columns.items(), groups, strict=True)),
        *(F.col(quoted(n)).alias(f"__v{i}") for i, n in enumerate(columns)),
        sign.alias("__sign"),
        meta.alias(_META),
    )
    picked = keyed.groupBy(*groups).agg(
        F.sum("__sign").alias(_NET),
        F.max_by(F.col(_META), F.col(f"{_META}.{POSITION}")).alias(_META),
        *(F.first(f"__v{i}").alias(f"__v{i}") for i in range(len(columns))),
    )
    values = [F.col(f"__v{i}").alias(n) for i, n in enumerate(columns)]
    return picked.select(*values, *groups, _NET, _META).where(F.col(_NET) != 0)


def _remaining(stored: DataFrame, falling: DataFrame, columns: dict[str, T.DataType]) -> DataFrame:
    """The falling images with the copies that stay (stored occurrences + net, at least 0) and
    the newest stored occurrence's metadata."""
    groups = _groups(columns)
    meta = F.struct(*(F.col(c) for c in (POSITION, OP, TS_MS, BATCH)))
    mine = stored.select(
        *(_comparable(n, t).alias(g) for (n, t), g in zip(columns.items(), groups, strict=True)),
        meta.alias("__stored_meta"),
    ).alias("a")
    theirs = falling.alias("b")
    match = all_of([F.col(f"a.{g}").eqNullSafe(F.col(f"b.{g}")) for g in groups])
    hits = mine.join(theirs, match, "inner").select(
        *(F.col(f"b.{g}").alias(g) for g in groups), "__stored_meta"
    )
    counts = hits.groupBy(*groups).agg(
        F.count(F.lit(1)).alias("__stored"),
        F.max_by(F.col("__stored_meta"), F.col(f"__stored_meta.{POSITION}")).alias("__stored_meta"),
    )
    both = falling.alias("b").join(
        counts.alias("c"), all_of([F.col(f"b.{g}").eqNullSafe(F.col(f"c.{g}")) for g in groups]), "left"
    )
    left = F.greatest(F.coalesce(F.col("c.__stored"), F.lit(0)) + F.col(f"b.{_NET}"), F.lit(0))
    return both.select(
        *(F.col(f"b.{quoted(n)}").alias(n) for n in columns),
        left.alias(_COPIES),
        F.coalesce(F.col("c.__stored_meta"), F.col(f"b.{_META}")).alias(_META),
    )


def _copies(images: DataFrame, count: str, frame: TableFrame, current: dict[str, T.DataType]) -> DataFrame:
    """``count`` copies of each image, as rows of the silver table (its column order)."""
    out = images.select("*", F.explode(F.array_repeat(F.lit(True), F.col(count).cast("int"))).alias("__copy"))
    return _rows(out, frame, current)


def _rows(images: DataFrame, frame: TableFrame, current: dict[str, T.DataType]) -> DataFrame:
    values: dict[str, Column] = {n: F.col(quoted(n)) for n in frame.columns}
    values |= {c: F.col(f"{_META}.{c}") for c in (POSITION, OP, TS_MS, BATCH)}
    return images.select(
        *((values[n] if n in values else F.lit(None)).cast(t).alias(n) for n, t in current.items())
    )


def _log_rows(actions: DataFrame, frame: TableFrame, current: dict[str, T.DataType]) -> DataFrame:
    """Append mode: one row per event (the before image of a ``d``, else the after image)."""
    meta = F.struct(*(F.col(c) for c in (POSITION, OP, TS_MS, BATCH)))
    kept = actions.where((F.col(ACTION) == "upsert") | (F.col(OP) == "d"))
    return _rows(kept.select("*", meta.alias(_META)), frame, current)


def _merge(
    spark: SparkSession,
    path: str,
    falling: DataFrame,
    remaining: DataFrame,
    growing: DataFrame,
    frame: TableFrame,
    current: dict[str, T.DataType],
    commit: Commit,
) -> None:
    """One MERGE: a ``del`` row per falling image deletes its stored occurrences (matched on
    every column, NULL-safe), ``ins`` rows (never matching) insert the copies that remain or grow."""
    deletes = _rows(falling, frame, current).select("*", F.lit("del").alias(_KIND))
    inserts = _copies(remaining, _COPIES, frame, current).unionByName(growing)
    source = deletes.unionByName(inserts.select("*", F.lit("ins").alias(_KIND)))
    same = []
    for name in frame.columns:
        data_type = current[name]
        t, s = _sql_comparable(name, data_type, "t"), _sql_comparable(name, data_type, "s")
        same.append(f"{t} <=> {s}")
    condition = f"s.{_KIND} = 'del' AND " + " AND ".join(same)
    values = {quoted(n): f"s.{quoted(n)}" for n in current if n != PENDING}
    values[quoted(PENDING)] = f"CAST(NULL AS {PENDING_TYPE.simpleString()})"
    builder = deltasql.Merge(spark, path, source, condition)
    builder = builder.when_matched_delete().when_not_matched_insert(values, condition=f"s.{_KIND} = 'ins'")
    with commit.conf(spark, txn=True):
        builder.execute()


def _sql_comparable(name: str, data_type: T.DataType, alias: str) -> str:
    column = f"{alias}.{quoted(name)}"
    return f"array_sort(map_entries({column}))" if isinstance(data_type, T.MapType) else column

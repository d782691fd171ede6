"""MERGE one batch's key actions into a silver table, ordered by position.

Contract: the stored ``__position`` of a row is the position of the newest event it reflects; an
action applies only if its position is greater, so replays, retries and batches applied out of
order converge on the same state.  Deletes leave a tombstone (key + position) in a side table so
that an older upsert arriving later cannot resurrect the row; a truncate leaves a table-wide
tombstone.  Unchanged-TOAST columns never overwrite a stored value.

A column still unresolved after the batch's own fills (``toast.py``) is kept *pending* in the row's
``__pending`` map (column -> position of the event that last filled it, null for none): an
older batch applied later fills it from its newest action of the key when that action is newer
than the last filler (a delete there only blocks older fillers), so batches applied out of order
converge on the values of the in-order apply.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from . import deltasql, vectors
from .delta_log import CHANGE_FEED, LogState
from .frames import (
    ACTION,
    BATCH,
    DELETED,
    OP,
    POSITION,
    TS_MS,
    UNAVAILABLE,
    SchemaChangeError,
    TableFrame,
    all_of,
    quoted,
)
from .types import refused
from .writes import Commit, create_table, ensure_columns, write_marked

TRUNCATE = "__truncate"
PENDING = "__pending"
PENDING_TYPE = T.MapType(T.StringType(), T.BinaryType())
#: Properties of every silver table the job creates (keyless ones get exactly these) and of
#: tombstone tables: types widen in place, columns are mapped by name.  Both are table features
#: already, so the tables start at Delta reader version 3 / writer version 7.
TABLE_PROPERTIES = {
    "delta.enableTypeWidening": "true",
    "delta.columnMapping.mode": "name",
}


def table_properties(deletion_vectors: bool = True) -> dict[str, str]:
    """Properties of a keyed silver or tombstone table the job creates: :data:`TABLE_PROPERTIES`
    and, unless ``delta.deletion.vectors.enabled`` is false, deletion vectors
    (``delta.enableDeletionVectors``: a MERGE writes the changed rows and a vector per touched
    file instead of copying whole files, so a small batch costs the same into any size of table).
    They add the ``deletionVectors`` reader feature: engines without it cannot read the table.
    Only a new table gets them; an existing table keeps its properties and protocol."""
    if deletion_vectors:
        return {**TABLE_PROPERTIES, vectors.VECTORS: "true"}
    return dict(TABLE_PROPERTIES)


def _meta_fields(soft: bool) -> list[T.StructField]:
    fields = [
        T.StructField(POSITION, T.BinaryType(), False),
        T.StructField(OP, T.StringType(), True),
        T.StructField(TS_MS, T.LongType(), True),
        T.StructField(BATCH, T.StringType(), True),
        T.StructField(PENDING, PENDING_TYPE, True),
    ]
    return [*fields, T.StructField(DELETED, T.BooleanType(), True)] if soft else fields


def target_schema(frame: TableFrame, soft: bool) -> T.StructType:
    """Silver's columns.  Key columns are nullable too: ``message.key.columns`` may name columns
    of a unique constraint that allows NULL (``NULLS NOT DISTINCT``; MySQL unique keys)."""
    data = [T.StructField(n, t, True) for n, t in frame.columns.items()]
    return T.StructType([*data, *_meta_fields(soft)])


def check_evolution(spark: SparkSession, path: str, frame: TableFrame) -> None:
    """Refuse a column type change Delta cannot take, before anything is written.

    :raises SchemaChangeError: naming the table, column and both types.
    """
    if not deltasql.is_delta_table(path):
        return
    current = {f.name: f.dataType for f in spark.read.format("delta").load(path).schema.fields}
    for name, new in frame.columns.items():
        if name in current and refused(current[name], new):
            raise SchemaChangeError(
                f"silver table {path}: column {name!r} changed type {current[name].simpleString()} -> "
                f"{new.simpleString()}, which Delta cannot widen; recreate the table or cast upstream"
            )


def _key_match(keys: list[str], left: str, right: str) -> str:
    return " AND ".join(f"{left}.{quoted(k)} <=> {right}.{quoted(k)}" for k in keys)


def drop_superseded(spark: SparkSession, actions: DataFrame, tombstones: str, keys: list[str]) -> DataFrame:
    """Drop actions older than a stored delete of their key or a stored truncate of the table."""
    if not deltasql.is_delta_table(tombstones):
        return actions
    stones = spark.read.format("delta").load(tombstones)
    truncated = stones.where(F.col(TRUNCATE)).agg(F.max(POSITION).alias("p")).collect()[0]["p"]
    if truncated is not None:
        actions = actions.where(F.col(POSITION) > F.lit(bytes(truncated)))
    keyed = stones.where(~F.col(TRUNCATE)).select(
        *(F.col(quoted(k)).alias(f"__stone_key{i}") for i, k in enumerate(keys)),
        F.col(POSITION).alias("__stone"),
    )
    cond = [actions[quoted(k)].eqNullSafe(keyed[f"__stone_key{i}"]) for i, k in enumerate(keys)]
    cond.append(keyed["__stone"] > actions[POSITION])
    return actions.join(keyed, on=all_of(cond), how="left_anti")


def record_tombstones(
    spark: SparkSession,
    path: str,
    latest: DataFrame,
    frame: TableFrame,
    commit: Commit,
    with_deletes: bool,
    deletion_vectors: bool = True,
) -> None:
    """Store the newest delete per key (when ``with_deletes``) and the batch's truncate."""
    key_types = {k: frame.columns[k] for k in frame.keys}
    schema = T.StructType(
        [
            *(T.StructField(k, t, True) for k, t in key_types.items()),
            T.StructField(POSITION, T.BinaryType(), False),
            T.StructField(TRUNCATE, T.BooleanType(), False),
        ]
    )
    keys = [F.col(quoted(k)) for k in frame.keys]
    deletes = latest.where(F.col(ACTION) == "delete")
    rows = deletes.select(*keys, POSITION, F.lit(False).alias(TRUNCATE)) if with_deletes else None
    if frame.truncate_at is not None:
        marker = spark.createDataFrame([(frame.truncate_at, True)], f"{POSITION} binary, {TRUNCATE} boolean")
        marker = marker.select(
            *(F.lit(None).cast(t).alias(k) for k, t in key_types.items()), POSITION, TRUNCATE
        )
        rows = marker if rows is None else rows.unionByName(marker)
    if rows is None:
        return
    create_table(spark, path, schema, table_properties(deletion_vectors))
    ensure_columns(spark, path, schema)
    if frame.truncate_at is not None:
        with commit.conf(spark, txn=False):
            cut = deltasql.binary_literal(frame.truncate_at)
            deltasql.delete(spark, path, f"{POSITION} < {cut} AND NOT {TRUNCATE}")
    match = (
        f"({_key_match(frame.keys, 't', 's')} AND NOT t.{TRUNCATE} AND NOT s.{TRUNCATE}) "
        f"OR (t.{TRUNCATE} AND s.{TRUNCATE})"
        if frame.keys
        else f"t.{TRUNCATE} AND s.{TRUNCATE}"
    )
    with commit.conf(spark, txn=False):
        (
            deltasql.Merge(spark, path, rows, match)
            .when_matched_update({POSITION: f"s.{POSITION}"}, condition=f"s.{POSITION} > t.{POSITION}")
            .when_not_matched_insert_all()
            .execute()
        )


def merge_silver(
    spark: SparkSession,
    path: str,
    latest: DataFrame,
    frame: TableFrame,
    commit: Commit,
    soft: bool,
    stored_log: LogState,
    rewrite_ratio: float = 0.0,
    deletion_vectors: bool = True,
    earlier: tuple[Commit, ...] = (),
) -> str:
    """The ordered MERGE: newer deletes remove (or flag), newer upserts replace, new keys insert.

    ``stored_log`` is the table's log before this batch (``delta_log.replay``; creating the table
    and adding or widening columns here adds no data files, so its files and row counts still hold).
    ``earlier`` are the marks of a stretch's other batches (``job._apply_stretch``): the writes
    that commit through a transaction (an append; the one-scan MERGE) record them in their commit.
    Returns how it was written: ``appended`` (the table had no rows), ``rewritten`` (the batch's
    events are at least ``rewrite_ratio`` times the stored rows: one join and a rewrite of the
    whole table beat MERGE's two passes over it) or ``merged``.
    """
    schema = target_schema(frame, soft)
    properties = table_properties(deletion_vectors)
    appending = not soft and not stored_log.files
    if appending and not deltasql.is_delta_table(path):
        current = {f.name: f.dataType for f in schema.fields}  # created by the append's commit
    else:
        create_table(spark, path, schema, properties)
        current = ensure_columns(spark, path, schema)
    data = [n for n in frame.columns]
    source = latest.select(
        *(F.col(quoted(n)).cast(current[n]).alias(n) for n in data),
        ACTION,
        POSITION,
        OP,
        TS_MS,
        UNAVAILABLE,
        BATCH,
    )
    meta = {POSITION: f"s.{POSITION}", OP: f"s.{OP}", TS_MS: f"s.{TS_MS}", BATCH: f"s.{BATCH}"}
    fresh = {quoted(n): f"CASE WHEN {_unsent(n)} THEN NULL ELSE s.{quoted(n)} END" for n in data}
    new_pending = fresh_pending()
    if appending:  # nothing to match: a MERGE would only re-read an empty table
        values = {**dict(zip(data, fresh.values(), strict=True)), **meta, PENDING: new_pending}
        rows = source.alias("s").where(f"{ACTION} = 'upsert'")
        rows = rows.select(*(F.expr(values.get(n, "NULL")).cast(t).alias(n) for n, t in current.items()))
        write_marked(spark, path, rows, [commit, *earlier], commit, schema, properties)
        return "appended"
    if _dense(stored_log, frame.events, rewrite_ratio):
        stored = spark.read.format("delta").load(path)
        if frame.truncate_at is not None:
            stored = stored.where(F.col(POSITION) >= F.lit(frame.truncate_at))
        commit.write(rewritten(stored, source, frame.keys, soft), path, mode="overwrite")
        return "rewritten"
    if frame.truncate_at is not None:
        with commit.conf(spark, txn=False):
            deltasql.delete(spark, path, f"{POSITION} < {deltasql.binary_literal(frame.truncate_at)}")
    newer = f"s.{POSITION} > t.{POSITION}"
    # Lean MERGE: no event of the batch lists unchanged-TOAST columns and no stored row waits for
    # one, so no clause reads a stored value; the MERGE then reads the stored rows' keys and
    # positions only (with deletion vectors it never reads the other columns of the touched files).
    lean = not frame.toast and not has_pending(spark, path, stored_log)
    one_scan = not soft and not deltasql.connected(spark)  # the transaction API: classic sessions only
    if lean and one_scan and vectors.applies(stored_log, list(current), [*data, *meta, PENDING]):
        row = _vector_row(current)
        outcome = vectors.merge(spark, path, source, frame.keys, row, [commit, *earlier], frame.events)
        return "merged" if outcome is None else "merged (deletion vectors)"
    if lean:
        values = {quoted(n): f"s.{quoted(n)}" for n in data}
        values[PENDING] = f"CAST(NULL AS {PENDING_TYPE.simpleString()})"
        fresh = dict(values)
        new_pending = values[PENDING]
    else:
        values = {
            quoted(n): f"CASE WHEN {_unsent(n)} THEN t.{quoted(n)} ELSE s.{quoted(n)} END" for n in data
        }
        values[PENDING] = values_pending()
    inserts = fresh | meta | {PENDING: new_pending}
    builder = deltasql.Merge(spark, path, source, _key_match(frame.keys, "t", "s"))
    if not lean:
        older = f"s.{POSITION} < t.{POSITION} AND t.{PENDING} IS NOT NULL" + (
            f" AND NOT coalesce(t.{DELETED}, false)" if soft else ""
        )
        builder = builder.when_matched_update(_older_fill(data), condition=older)
    if soft:
        flag = {**meta, DELETED: "true"}
        builder = builder.when_matched_update(flag, condition=f"s.{ACTION} = 'delete' AND {newer}")
        update = values | meta | {DELETED: "false"}
        builder = builder.when_matched_update(update, condition=f"s.{ACTION} = 'upsert' AND {newer}")
        builder = builder.when_not_matched_insert(inserts | {DELETED: f"s.{ACTION} = 'delete'"})
    else:
        builder = builder.when_matched_delete(condition=f"s.{ACTION} = 'delete' AND {newer}")
        update = values | meta
        builder = builder.when_matched_update(update, condition=f"s.{ACTION} = 'upsert' AND {newer}")
        builder = builder.when_not_matched_insert(inserts, condition=f"s.{ACTION} = 'upsert'")
    with commit.conf(spark, txn=True):
        builder.execute()
    return "merged"


def _vector_row(current: dict[str, T.DataType]) -> list[Column]:
    """A row the one-scan MERGE writes, in table order: every value from the batch (``s``)."""
    out = []
    for name, data_type in current.items():
        value = F.lit(None) if name == PENDING else F.col(f"s.{quoted(name)}")
        out.append(value.cast(data_type).alias(name))
    return out


def has_pending(spark: SparkSession, path: str, state: LogState | None = None) -> bool:
    """Whether a stored row still waits for unchanged-TOAST values.  Answered from the log's file
    statistics when they prove every ``__pending`` NULL (no Spark job: over Spark Connect the
    query cost seconds per batch); else by a query, which skips files whose statistics count no
    ``__pending`` value."""
    if state is not None and state.all_null(PENDING):
        return False
    stored = spark.read.format("delta").load(path)
    return bool(stored.where(F.col(PENDING).isNotNull()).select(POSITION).limit(1).count())


def _dense(state: LogState, events: int, ratio: float) -> bool:
    """Rewrite instead of MERGE: enabled, row counts known, no change data feed to keep exact."""
    if ratio <= 0 or state.records is None or state.configuration.get(CHANGE_FEED, "false") == "true":
        return False
    return events >= ratio * state.records


def rewritten(stored: DataFrame, source: DataFrame, keys: list[str], soft: bool) -> DataFrame:
    """The table after the MERGE of :func:`merge_silver`, as one full outer join.

    Row by row the same outcome as the MERGE clauses: a source action newer than the stored row
    (or for a key not stored) wins; a winning delete drops the row (soft: keeps the stored values,
    flagged); a winning upsert keeps stored values for its unchanged-TOAST columns; columns the
    batch does not carry keep their stored values.
    """
    joined = stored.alias("t").join(source.alias("s"), F.expr(_key_match(keys, "t", "s")), "full_outer")
    t_pos, s_pos = F.col(f"t.{POSITION}"), F.col(f"s.{POSITION}")
    stored_row = t_pos.isNotNull()
    wins = s_pos.isNotNull() & (~stored_row | (s_pos > t_pos))
    delete = F.col(f"s.{ACTION}") == "delete"
    if not soft:
        joined = joined.where(~wins | ~delete)
    carried = set(source.columns)
    pending = F.col(f"t.{PENDING}")
    older = s_pos.isNotNull() & stored_row & (s_pos < t_pos) & pending.isNotNull()
    if soft:
        older = older & ~F.coalesce(F.col(f"t.{DELETED}"), F.lit(False))
    out = []
    for field in stored.schema.fields:
        name, t, s = field.name, F.col(f"t.{quoted(field.name)}"), F.col(f"s.{quoted(field.name)}")
        if name == DELETED:
            value = F.when(wins, delete).otherwise(t) if soft else t
        elif name == PENDING:
            value = (
                F.when(wins & stored_row & ~delete, F.expr(values_pending()))
                .when(wins & ~stored_row & ~delete, F.expr(fresh_pending()))
                .when(older, F.expr(older_pending()))
                .otherwise(t)
            )
        elif name not in carried:
            value = t
        elif name in (POSITION, OP, TS_MS, BATCH):
            value = F.when(wins, s).otherwise(t)
        else:
            unsent = F.array_contains(F.col(f"s.{UNAVAILABLE}"), name)
            kept = unsent | (delete if soft else F.lit(False))
            refill = older & F.expr(_refills(name)) & ~delete & ~unsent
            value = (
                F.when(wins & stored_row & kept, t)
                .when(wins & unsent, F.lit(None))
                .when(wins | refill, s)
                .otherwise(t)
            )
        out.append(value.cast(field.dataType).alias(name))
    return joined.select(*out)


def values_pending() -> str:
    """SQL: a newer upsert's pending columns over a stored row (those it keeps unresolved)."""
    return _nonempty(f"map_filter(t.{PENDING}, (k, v) -> array_contains(s.{UNAVAILABLE}, k))")


def fresh_pending() -> str:
    """SQL: a new row's pending columns (no value to fill them from yet)."""
    return (
        f"CASE WHEN size(s.{UNAVAILABLE}) > 0 THEN map_from_arrays(s.{UNAVAILABLE}, "
        f"transform(s.{UNAVAILABLE}, x -> CAST(NULL AS BINARY))) END"
    )


def older_pending() -> str:
    """SQL: the pending map after an older action (newest filler so far per column)."""
    return (
        f"transform_values(t.{PENDING}, (k, v) -> CASE WHEN (v IS NULL OR s.{POSITION} > v) AND "
        f"(s.{ACTION} = 'delete' OR NOT array_contains(s.{UNAVAILABLE}, k)) THEN s.{POSITION} ELSE v END)"
    )


def _lit(name: str) -> str:
    return name.replace("\\", "\\\\").replace("'", "\\'")


def _unsent(name: str) -> str:
    return f"array_contains(s.{UNAVAILABLE}, '{_lit(name)}')"


def _nonempty(expr: str) -> str:
    return f"CASE WHEN size({expr}) > 0 THEN {expr} END"


def _refills(name: str) -> str:
    """SQL: the older action ``s`` is the newest so far to fix ``t``'s pending column ``name``."""
    key = f"'{_lit(name)}'"
    return (
        f"map_contains_key(t.{PENDING}, {key}) AND (t.{PENDING}[{key}] IS NULL "
        f"OR s.{POSITION} > t.{PENDING}[{key}])"
    )


def _older_fill(data: list[str]) -> dict[str, str]:
    """MERGE set clause for an action older than the stored row: fill its pending columns only."""
    values = {
        quoted(n): f"CASE WHEN {_refills(n)} AND s.{ACTION} = 'upsert' AND NOT {_unsent(n)} "
        f"THEN s.{quoted(n)} ELSE t.{quoted(n)} END"
        for n in data
    }
    values[PENDING] = older_pending()
    return values
